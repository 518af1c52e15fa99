-- 0004_doorbells — todo_ready doorbells, presence, notify hooks and the reopen gate (SPEC §7:
-- R-BELL, R-GATE, R-REOPEN).
--
-- The flow: a change that makes work claimable (create, release, retry requeue, a lapsed lease)
-- writes a row to todo_ready_outbox in its own transaction, coalesced per (endpoint, queue),
-- and NOTIFYs switchboard_bell when it inserted one. A dispatcher (any process) takes outbox
-- rows with SKIP LOCKED, gates them on admission (R-GATE) and writes a todo_ready_rings row;
-- NOTIFY switchboard_ring wakes the attached MCP streams of every worker, which read their
-- rings from this table. When no stream is attached for the endpoint, the ring becomes a
-- notify_deliveries row that is POSTed to the endpoint's notify_url with retries.

-- A ring owed for (endpoint, queue): at most one row each, so a burst of creates coalesces.
CREATE TABLE todo_ready_outbox (
    endpoint_id  uuid NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    queue        text NOT NULL,
    cause        text NOT NULL
                 CHECK (cause IN ('create','release','retry','lapse','heartbeat','reopen')),
    requested_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint_id, queue)
);

-- Every todo_ready emitted. Streams read theirs from here; the board shows the latest.
CREATE TABLE todo_ready_rings (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id  uuid NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    queue        text NOT NULL,
    pending      int NOT NULL,
    cause        text NOT NULL
                 CHECK (cause IN ('create','release','retry','lapse','heartbeat','reopen')),
    rung_at      timestamptz NOT NULL
);
-- Streams: the rings of an endpoint since a moment; the coalescing check: the latest ring of
-- a queue.
CREATE INDEX idx_todo_ready_rings_endpoint ON todo_ready_rings (endpoint_id, rung_at);
CREATE INDEX idx_todo_ready_rings_queue ON todo_ready_rings (endpoint_id, queue, rung_at DESC);
CREATE INDEX idx_todo_ready_rings_rung_at ON todo_ready_rings (rung_at);

-- Presence: one row per open doorbell stream (legacy GET stream or subscriptions/listen),
-- touched every keep-alive interval; a row not seen for two intervals is a dead worker's.
CREATE TABLE mcp_streams (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id uuid NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    grant_id    uuid NOT NULL REFERENCES grants(id) ON DELETE CASCADE,
    session_id  uuid,
    era         text NOT NULL CHECK (era IN ('legacy','listen')),
    client_name text NOT NULL DEFAULT '',
    opened_at   timestamptz NOT NULL DEFAULT now(),
    seen_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_mcp_streams_endpoint ON mcp_streams (endpoint_id, seen_at);
CREATE INDEX idx_mcp_streams_seen ON mcp_streams (seen_at);

-- Legacy-era resource subscriptions live on the session (resources/subscribe).
ALTER TABLE mcp_sessions ADD COLUMN subscriptions text[] NOT NULL DEFAULT '{}';

-- Notify-hook deliveries: one per ring for an endpoint with nobody attached and a notify_url.
CREATE TABLE notify_deliveries (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id     uuid NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    ring_id         bigint NOT NULL,
    url             text NOT NULL,
    body            text NOT NULL,               -- the exact bytes signed and POSTed
    status          text NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending','delivered','given_up')),
    attempts        int NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz
);
CREATE INDEX idx_notify_deliveries_due ON notify_deliveries (next_attempt_at)
    WHERE status = 'pending';
CREATE INDEX idx_notify_deliveries_endpoint ON notify_deliveries (endpoint_id, created_at DESC);
CREATE INDEX idx_notify_deliveries_finished ON notify_deliveries (finished_at)
    WHERE status <> 'pending';

-- The reopen gate of a budgeted queue (R-REOPEN). deferred_since is set when a ring was gated
-- or a claim refused (somebody is now waiting for the queue to open); the reopen sweep clears
-- it, under the row lock, when the queue is claimable again, and rings once. Clearing is the
-- memory of that reopening: a second process or tick finds nothing to clear.
-- No foreign key to admission_policies: its check would take KEY SHARE on the policy row,
-- which every budgeted claim locks FOR UPDATE, and gate writes would then queue behind claims
-- (and deadlock with them). Gates of deleted policies are pruned by the sweep.
CREATE TABLE admission_gates (
    policy_id             uuid PRIMARY KEY,
    deferred_since        timestamptz,
    deferred_reason       text,
    reopened_at           timestamptz,
    reopened_window_start timestamptz
);
CREATE INDEX idx_admission_gates_deferred ON admission_gates (deferred_since)
    WHERE deferred_since IS NOT NULL;
