-- Admission policies, their window counters and audit (SPEC §4).

-- name: states
-- Every policy of the endpoint over the asked queues (NULL: all) with what decides its status:
-- the newest window counter at or before now, the in-flight counts (only where a cap applies:
-- they are O(in flight)), and the earliest lease expiry. Unlocked: claim_next's pre-read and every
-- status read. Without policies this is one index probe returning no row (R-ZERO).
SELECT p.id, p.endpoint_id, p.queue, p.max_in_flight, p.max_claims_per_window,
       p.window_period, p.window_tz, p.window_start, p.window_weekday,
       clock.now,
       w.window_start AS latest_window_start, w.used AS latest_used,
       CASE WHEN p.max_in_flight IS NOT NULL OR %(count_in_flight)s THEN (
           SELECT count(*) FROM todos t
           WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'claimed')
       END AS in_flight,
       -- Claims whose lease is live: a lapsed one can be taken over, which replaces it.
       CASE WHEN p.max_in_flight IS NOT NULL THEN (
           SELECT count(*) FROM todos t
           WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'claimed'
             AND t.lease_expires_at >= clock.now)
       END AS live_in_flight,
       (SELECT min(t.lease_expires_at) FROM todos t
        WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue AND t.state = 'claimed'
       ) AS earliest_lease_expiry
FROM admission_policies p
CROSS JOIN (SELECT coalesce(%(now)s::timestamptz, now()) AS now) clock
LEFT JOIN LATERAL (
    SELECT w.window_start, w.used FROM admission_windows w
    WHERE w.policy_id = p.id AND w.window_start <= clock.now
    ORDER BY w.window_start DESC LIMIT 1
) w ON true
WHERE p.endpoint_id = ANY(%(endpoint_ids)s::uuid[])
  AND (%(queues)s::text[] IS NULL OR p.queue = ANY(%(queues)s::text[]))
ORDER BY p.endpoint_id, p.queue

-- name: waiting
-- Claimable todos per queue: the "pending" of a deferred item (the idle path only).
SELECT t.queue, count(*) AS waiting FROM todos t
WHERE t.endpoint_id = %(endpoint_id)s AND t.queue = ANY(%(queues)s::text[])
  AND t.state IN ('pending', 'retry_wait', 'claimed')
  AND todo_claimable(t, coalesce(%(now)s::timestamptz, now()))
GROUP BY t.queue

-- name: policy_get_for_update
SELECT * FROM admission_policies
WHERE endpoint_id = %(endpoint_id)s AND queue = %(queue)s
FOR UPDATE

-- name: policy_upsert
-- PUT is a full replace that keeps the policy id, so usage survives a limit change.
INSERT INTO admission_policies AS p (endpoint_id, queue, max_in_flight, max_claims_per_window,
    window_period, window_tz, window_start, window_weekday, created_by_human_id,
    updated_by_human_id)
VALUES (%(endpoint_id)s, %(queue)s, %(max_in_flight)s, %(max_claims_per_window)s,
        %(window_period)s, %(window_tz)s, %(window_start)s, %(window_weekday)s,
        %(actor_human_id)s, %(actor_human_id)s)
ON CONFLICT (endpoint_id, queue) DO UPDATE SET
    max_in_flight = excluded.max_in_flight,
    max_claims_per_window = excluded.max_claims_per_window,
    window_period = excluded.window_period,
    window_tz = excluded.window_tz,
    window_start = excluded.window_start,
    window_weekday = excluded.window_weekday,
    updated_by_human_id = excluded.updated_by_human_id,
    updated_at = now()
RETURNING *

-- name: policy_delete
DELETE FROM admission_policies WHERE endpoint_id = %(endpoint_id)s AND queue = %(queue)s
RETURNING *

-- name: audit_insert
INSERT INTO admission_policy_audit (policy_id, endpoint_id, queue, actor_human_id,
    actor_endpoint_id, action, before, after)
VALUES (%(policy_id)s, %(endpoint_id)s, %(queue)s, %(actor_human_id)s, %(actor_endpoint_id)s,
        %(action)s, %(before)s, %(after)s)

-- name: audit_list
SELECT * FROM admission_policy_audit
WHERE endpoint_id = %(endpoint_id)s AND queue = %(queue)s
ORDER BY at DESC, id DESC
LIMIT %(limit)s

-- name: windows_list
SELECT * FROM admission_windows WHERE policy_id = %(policy_id)s
ORDER BY window_start DESC
LIMIT %(limit)s
