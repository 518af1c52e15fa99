-- Reads behind /metrics (SPEC §9): each is one statement over every queue, so a scrape costs
-- the same number of queries however many queues there are.

-- name: endpoint_slugs
-- The slugs of the endpoints the counters name by id (the labels of one scrape).
SELECT id, slug FROM endpoints WHERE id = ANY(%(ids)s::uuid[])

-- name: todo_endpoint
-- The endpoint of a todo, for a refusal whose caller named only the todo (the board's claim).
SELECT endpoint_id FROM todos WHERE id = %(id)s

-- name: queue_gauges
-- The queue liveness gauges: todos by state per (endpoint, queue), one grouped pass, and the
-- oldest pending todo of each queue from idx_todos_pending (one index probe each). Every queue
-- an endpoint ever had is listed, empty ones with zero counts.
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
    GROUP BY t.endpoint_id, t.queue
)
SELECT e.slug AS endpoint, q.name AS queue,
       coalesce(c.pending, 0) AS pending, coalesce(c.claimed, 0) AS claimed,
       coalesce(c.retry_wait, 0) AS retry_wait, coalesce(c.done, 0) AS done,
       coalesce(c.failed, 0) AS failed, coalesce(c.cancelled, 0) AS cancelled,
       -- created_at comes from clock_timestamp() and may be later than now(): clamp at 0.
       greatest(0, extract(epoch FROM clock.now - oldest.created_at))::float8
           AS oldest_pending_age_seconds
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
ORDER BY e.slug, q.name

-- name: admission_gauges
-- Every policy with what its status is derived from (as admission.states reads it, for all
-- endpoints at once) and the claimable todos waiting in its queue. Unlocked.
SELECT p.id, p.endpoint_id, p.queue, p.max_in_flight, p.max_claims_per_window,
       p.window_period, p.window_tz, p.window_start, p.window_weekday,
       clock.now,
       w.window_start AS latest_window_start, w.used AS latest_used,
       (SELECT count(*) FROM todos t
        WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'claimed'
       ) AS in_flight,
       (SELECT count(*) FROM todos t
        WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'claimed'
          AND t.lease_expires_at >= clock.now
       ) AS live_in_flight,
       (SELECT min(t.lease_expires_at) FROM todos t
        WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'claimed'
       ) AS earliest_lease_expiry,
       -- Claimable todos, todo_claimable split by state so that each count is its own index
       -- probe (the pending count an index-only scan of idx_todos_pending: no heap reads).
       (SELECT count(*) FROM todos t
        WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'pending')
       + (SELECT count(*) FROM todos t
          WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'claimed'
            AND t.lease_expires_at < clock.now AND t.attempt < t.max_attempts)
       + (SELECT count(*) FROM todos t
          WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'retry_wait'
            AND t.retry_at <= clock.now) AS waiting,
       e.slug AS endpoint
FROM admission_policies p
JOIN endpoints e ON e.id = p.endpoint_id
CROSS JOIN (SELECT coalesce(%(now)s::timestamptz, now()) AS now) clock
LEFT JOIN LATERAL (
    SELECT w.window_start, w.used FROM admission_windows w
    WHERE w.policy_id = p.id AND w.window_start <= clock.now
    ORDER BY w.window_start DESC LIMIT 1
) w ON true
ORDER BY e.slug, p.queue
