-- MCP sessions (legacy revisions). Idle and ended sessions answer as unknown (404).

-- name: create
INSERT INTO mcp_sessions (grant_id, protocol_version, client_info, client_capabilities)
VALUES (%(grant_id)s, %(protocol_version)s, %(client_info)s, %(client_capabilities)s)
RETURNING *

-- name: get_live
-- The grant's live session. last_seen_at is refreshed at most once a minute, so a busy agent
-- does not write on every request; a session idle longer than %(idle_seconds)s is gone.
WITH clock AS (
    SELECT coalesce(%(now)s::timestamptz, now()) AS now
), found AS (
    SELECT s.* FROM mcp_sessions s, clock
    WHERE s.id = %(id)s AND s.grant_id = %(grant_id)s AND s.ended_at IS NULL
      AND s.last_seen_at > clock.now - make_interval(secs => %(idle_seconds)s)
), touched AS (
    UPDATE mcp_sessions s SET last_seen_at = clock.now
    FROM found, clock
    WHERE s.id = found.id AND s.last_seen_at < clock.now - interval '1 minute'
)
SELECT * FROM found

-- name: is_live
-- A stream's liveness check: the session is live and its grant still holds.
SELECT EXISTS (
    SELECT 1 FROM mcp_sessions s JOIN grants g ON g.id = s.grant_id
    WHERE s.id = %(id)s AND s.ended_at IS NULL AND g.revoked_at IS NULL
      AND s.last_seen_at > coalesce(%(now)s::timestamptz, now()) - make_interval(secs => %(idle_seconds)s)
)

-- name: end
UPDATE mcp_sessions SET ended_at = coalesce(%(now)s::timestamptz, now())
WHERE id = %(id)s AND grant_id = %(grant_id)s AND ended_at IS NULL
RETURNING *

-- name: prune
-- Forget sessions that ended or went idle before %(before)s (one batch).
WITH doomed AS (
    SELECT id FROM mcp_sessions
    WHERE last_seen_at < %(before)s OR ended_at < %(before)s
    LIMIT %(batch)s
)
DELETE FROM mcp_sessions s USING doomed WHERE s.id = doomed.id

-- name: subscribe
-- resources/subscribe: remember the URI once; a session holds at most %(cap)s. No row: the
-- session is full (a URI it already holds is kept and counts as done).
UPDATE mcp_sessions
SET subscriptions = CASE WHEN %(uri)s::text = ANY(subscriptions) THEN subscriptions
                         ELSE array_append(subscriptions, %(uri)s::text) END
WHERE id = %(id)s
  AND (%(uri)s::text = ANY(subscriptions) OR cardinality(subscriptions) < %(cap)s)
RETURNING cardinality(subscriptions)

-- name: unsubscribe
UPDATE mcp_sessions SET subscriptions = array_remove(subscriptions, %(uri)s::text)
WHERE id = %(id)s

-- name: subscriptions
SELECT subscriptions FROM mcp_sessions WHERE id = %(id)s
