-- Retention (SPEC §9): each block deletes one batch of rows past their bound, oldest first,
-- in the caller's short transaction, and returns how many it deleted. The caller repeats until
-- a batch finds nothing, so no statement holds locks on more than one batch of rows.

-- name: endpoint_ids
-- Terminal todos are found endpoint by endpoint, through idx_todos_endpoint_created.
SELECT id FROM endpoints ORDER BY id

-- name: prune_windows
-- Window counters whose window started before the bound: older than any window a policy
-- can still charge (a week at most), and no longer shown (the API lists the last 30).
WITH doomed AS (
    SELECT policy_id, window_start FROM admission_windows
    WHERE window_start < %(before)s
    ORDER BY window_start
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM admission_windows w USING doomed d
    WHERE w.policy_id = d.policy_id AND w.window_start = d.window_start
    RETURNING 1
)
SELECT count(*) FROM deleted

-- name: prune_todos
-- Finished todos (done, failed, cancelled) of one endpoint, finished before the bound, with
-- their attempt rows and events. R-CHARGE: a todo with an attempt claimed at or after
-- %(keep_claimed_since)s (the bound of the window counters) stays, because that attempt may
-- be counted by a window that is kept, and a kept window's `used` must equal its attempt rows.
-- Oldest first by created_at (a todo finishes after it is created): the index is walked from
-- its old end and stops after one batch.
WITH doomed AS (
    SELECT t.id FROM todos t
    WHERE t.endpoint_id = %(endpoint_id)s AND t.created_at < %(before)s
      AND t.state IN ('done', 'failed', 'cancelled') AND t.finished_at < %(before)s
      AND NOT EXISTS (
          SELECT 1 FROM todo_attempts a
          WHERE a.todo_id = t.id AND a.claimed_at >= %(keep_claimed_since)s)
    ORDER BY t.created_at, t.id
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), attempts AS (
    DELETE FROM todo_attempts a USING doomed d WHERE a.todo_id = d.id
), events AS (
    DELETE FROM events e USING doomed d WHERE e.todo_id = d.id
), deleted AS (
    DELETE FROM todos t USING doomed d WHERE t.id = d.id
    RETURNING 1
)
SELECT count(*) FROM deleted

-- name: prune_events
-- The lifecycle log past the events bound, whatever its todo (live todos keep their state;
-- their early history goes). Walks the primary key from the oldest event.
WITH doomed AS (
    SELECT id FROM events WHERE at < %(before)s ORDER BY id LIMIT %(batch)s
), deleted AS (
    DELETE FROM events e USING doomed d WHERE e.id = d.id
    RETURNING 1
)
SELECT count(*) FROM deleted

-- name: prune_audit
-- Policy audit rows past the events bound, except the newest row of each policy that still
-- exists: who set the policy in force stays on record however long ago that was.
WITH doomed AS (
    SELECT a.id FROM admission_policy_audit a
    WHERE a.at < %(before)s
      AND NOT (EXISTS (SELECT 1 FROM admission_policies p WHERE p.id = a.policy_id)
               AND a.id = (SELECT max(b.id) FROM admission_policy_audit b
                           WHERE b.policy_id = a.policy_id))
    ORDER BY a.id
    LIMIT %(batch)s
), deleted AS (
    DELETE FROM admission_policy_audit a USING doomed d WHERE a.id = d.id
    RETURNING 1
)
SELECT count(*) FROM deleted

-- name: prune_rings
-- Doorbells rung before the bound: streams read only recent rings.
WITH doomed AS (
    SELECT id FROM todo_ready_rings WHERE rung_at < %(before)s ORDER BY rung_at LIMIT %(batch)s
), deleted AS (
    DELETE FROM todo_ready_rings r USING doomed d WHERE r.id = d.id
    RETURNING 1
)
SELECT count(*) FROM deleted

-- name: prune_deliveries
-- Notify-hook deliveries that finished (delivered or given up) before the bound; pending
-- ones are the outbox and stay.
WITH doomed AS (
    SELECT id FROM notify_deliveries
    WHERE status <> 'pending' AND finished_at < %(before)s
    ORDER BY finished_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM notify_deliveries n USING doomed d WHERE n.id = d.id
    RETURNING 1
)
SELECT count(*) FROM deleted

-- name: prune_streams
-- Presence rows not seen since the bound: a live stream touches its row every keep-alive
-- interval (at most 5 minutes), so these are streams of workers that died.
WITH doomed AS (
    SELECT id FROM mcp_streams WHERE seen_at < %(before)s ORDER BY seen_at LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED
), deleted AS (
    DELETE FROM mcp_streams s USING doomed d WHERE s.id = d.id
    RETURNING 1
)
SELECT count(*) FROM deleted
