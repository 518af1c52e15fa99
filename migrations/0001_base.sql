-- 0001_base — humans, credentials, endpoints, the todo queue and its lifecycle log (SPEC §2–3).
--
-- Hot-path note: todo_attempts and events deliberately carry no foreign key to endpoints or
-- humans. An FK check takes FOR KEY SHARE on the referenced row, and every concurrent claim on
-- one endpoint would then share-lock the same endpoint row (multixact churn on the hot path).
-- Their endpoint_id is copied from the todo, which does reference endpoints.

CREATE TABLE humans (
    id            uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    email         text NOT NULL,
    display_name  text NOT NULL DEFAULT '',
    password_hash text,
    is_admin      boolean NOT NULL DEFAULT false,
    created_at    timestamptz NOT NULL DEFAULT now(),
    CHECK (char_length(email) BETWEEN 3 AND 254 AND position('@' IN email) > 1)
);
CREATE UNIQUE INDEX idx_humans_email ON humans (lower(email));

CREATE TABLE api_tokens (
    id           uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    human_id     uuid NOT NULL REFERENCES humans(id) ON DELETE CASCADE,
    name         text NOT NULL DEFAULT '',
    token_hash   bytea NOT NULL UNIQUE,          -- SHA-256 of the token; the token is shown once
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_used_at timestamptz,
    revoked_at   timestamptz
);
CREATE INDEX idx_api_tokens_human ON api_tokens (human_id);

CREATE TABLE endpoints (
    id             uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    slug           text NOT NULL UNIQUE CHECK (slug ~ '^[a-z0-9][a-z0-9-]{0,62}$'),
    display_name   text NOT NULL DEFAULT '',
    owner_human_id uuid NOT NULL REFERENCES humans(id),
    notify_url     text,
    notify_secret  text NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now(),
    disabled_at    timestamptz
);
CREATE INDEX idx_endpoints_owner ON endpoints (owner_human_id);

CREATE TABLE grants (
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id         uuid NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    token_hash          bytea NOT NULL UNIQUE,   -- SHA-256 of the sba_ token
    verbs               text[] NOT NULL,
    queues              text[],                  -- NULL: every queue of the endpoint
    granted_by_human_id uuid NOT NULL REFERENCES humans(id),
    created_at          timestamptz NOT NULL DEFAULT now(),
    revoked_at          timestamptz
);
CREATE INDEX idx_grants_endpoint ON grants (endpoint_id);

-- The queues an endpoint has ever had work in: claim_next over "every queue" and the board
-- iterate this instead of scanning todos for distinct names.
CREATE TABLE queues (
    endpoint_id uuid NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    name        text NOT NULL CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (endpoint_id, name)
);

CREATE TABLE todos (
    id                     uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    endpoint_id            uuid NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    queue                  text NOT NULL CHECK (queue ~ '^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$'),
    title                  text NOT NULL CHECK (char_length(title) BETWEEN 1 AND 500),
    body                   text NOT NULL DEFAULT '' CHECK (char_length(body) <= 65536),
    payload                jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(payload) = 'object'),
    state                  text NOT NULL DEFAULT 'pending'
                           CHECK (state IN ('pending','claimed','retry_wait','done','failed','cancelled')),
    attempt                int NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    max_attempts           int NOT NULL DEFAULT 5 CHECK (max_attempts BETWEEN 1 AND 100),
    lease_seconds          int NOT NULL DEFAULT 300 CHECK (lease_seconds BETWEEN 1 AND 86400),
    lease_expires_at       timestamptz,
    claimed_at             timestamptz,
    claimed_by_endpoint_id uuid,                 -- no FK: see the hot-path note above
    claimed_by_human_id    uuid,
    retry_at               timestamptz,
    last_error             text,
    result                 jsonb,
    created_by_human_id    uuid,
    created_by_endpoint_id uuid,
    created_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at            timestamptz,
    CHECK (state <> 'claimed' OR lease_expires_at IS NOT NULL),
    CHECK (state <> 'retry_wait' OR retry_at IS NOT NULL)
);

-- Claimable rows come from three partial indexes, one per R-CAND branch, so that a claimed row
-- with a live lease is never on the path of the next claim (SPEC §10):
--   pending, in claim order;
CREATE INDEX idx_todos_pending ON todos (endpoint_id, queue, created_at, id) WHERE state = 'pending';
--   claimed, by lease expiry: idx_todos_claimed_endpoint_queue, created with admission control
--   in 0002 (it also serves the in-flight count under the policy lock);
--   retry_wait, by due time.
CREATE INDEX idx_todos_retry_due ON todos (endpoint_id, queue, retry_at) WHERE state = 'retry_wait';
-- Operator listings: newest first per endpoint (keyset on created_at, id).
CREATE INDEX idx_todos_endpoint_created ON todos (endpoint_id, created_at DESC, id DESC);
-- The sweeps (reaper, retry requeue) read the whole claimed / retry_wait partial indexes above:
-- they hold only in-flight and waiting rows, and a second index keyed by time alone would
-- tempt the planner away from the per-queue probe on the claim path.

CREATE TABLE todo_attempts (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    todo_id     uuid NOT NULL,                   -- no FK: its check would re-lock the claimed row;
                                                 -- retention deletes attempts with their todos
    endpoint_id uuid NOT NULL,                   -- no FK: see the hot-path note above
    queue       text NOT NULL,
    attempt     int NOT NULL,
    kind        text NOT NULL CHECK (kind IN ('first','retry','takeover','reclaim')),
    claimed_at  timestamptz NOT NULL,
    claimed_by_endpoint_id uuid,
    claimed_by_human_id    uuid,
    ended_at    timestamptz,
    outcome     text CHECK (outcome IN ('completed','failed','released','lapsed','cancelled')),
    UNIQUE (todo_id, attempt),                   -- one winner per todo per attempt, enforced
    CHECK (num_nonnulls(claimed_by_endpoint_id, claimed_by_human_id) = 1)
);
CREATE INDEX idx_todo_attempts_queue_claimed ON todo_attempts (endpoint_id, queue, claimed_at);

CREATE TABLE events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    endpoint_id uuid NOT NULL,
    queue       text NOT NULL,
    todo_id     uuid,
    kind        text NOT NULL,
    actor       text NOT NULL,                   -- 'endpoint:<id>', 'human:<id>' or 'system:<sweep>'
    data        jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX idx_events_scope ON events (endpoint_id, queue, id);
CREATE INDEX idx_events_todo ON events (todo_id, id);

-- R-CAND: the one claimable predicate. Every claim path uses it; claim_next additionally splits
-- it by state so that each branch is driven by its own partial index. A SQL function of one
-- expression is inlined by the planner, so it costs nothing at run time.
CREATE FUNCTION todo_claimable(t todos, at timestamptz)
RETURNS boolean LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT t.state = 'pending'
        OR (t.state = 'claimed' AND t.lease_expires_at < at AND t.attempt < t.max_attempts)
        OR (t.state = 'retry_wait' AND t.retry_at <= at)
$$;
