-- 0002_admission_control — per-queue admission policies (ADR-0035, SPEC-0030; SPEC §4).
-- Additive: no existing query reads these tables, and a queue without a row behaves as before.
-- Team scope (SPEC-0033) later adds team_id, relaxes endpoint_id to nullable under
-- CHECK (num_nonnulls(endpoint_id, team_id) = 1) and a unique index on (team_id, queue).
CREATE TABLE admission_policies (
    id                    uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id           uuid NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    queue                 text NOT NULL,
    max_in_flight         int CHECK (max_in_flight BETWEEN 0 AND 10000),
    max_claims_per_window int CHECK (max_claims_per_window BETWEEN 0 AND 1000000),
    window_period         text CHECK (window_period IN ('hour','day','week')),
    window_tz             text,
    window_start          text CHECK (window_start ~ '^([01][0-9]|2[0-3]):[0-5][0-9]$'),
    window_weekday        text CHECK (window_weekday IN ('Mon','Tue','Wed','Thu','Fri','Sat','Sun')),
    created_by_human_id   uuid NOT NULL REFERENCES humans(id),
    updated_by_human_id   uuid NOT NULL REFERENCES humans(id),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    CHECK (max_in_flight IS NOT NULL OR max_claims_per_window IS NOT NULL),
    CHECK (max_claims_per_window IS NULL
           OR (window_period IS NOT NULL AND window_tz IS NOT NULL AND window_start IS NOT NULL)),
    CHECK ((window_period = 'week') = (window_weekday IS NOT NULL))
);
CREATE UNIQUE INDEX idx_admission_policies_endpoint_queue ON admission_policies (endpoint_id, queue);

CREATE TABLE admission_windows (
    policy_id    uuid NOT NULL REFERENCES admission_policies(id) ON DELETE CASCADE,
    window_start timestamptz NOT NULL,
    used         int NOT NULL DEFAULT 0 CHECK (used >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (policy_id, window_start)
);

CREATE TABLE admission_policy_audit (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    policy_id      uuid NOT NULL,               -- not an FK: the audit outlives a deleted policy
    endpoint_id    uuid NOT NULL,               -- the scope, for owner-filtered reads
    queue          text NOT NULL,
    actor_human_id uuid NOT NULL,               -- the accountable human, always
    actor_endpoint_id uuid,                     -- set when a granted agent made the change
    action         text NOT NULL CHECK (action IN ('create','update','delete')),
    before         jsonb,
    after          jsonb,
    at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX idx_admission_audit_scope ON admission_policy_audit (endpoint_id, queue, at DESC);

-- In-flight reads under the policy lock (its leading columns), and the claim path's
-- lapsed-lease probes (lease_expires_at < now() reads only lapsed entries, never the live
-- claims in front of them). The design names (endpoint_id, queue); the third column is added
-- because a second claimed-rows index beside it made the planner pick the two-column one for
-- the lapsed probes whenever statistics were stale, and every claim then read every live claim
-- of its queue (bench/claim.py: sustained throughput fell to a fifth within a minute).
CREATE INDEX idx_todos_claimed_endpoint_queue ON todos (endpoint_id, queue, lease_expires_at)
    WHERE state = 'claimed';
