-- Doorbells (SPEC §7): the todo_ready outbox, rings, presence, notify deliveries, reopen gates.

-- name: request_ring
-- Owe a ring for (endpoint, queue). A ring already owed absorbs this one (the coalescing), and
-- only a new row wakes the dispatchers, so a burst of creates sends one NOTIFY.
WITH owed AS (
    INSERT INTO todo_ready_outbox (endpoint_id, queue, cause, requested_at)
    VALUES (%(endpoint_id)s, %(queue)s, %(cause)s, coalesce(%(now)s::timestamptz, now()))
    ON CONFLICT (endpoint_id, queue) DO NOTHING
    RETURNING 1
)
SELECT count(pg_notify('switchboard_bell', '')) AS woke FROM owed

-- name: request_rings
-- The same for many (endpoint, queue) pairs at once (the sweeps).
WITH owed AS (
    INSERT INTO todo_ready_outbox (endpoint_id, queue, cause, requested_at)
    SELECT DISTINCT e, q, %(cause)s, coalesce(%(now)s::timestamptz, now())
    FROM unnest(%(endpoint_ids)s::uuid[], %(queues)s::text[]) AS pair(e, q)
    ON CONFLICT (endpoint_id, queue) DO NOTHING
    RETURNING 1
), bell AS (
    SELECT pg_notify('switchboard_bell', '') FROM owed LIMIT 1
)
SELECT (SELECT count(*) FROM owed) AS owed, (SELECT count(*) FROM bell) AS woke

-- name: take_due
-- Outbox rows whose queue was not rung within the coalescing interval, taken (deleted) by one
-- dispatcher; rows another dispatcher holds are skipped, rows rung too recently stay owed.
WITH due AS (
    SELECT o.endpoint_id, o.queue FROM todo_ready_outbox o
    WHERE NOT EXISTS (
        SELECT 1 FROM todo_ready_rings r
        WHERE r.endpoint_id = o.endpoint_id AND r.queue = o.queue
          AND r.rung_at > %(now)s::timestamptz - %(interval)s::interval)
    ORDER BY o.requested_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM todo_ready_outbox o USING due
WHERE o.endpoint_id = due.endpoint_id AND o.queue = due.queue
RETURNING o.endpoint_id, o.queue, o.cause

-- name: owed_count
SELECT count(*) FROM todo_ready_outbox

-- name: claimable_count
-- Claimable todos of one queue, counted up to a cap (a ring says "work is waiting", and
-- counting a million pending rows on every ring would cost more than the ring).
SELECT count(*) FROM (
    (SELECT 1 FROM todos t
     WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(queue)s AND t.state = 'pending'
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM todos t
     WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(queue)s AND t.state = 'claimed'
       AND t.lease_expires_at < %(now)s AND t.attempt < t.max_attempts
     LIMIT %(cap)s)
    UNION ALL
    (SELECT 1 FROM todos t
     WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(queue)s AND t.state = 'retry_wait'
       AND t.retry_at <= %(now)s
     LIMIT %(cap)s)
) claimable

-- name: pending_count
-- Pending todos of one queue, counted up to a cap (idx_todos_pending, index only).
SELECT count(*) FROM (
    SELECT 1 FROM todos t
    WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = %(queue)s AND t.state = 'pending'
    LIMIT %(cap)s
) pending

-- name: ring
-- Record a todo_ready and wake every process's streams of the endpoint.
WITH rung AS (
    INSERT INTO todo_ready_rings (endpoint_id, queue, pending, cause, rung_at)
    VALUES (%(endpoint_id)s, %(queue)s, %(pending)s, %(cause)s, %(now)s)
    RETURNING id
)
SELECT rung.id, pg_notify('switchboard_ring', %(endpoint_id)s::text) FROM rung

-- name: endpoint_hook
-- The endpoint's notify hook (NULL url: none), its slug, and whether an agent is attached.
SELECT e.slug, e.notify_url, EXISTS (
    SELECT 1 FROM mcp_streams s
    WHERE s.endpoint_id = e.id AND s.seen_at > %(attached_since)s
) AS attached
FROM endpoints e WHERE e.id = %(endpoint_id)s

-- name: enqueue_delivery
-- Due at once (least: a ring stamped with a pinned or skewed clock is still due now).
INSERT INTO notify_deliveries (endpoint_id, ring_id, url, body, next_attempt_at)
VALUES (%(endpoint_id)s, %(ring_id)s, %(url)s, %(body)s, least(%(now)s, now()))
RETURNING id

-- name: rings_since
-- A stream's rings: those of its endpoint after a moment (a little overlap is read again and
-- filtered by id, since identity values can commit out of order).
SELECT r.id, e.slug AS endpoint, r.queue, r.pending, r.cause, r.rung_at
FROM todo_ready_rings r JOIN endpoints e ON e.id = r.endpoint_id
WHERE r.endpoint_id = %(endpoint_id)s AND r.rung_at > %(since)s
ORDER BY r.id

-- name: stream_open
INSERT INTO mcp_streams (endpoint_id, grant_id, session_id, era, client_name)
VALUES (%(endpoint_id)s, %(grant_id)s, %(session_id)s, %(era)s, %(client_name)s)
RETURNING id, opened_at

-- name: stream_touch
UPDATE mcp_streams SET seen_at = now() WHERE id = %(id)s

-- name: stream_close
DELETE FROM mcp_streams WHERE id = %(id)s

-- name: streams_prune
-- Presence rows of processes that died without closing their streams.
DELETE FROM mcp_streams WHERE seen_at < %(before)s

-- name: delivery_take
-- One due delivery, leased to this process: its next attempt is pushed past the request's
-- timeout first, so a process that dies mid-POST leaves it to be retried, never lost.
UPDATE notify_deliveries d
SET attempts = d.attempts + 1, next_attempt_at = %(now)s::timestamptz + %(lease)s::interval
FROM endpoints e
WHERE d.id = (
    SELECT id FROM notify_deliveries
    WHERE status = 'pending' AND next_attempt_at <= %(now)s
    ORDER BY next_attempt_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
) AND e.id = d.endpoint_id
RETURNING d.id, d.url, d.body, d.attempts, e.notify_secret AS secret

-- name: delivery_done
UPDATE notify_deliveries
SET status = 'delivered', finished_at = %(now)s, last_error = NULL
WHERE id = %(id)s

-- name: delivery_retry
UPDATE notify_deliveries
SET next_attempt_at = %(next_attempt_at)s, last_error = %(error)s
WHERE id = %(id)s

-- name: delivery_give_up
UPDATE notify_deliveries
SET status = 'given_up', finished_at = %(now)s, last_error = %(error)s
WHERE id = %(id)s

-- name: deliveries
SELECT id, ring_id, url, body, status, attempts, last_error, created_at, finished_at
FROM notify_deliveries WHERE endpoint_id = %(endpoint_id)s
ORDER BY created_at, id

-- name: gate_defer
-- Somebody now waits for this budgeted queue to open (a gated ring, a refused claim). Never
-- waits: a gate row another transaction holds is being reopened or deferred right now.
WITH policy AS (
    SELECT p.id FROM admission_policies p
    WHERE p.endpoint_id = %(endpoint_id)s AND p.queue = %(queue)s
), created AS (
    INSERT INTO admission_gates (policy_id, deferred_since, deferred_reason)
    SELECT id, %(now)s, %(reason)s FROM policy
    ON CONFLICT (policy_id) DO NOTHING
    RETURNING policy_id
)
UPDATE admission_gates g
SET deferred_since = %(now)s, deferred_reason = %(reason)s
WHERE g.policy_id = (
    SELECT open.policy_id FROM admission_gates open JOIN policy ON policy.id = open.policy_id
    WHERE open.deferred_since IS NULL
    FOR UPDATE OF open SKIP LOCKED
) AND NOT EXISTS (SELECT 1 FROM created)

-- name: gates_deferred
-- The deferred gates to look at: every one (the sweep), or one queue's (inline).
SELECT g.policy_id, p.endpoint_id, p.queue, g.deferred_since
FROM admission_gates g JOIN admission_policies p ON p.id = g.policy_id
WHERE g.deferred_since IS NOT NULL
  AND (%(endpoint_id)s::uuid IS NULL OR (p.endpoint_id = %(endpoint_id)s AND p.queue = %(queue)s))
ORDER BY g.deferred_since

-- name: gate_reopen
-- Clear a deferred gate; the row lock makes one process (or tick) the one that clears it. A
-- gate another transaction holds is skipped, never waited for: that one rings, or the next
-- tick does.
UPDATE admission_gates
SET deferred_since = NULL, deferred_reason = NULL,
    reopened_at = %(now)s, reopened_window_start = %(window_start)s
WHERE policy_id = (
    SELECT policy_id FROM admission_gates
    WHERE policy_id = %(policy_id)s AND deferred_since IS NOT NULL
    FOR UPDATE SKIP LOCKED
)
RETURNING policy_id

-- name: gates_prune
-- Gates of policies that were deleted (no foreign key cascades them).
DELETE FROM admission_gates g
WHERE NOT EXISTS (SELECT 1 FROM admission_policies p WHERE p.id = g.policy_id)

-- name: lapsed_queues
-- Queues where a lease lapsed in (since, now] and a takeover is possible.
SELECT DISTINCT t.endpoint_id, t.queue FROM todos t
WHERE t.state = 'claimed' AND t.lease_expires_at > %(since)s
  AND t.lease_expires_at <= %(now)s AND t.attempt < t.max_attempts

-- name: unrung_queues
-- Queues whose oldest pending todo waited past the repeat interval and that were not rung
-- within it: the heartbeat sweep rings them again.
SELECT q.endpoint_id, q.name AS queue FROM queues q
JOIN endpoints e ON e.id = q.endpoint_id AND e.disabled_at IS NULL
WHERE EXISTS (
    SELECT 1 FROM todos t
    WHERE t.endpoint_id = q.endpoint_id AND t.queue = q.name AND t.state = 'pending'
      AND t.created_at < %(before)s)
  AND NOT EXISTS (
    SELECT 1 FROM todo_ready_rings r
    WHERE r.endpoint_id = q.endpoint_id AND r.queue = q.name AND r.rung_at > %(before)s)
