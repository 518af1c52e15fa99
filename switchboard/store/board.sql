-- Reads only the board needs: live-update versions, presence, the last doorbell per queue, the
-- policy audit with its actors' names, and claimant names. Nothing here is on a claim path.

-- name: queue_versions
-- One row per asked (endpoint, queue): what changes when anything shown in the queue header or
-- its cards changes. Every lifecycle change writes an event (idx_events_scope: one backward
-- probe); in-flight is read from idx_todos_claimed_endpoint_queue (O(in flight)); the policy and
-- its newest window counter are one probe each. The ORDER BYs spell out the whole index order
-- so the planner walks the scope index, never the primary key backwards through every queue's
-- rows. The board's poller runs this for every open live queue page of its process, once a
-- second.
SELECT k.endpoint_id, k.queue,
       (SELECT e.id FROM events e
        WHERE e.endpoint_id = k.endpoint_id AND e.queue = k.queue
        ORDER BY e.endpoint_id DESC, e.queue DESC, e.id DESC LIMIT 1) AS last_event_id,
       (SELECT count(*) FROM todos t
        WHERE t.endpoint_id = k.endpoint_id AND t.queue = k.queue AND t.state = 'claimed'
       ) AS in_flight,
       p.updated_at AS policy_updated_at,
       (SELECT w.used FROM admission_windows w
        WHERE w.policy_id = p.id ORDER BY w.window_start DESC LIMIT 1) AS window_used,
       (SELECT r.id FROM todo_ready_rings r
        WHERE r.endpoint_id = k.endpoint_id AND r.queue = k.queue
        ORDER BY r.endpoint_id, r.queue, r.rung_at DESC LIMIT 1) AS last_ring_id
FROM unnest(%(endpoint_ids)s::uuid[], %(queues)s::text[]) AS k(endpoint_id, queue)
LEFT JOIN admission_policies p ON p.endpoint_id = k.endpoint_id AND p.queue = k.queue

-- name: attached_agents
-- Presence: streams seen within the staleness bound (two keep-alive intervals; a row older
-- than that is a dead worker's), per endpoint and client name.
SELECT s.endpoint_id, s.client_name, count(*) AS streams, max(s.seen_at) AS seen_at
FROM mcp_streams s
WHERE s.endpoint_id = ANY(%(endpoint_ids)s::uuid[])
  AND s.seen_at > now() - make_interval(secs => %(stale_seconds)s)
GROUP BY s.endpoint_id, s.client_name
ORDER BY s.endpoint_id, s.client_name

-- name: last_rings
-- The newest doorbell of each queue of the endpoints (idx_todo_ready_rings_queue).
SELECT DISTINCT ON (r.endpoint_id, r.queue) r.endpoint_id, r.queue, r.pending, r.cause,
       r.rung_at
FROM todo_ready_rings r
WHERE r.endpoint_id = ANY(%(endpoint_ids)s::uuid[])
ORDER BY r.endpoint_id, r.queue, r.rung_at DESC

-- name: audit_page
-- A queue's policy audit, newest first, with the accountable human and, for a change an agent
-- made, the agent's endpoint (the audit outlives a deleted policy, so no join on it).
SELECT a.id, a.at, a.action, a.before, a.after,
       h.display_name AS human_name, h.email AS human_email,
       e.slug AS agent_endpoint
FROM admission_policy_audit a
JOIN humans h ON h.id = a.actor_human_id
LEFT JOIN endpoints e ON e.id = a.actor_endpoint_id
WHERE a.endpoint_id = %(endpoint_id)s AND a.queue = %(queue)s
ORDER BY a.at DESC, a.id DESC
LIMIT %(limit)s

-- name: human_names
SELECT id, display_name FROM humans WHERE id = ANY(%(ids)s::uuid[])
