-- Todo lifecycle queries (SPEC §3). Time is injectable: coalesce(%(now)s, now()) uses the
-- database clock in production and a pinned instant in tests.

-- name: create
WITH registered AS (
    -- Record the queue name once; DO NOTHING takes no lock on an existing row.
    INSERT INTO queues (endpoint_id, name) VALUES (%(endpoint_id)s, %(queue)s)
    ON CONFLICT DO NOTHING
), created AS (
    INSERT INTO todos (endpoint_id, queue, title, body, payload, max_attempts, lease_seconds,
                       created_by_human_id, created_by_endpoint_id, created_at, updated_at)
    VALUES (%(endpoint_id)s, %(queue)s, %(title)s, %(body)s, %(payload)s, %(max_attempts)s,
            %(lease_seconds)s, %(created_by_human_id)s, %(created_by_endpoint_id)s,
            coalesce(%(now)s, clock_timestamp()), coalesce(%(now)s, clock_timestamp()))
    RETURNING *
), logged AS (
    INSERT INTO events (at, endpoint_id, queue, todo_id, kind, actor, data)
    SELECT c.created_at, c.endpoint_id, c.queue, c.id, 'created', %(actor)s,
           jsonb_build_object('title', c.title)
    FROM created c
)
SELECT * FROM created

-- name: get
SELECT * FROM todos WHERE id = %(id)s AND (%(endpoint_id)s::uuid IS NULL OR endpoint_id = %(endpoint_id)s)

-- name: list
-- Newest first, keyset-paginated on (created_at, id) through idx_todos_endpoint_created.
SELECT * FROM todos
WHERE endpoint_id = ANY(%(endpoint_ids)s::uuid[])
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(queues)s::text[] IS NULL OR queue = ANY(%(queues)s::text[]))
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(after_created_at)s::timestamptz IS NULL
       OR (created_at, id) < (%(after_created_at)s, %(after_id)s::uuid))
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: claim_next
-- The oldest claimable todo across the asked queues (NULL: every queue of the endpoint).
-- Each queue is its own index probe: queue = ANY(...) ORDER BY created_at would make
-- PostgreSQL sort the whole queue (SPEC §10). Queues are visited in the order of their
-- unlocked heads, and LIMIT 1 over the nested loop stops at the first queue that yields a
-- lockable row, so an uncontended claim locks one row however many queues it spans.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), asked AS (
    SELECT q.endpoint_id AS ep, q.name FROM queues q
    WHERE q.endpoint_id = %(endpoint_id)s
      AND (%(queues)s::text[] IS NULL OR q.name = ANY(%(queues)s::text[]))
      AND q.name <> ALL(%(excluded)s::text[])
), heads AS MATERIALIZED (
    -- Each queue's oldest claimable created_at, read without locks. The lapsed-lease and retry
    -- probes sit behind OFFSET 0 and ask for lease / due order, so their partial indexes
    -- (idx_todos_claimed_endpoint_queue, idx_todos_retry_due) drive them by range: only
    -- entries already past now() are read, never the live claims.
    SELECT a.ep, a.name, least(
        (SELECT t.created_at FROM todos t
         WHERE (t.endpoint_id, t.queue) = (a.ep, a.name) AND t.state = 'pending'
         ORDER BY t.created_at, t.id LIMIT 1),
        (SELECT min(x.created_at) FROM (
            SELECT t.created_at FROM todos t
            WHERE (t.endpoint_id, t.queue) = (a.ep, a.name) AND t.state = 'claimed'
              AND t.lease_expires_at < clock.now AND todo_claimable(t, clock.now)
            ORDER BY t.lease_expires_at OFFSET 0) x),
        (SELECT min(x.created_at) FROM (
            SELECT t.created_at FROM todos t
            WHERE (t.endpoint_id, t.queue) = (a.ep, a.name) AND t.state = 'retry_wait'
              AND t.retry_at <= clock.now
            ORDER BY t.retry_at OFFSET 0) x)
    ) AS head
    FROM asked a, clock
), found AS (
    SELECT c.id, h.ep AS endpoint_id, h.name AS queue, c.state AS prior_state,
           c.attempt AS prior_attempt, c.retry_at AS prior_retry_at
    FROM (SELECT * FROM heads WHERE head IS NOT NULL ORDER BY head, name) h
    CROSS JOIN clock{policy_free}
    CROSS JOIN LATERAL (
        SELECT x.* FROM (
            SELECT * FROM (
                SELECT t.* FROM todos t
                WHERE (t.endpoint_id, t.queue) = (h.ep, h.name) AND t.state = 'pending'
                ORDER BY t.created_at, t.id LIMIT 1 FOR UPDATE SKIP LOCKED) p
            UNION ALL
            SELECT * FROM (
                -- Lapsed leases, found through idx_todos_claimed_endpoint_queue (see heads),
                -- then fetched by primary key (= ANY: no join for the planner to turn into a
                -- scan) and locked one at a time, oldest first.
                SELECT t.* FROM todos t
                WHERE t.id = ANY(ARRAY(
                    SELECT x.id FROM todos x
                    WHERE (x.endpoint_id, x.queue) = (h.ep, h.name) AND x.state = 'claimed'
                      AND x.lease_expires_at < clock.now
                    ORDER BY x.lease_expires_at))
                  AND todo_claimable(t, clock.now)
                ORDER BY t.created_at, t.id LIMIT 1 FOR UPDATE OF t SKIP LOCKED) l
            UNION ALL
            SELECT * FROM (
                -- Due retries, likewise through idx_todos_retry_due.
                SELECT t.* FROM todos t
                WHERE t.id = ANY(ARRAY(
                    SELECT x.id FROM todos x
                    WHERE (x.endpoint_id, x.queue) = (h.ep, h.name) AND x.state = 'retry_wait'
                      AND x.retry_at <= clock.now
                    ORDER BY x.retry_at))
                  AND todo_claimable(t, clock.now)
                ORDER BY t.created_at, t.id LIMIT 1 FOR UPDATE OF t SKIP LOCKED) r
        ) x {where_free}ORDER BY x.created_at, x.id LIMIT 1
    ) c
    ORDER BY h.head, h.name
    LIMIT 1
)
{admit}

-- name: policy_free
-- Budgeted claim_next over several queues (skip_busy): a queue whose policy row another claim
-- holds locked is passed over like a locked row (SKIP LOCKED), so concurrent claimers spread
-- over the queues instead of queueing on the oldest one's policy. Its lock is taken here,
-- before the candidate's; neither waits. No queue free: the caller retries waiting.
CROSS JOIN LATERAL (SELECT CASE WHEN %(skip_busy)s THEN
    NOT EXISTS (SELECT FROM admission_policies p WHERE p.endpoint_id = h.ep AND p.queue = h.name)
    OR EXISTS (SELECT FROM admission_policies p WHERE p.endpoint_id = h.ep AND p.queue = h.name
               FOR UPDATE SKIP LOCKED)
    ELSE true END AS free) g

-- name: where_free
-- Referring only to the outer queue, this gates the candidate probes of a busy queue.
WHERE g.free

-- name: claim_todo
-- One todo by id: wait for its row lock (FOR UPDATE), then claim it only if it is claimable.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), found AS (
    SELECT t.id, t.endpoint_id, t.queue, t.state AS prior_state, t.attempt AS prior_attempt,
           t.retry_at AS prior_retry_at
    FROM todos t, clock
    WHERE t.id = %(id)s
      AND (%(endpoint_id)s::uuid IS NULL OR t.endpoint_id = %(endpoint_id)s)
      AND (%(queues)s::text[] IS NULL OR t.queue = ANY(%(queues)s::text[]))
      AND todo_claimable(t, clock.now)
    FOR UPDATE OF t
)
{admit}

-- name: admit
-- Admission gate of claim_next and claim_todo (R-ADMIT, R-ZERO). After the candidate row is
-- locked, its queue's policy is probed. No policy — the common case — is one index probe
-- returning no row, and the candidate is claimed in this same statement. With a policy
-- nothing is claimed here: the statement returns the candidate and the policy (claim_next: the
-- caller then claims through the gate; claim_todo: claim_admitted, same transaction).
, pol AS (
    SELECT p.* FROM admission_policies p, found
    WHERE p.endpoint_id = found.endpoint_id AND p.queue = found.queue
), cand AS (
    SELECT found.* FROM found WHERE NOT EXISTS (SELECT 1 FROM pol)
)
{claim}

-- name: claim
-- Shared tail of every claim path (R-CLAIM): claim the locked candidate, open its attempt row,
-- close a lapsed predecessor on takeover, and log the event, in the same statement.
, claimed AS (
    UPDATE todos t SET
        state = 'claimed',
        attempt = t.attempt + 1,
        claimed_at = clock.now,
        lease_expires_at = clock.now + make_interval(secs => coalesce(%(lease_seconds)s, t.lease_seconds)),
        claimed_by_endpoint_id = %(claimant_endpoint_id)s,
        claimed_by_human_id = %(claimant_human_id)s,
        retry_at = NULL,
        updated_at = clock.now
    FROM cand, clock
    WHERE t.id = cand.id
    RETURNING t.*,
        CASE
            WHEN cand.prior_state = 'claimed' THEN 'takeover'
            WHEN cand.prior_state = 'retry_wait' OR cand.prior_retry_at IS NOT NULL THEN 'retry'
            WHEN cand.prior_attempt = 0 THEN 'first'
            ELSE 'reclaim'
        END AS claim_kind
), opened AS (
    INSERT INTO todo_attempts (todo_id, endpoint_id, queue, attempt, kind, claimed_at,
                               claimed_by_endpoint_id, claimed_by_human_id)
    SELECT c.id, c.endpoint_id, c.queue, c.attempt, c.claim_kind, c.claimed_at,
           c.claimed_by_endpoint_id, c.claimed_by_human_id
    FROM claimed c
), lapsed AS (
    -- Scalar subqueries keep this a (todo_id, attempt) index probe, never a join over attempts.
    UPDATE todo_attempts a SET ended_at = (SELECT now FROM clock), outcome = 'lapsed'
    WHERE a.todo_id = (SELECT id FROM cand WHERE prior_state = 'claimed')
      AND a.attempt = (SELECT prior_attempt FROM cand)
), logged AS (
    INSERT INTO events (at, endpoint_id, queue, todo_id, kind, actor, data)
    SELECT c.claimed_at, c.endpoint_id, c.queue, c.id, 'claimed', %(actor)s,
           jsonb_build_object('attempt', c.attempt, 'kind', c.claim_kind)
    FROM claimed c
)
{result}

-- name: claim_result
-- One row when a candidate was found: the claim, or (budgeted queue) the locked candidate and
-- its policy with the claim columns NULL.
SELECT c.*, found.id AS found_id, found.endpoint_id AS found_endpoint,
       found.queue AS found_queue, clock.now AS found_now, to_jsonb(pol) AS policy
FROM found
CROSS JOIN clock
LEFT JOIN pol ON true
LEFT JOIN claimed c ON true

-- name: gate
-- Admission gate of the budgeted claim paths (R-ADMIT, R-NEVER, R-CHARGE): after the candidate
-- row is locked, admission_gate (migration 0005) locks the queue's policy, checks the window
-- the caller placed in Python against the policy and the statement's clock, counts in-flight
-- in a snapshot taken after the lock and charges the window; the tail claims only when it
-- admits. One statement, one round trip; nothing is written on a refusal.
, gate AS (
    SELECT g.* FROM found, clock,
        admission_gate(found.endpoint_id, found.queue, found.id, clock.now, %(budgets)s) g
), cand AS (
    SELECT found.* FROM found, gate WHERE gate.refusal IS NULL
)
{claim}

-- name: gate_result
-- One row when a candidate was found (the gate ran once for it): the claim (claim columns NULL
-- on a refusal) and the gate's outcome.
SELECT c.*, gate.* FROM gate LEFT JOIN claimed c ON true

-- name: claim_admitted
-- The second statement of a claim by id on a budgeted queue: the candidate is locked already
-- (claim_todo, same transaction); the gate decides, the tail claims.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), found AS (
    SELECT t.id, t.endpoint_id, t.queue, t.state AS prior_state, t.attempt AS prior_attempt,
           t.retry_at AS prior_retry_at
    FROM todos t WHERE t.id = %(id)s
)
{gate}

-- name: heartbeat
WITH clock AS (SELECT coalesce(%(now)s::timestamptz, now()) AS now)
UPDATE todos t SET
    lease_expires_at = clock.now + make_interval(secs => coalesce(%(lease_seconds)s, t.lease_seconds)),
    updated_at = clock.now
FROM clock
WHERE t.id = %(id)s AND t.endpoint_id = %(endpoint_id)s
  AND t.state = 'claimed' AND t.attempt = %(attempt)s
RETURNING t.*

-- name: finish
-- complete, fail and release: fenced by (state = 'claimed', attempt). A stale attempt matches
-- no row and nothing changes.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), target AS (
    SELECT t.id, t.attempt, t.max_attempts,
        CASE
            WHEN %(action)s = 'complete' THEN 'done'
            WHEN %(action)s = 'release' THEN 'pending'
            WHEN %(retry)s AND t.attempt < t.max_attempts THEN 'retry_wait'
            ELSE 'failed'
        END AS new_state
    FROM todos t
    WHERE t.id = %(id)s
      AND (%(endpoint_id)s::uuid IS NULL OR t.endpoint_id = %(endpoint_id)s)
      AND t.state = 'claimed' AND t.attempt = %(attempt)s
    FOR UPDATE
), finished AS (
    UPDATE todos t SET
        state = target.new_state,
        lease_expires_at = NULL,
        claimed_by_endpoint_id = CASE WHEN target.new_state = 'done' THEN t.claimed_by_endpoint_id END,
        claimed_by_human_id = CASE WHEN target.new_state = 'done' THEN t.claimed_by_human_id END,
        result = CASE WHEN target.new_state = 'done' THEN %(result)s::jsonb ELSE t.result END,
        last_error = CASE WHEN %(action)s = 'fail' THEN %(error)s ELSE t.last_error END,
        -- Backoff 10 s × 2^(attempt-1), capped at 1 h, jittered down by up to 20 %%.
        retry_at = CASE WHEN target.new_state = 'retry_wait'
            THEN clock.now + make_interval(secs =>
                 least(3600, 10 * power(2, target.attempt - 1)) * (1 - random() * 0.2))
            END,
        finished_at = CASE WHEN target.new_state IN ('done', 'failed') THEN clock.now END,
        updated_at = clock.now
    FROM target, clock
    WHERE t.id = target.id
    RETURNING t.*
), closed AS (
    UPDATE todo_attempts a SET ended_at = clock.now,
        outcome = CASE %(action)s WHEN 'complete' THEN 'completed'
                                  WHEN 'release' THEN 'released' ELSE 'failed' END
    FROM target, clock
    WHERE a.todo_id = target.id AND a.attempt = target.attempt
), logged AS (
    INSERT INTO events (at, endpoint_id, queue, todo_id, kind, actor, data)
    SELECT f.updated_at, f.endpoint_id, f.queue, f.id,
           CASE %(action)s WHEN 'complete' THEN 'completed' WHEN 'release' THEN 'released'
                ELSE CASE f.state WHEN 'retry_wait' THEN 'retry_scheduled' ELSE 'failed' END END,
           %(actor)s,
           jsonb_strip_nulls(jsonb_build_object('attempt', f.attempt, 'error', %(error)s::text,
                                                'retry_at', f.retry_at))
    FROM finished f
)
SELECT * FROM finished

-- name: cancel
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), target AS (
    SELECT t.id, t.state AS prior_state, t.attempt FROM todos t
    WHERE t.id = %(id)s
      AND (%(endpoint_id)s::uuid IS NULL OR t.endpoint_id = %(endpoint_id)s)
      AND t.state IN ('pending', 'claimed', 'retry_wait')
    FOR UPDATE
), cancelled AS (
    UPDATE todos t SET state = 'cancelled', lease_expires_at = NULL, retry_at = NULL,
        finished_at = clock.now, updated_at = clock.now
    FROM target, clock
    WHERE t.id = target.id
    RETURNING t.*
), closed AS (
    UPDATE todo_attempts a SET ended_at = clock.now, outcome = 'cancelled'
    FROM target, clock
    WHERE target.prior_state = 'claimed' AND a.todo_id = target.id AND a.attempt = target.attempt
), logged AS (
    INSERT INTO events (at, endpoint_id, queue, todo_id, kind, actor, data)
    SELECT c.updated_at, c.endpoint_id, c.queue, c.id, 'cancelled', %(actor)s,
           jsonb_build_object('from', target.prior_state)
    FROM cancelled c, target
)
SELECT * FROM cancelled

-- name: reap_expired
-- Claims whose lease lapsed with no attempts left cannot be taken over: fail them. Exempt from
-- endpoint scoping (a sweep). SKIP LOCKED: never wait on a claim in progress; the next tick
-- gets what this one skipped.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), target AS (
    SELECT t.id, t.attempt FROM todos t, clock
    WHERE t.state = 'claimed' AND t.lease_expires_at < clock.now AND t.attempt >= t.max_attempts
    ORDER BY t.lease_expires_at
    LIMIT %(batch)s
    FOR UPDATE OF t SKIP LOCKED
), reaped AS (
    UPDATE todos t SET state = 'failed', lease_expires_at = NULL,
        last_error = coalesce(t.last_error, 'lease lapsed with no attempts left'),
        finished_at = clock.now, updated_at = clock.now
    FROM target, clock
    WHERE t.id = target.id
    RETURNING t.*
), closed AS (
    UPDATE todo_attempts a SET ended_at = clock.now, outcome = 'lapsed'
    FROM target, clock
    WHERE a.todo_id = target.id AND a.attempt = target.attempt AND a.outcome IS NULL
), logged AS (
    INSERT INTO events (at, endpoint_id, queue, todo_id, kind, actor, data)
    SELECT r.updated_at, r.endpoint_id, r.queue, r.id, 'lapsed', 'system:reaper',
           jsonb_build_object('attempt', r.attempt)
    FROM reaped r
)
SELECT count(*) AS n FROM reaped

-- name: requeue_due_retries
-- Due retry_wait todos back to pending. retry_at is kept as the marker that the next claim is
-- a retry (claim clears it). Exempt from endpoint scoping; SKIP LOCKED like the reaper.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), target AS (
    SELECT t.id FROM todos t, clock
    WHERE t.state = 'retry_wait' AND t.retry_at <= clock.now
    ORDER BY t.retry_at
    LIMIT %(batch)s
    FOR UPDATE OF t SKIP LOCKED
), requeued AS (
    UPDATE todos t SET state = 'pending', updated_at = clock.now
    FROM target, clock
    WHERE t.id = target.id
    RETURNING t.*
), logged AS (
    INSERT INTO events (at, endpoint_id, queue, todo_id, kind, actor, data)
    SELECT r.updated_at, r.endpoint_id, r.queue, r.id, 'requeued', 'system:retry',
           jsonb_build_object('attempt', r.attempt)
    FROM requeued r
), owed AS (
    -- New claimable work: a doorbell is owed per queue (R-BELL; coalesced like a create's).
    INSERT INTO todo_ready_outbox (endpoint_id, queue, cause, requested_at)
    SELECT DISTINCT r.endpoint_id, r.queue, 'retry', clock.now FROM requeued r, clock
    ON CONFLICT (endpoint_id, queue) DO NOTHING
    RETURNING 1
), bell AS (
    SELECT pg_notify('switchboard_bell', '') FROM owed LIMIT 1
)
SELECT (SELECT count(*) FROM requeued) AS n, (SELECT count(*) FROM bell) AS woke

-- name: attempts
SELECT * FROM todo_attempts WHERE todo_id = %(todo_id)s ORDER BY attempt

-- name: events
SELECT * FROM events WHERE todo_id = %(todo_id)s ORDER BY id
