-- Reads for operators (REST API, CLI): pages of endpoints and humans, queue summaries, and the
-- scope lookups the service checks ownership with. Nothing here is on a claim path.

-- name: endpoint_page
-- Keyset on slug (unique, indexed): a page never skips or repeats a row as others are added.
SELECT * FROM endpoints
WHERE (%(owner_human_id)s::uuid IS NULL OR owner_human_id = %(owner_human_id)s)
  AND (%(after)s::text IS NULL OR slug > %(after)s)
ORDER BY slug
LIMIT %(limit)s

-- name: human_page
-- Keyset on lower(email), the expression idx_humans_email is built on.
SELECT * FROM humans
WHERE %(after)s::text IS NULL OR lower(email) > %(after)s
ORDER BY lower(email)
LIMIT %(limit)s

-- name: grant_scope
-- Whose grant this is: the service decides ownership before revoking.
SELECT g.id, g.endpoint_id, e.owner_human_id
FROM grants g JOIN endpoints e ON e.id = g.endpoint_id
WHERE g.id = %(id)s

-- name: queue_summaries
-- Todos by state per (endpoint, queue), one grouped pass over the endpoints' todos, and the
-- oldest pending todo per queue from idx_todos_pending (one index probe each). Every queue the
-- endpoint ever had is listed, empty ones with zero counts. The age is clamped at 0: created_at
-- comes from clock_timestamp() and may be later than this transaction's now().
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), counts AS (
    SELECT t.endpoint_id, t.queue,
           count(*) FILTER (WHERE t.state = 'pending') AS pending,
           count(*) FILTER (WHERE t.state = 'claimed') AS claimed,
           count(*) FILTER (WHERE t.state = 'retry_wait') AS retry_wait,
           count(*) FILTER (WHERE t.state = 'done') AS done,
           count(*) FILTER (WHERE t.state = 'failed') AS failed,
           count(*) FILTER (WHERE t.state = 'cancelled') AS cancelled
    FROM todos t
    WHERE t.endpoint_id = ANY(%(endpoint_ids)s::uuid[])
      AND (%(queue)s::text IS NULL OR t.queue = %(queue)s)
    GROUP BY t.endpoint_id, t.queue
)
SELECT q.endpoint_id, e.slug AS endpoint, q.name AS queue,
       coalesce(c.pending, 0) AS pending, coalesce(c.claimed, 0) AS claimed,
       coalesce(c.retry_wait, 0) AS retry_wait, coalesce(c.done, 0) AS done,
       coalesce(c.failed, 0) AS failed, coalesce(c.cancelled, 0) AS cancelled,
       -- greatest() ignores NULL, so an empty queue needs the CASE to stay NULL.
       CASE WHEN oldest.created_at IS NOT NULL
            THEN greatest(0, floor(extract(epoch FROM clock.now - oldest.created_at)))::bigint
       END AS oldest_pending_age_s
FROM queues q
JOIN endpoints e ON e.id = q.endpoint_id
CROSS JOIN clock
LEFT JOIN counts c ON c.endpoint_id = q.endpoint_id AND c.queue = q.name
LEFT JOIN LATERAL (
    SELECT t.created_at FROM todos t
    WHERE t.endpoint_id = q.endpoint_id AND t.queue = q.name AND t.state = 'pending'
    ORDER BY t.created_at, t.id
    LIMIT 1
) oldest ON true
WHERE q.endpoint_id = ANY(%(endpoint_ids)s::uuid[])
  AND (%(queue)s::text IS NULL OR q.name = %(queue)s)
ORDER BY e.slug, q.name

-- name: policy_get
-- Unlocked: the single admission GET needs the policy's id and times, not a write lock.
SELECT * FROM admission_policies WHERE endpoint_id = %(endpoint_id)s AND queue = %(queue)s
