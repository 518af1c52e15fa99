-- Humans, their API tokens, endpoints and agent grants.

-- name: human_create
INSERT INTO humans (email, display_name, password_hash, is_admin)
VALUES (%(email)s, %(display_name)s, %(password_hash)s, %(is_admin)s)
RETURNING *

-- name: human_get
SELECT * FROM humans WHERE id = %(id)s

-- name: human_get_by_email
SELECT * FROM humans WHERE lower(email) = lower(%(email)s)

-- name: api_token_create
INSERT INTO api_tokens (human_id, name, token_hash) VALUES (%(human_id)s, %(name)s, %(token_hash)s)
RETURNING id, human_id, name, created_at, last_used_at, revoked_at

-- name: api_token_authenticate
-- The token's human, if the token is live. last_used_at is refreshed at most once a minute so
-- that a busy script does not write on every request.
WITH token AS (
    SELECT * FROM api_tokens WHERE token_hash = %(token_hash)s AND revoked_at IS NULL
), touched AS (
    UPDATE api_tokens a SET last_used_at = now()
    FROM token
    WHERE a.id = token.id AND (a.last_used_at IS NULL OR a.last_used_at < now() - interval '1 minute')
)
SELECT h.* FROM humans h JOIN token ON token.human_id = h.id

-- name: endpoint_create
INSERT INTO endpoints (slug, display_name, owner_human_id, notify_url, notify_secret)
VALUES (%(slug)s, %(display_name)s, %(owner_human_id)s, %(notify_url)s, %(notify_secret)s)
RETURNING *

-- name: endpoint_get
-- By id or slug: the scope strings of the API accept either (both indexed lookups).
SELECT * FROM endpoints
WHERE (slug = %(key)s OR id = %(key_id)s)
  AND (%(owner_human_id)s::uuid IS NULL OR owner_human_id = %(owner_human_id)s)

-- name: endpoint_list
SELECT * FROM endpoints
WHERE (%(owner_human_id)s::uuid IS NULL OR owner_human_id = %(owner_human_id)s)
ORDER BY slug

-- name: endpoint_queues
SELECT name FROM queues WHERE endpoint_id = %(endpoint_id)s ORDER BY name

-- name: grant_create
INSERT INTO grants (endpoint_id, token_hash, verbs, queues, granted_by_human_id)
VALUES (%(endpoint_id)s, %(token_hash)s, %(verbs)s, %(queues)s, %(granted_by_human_id)s)
RETURNING id, endpoint_id, verbs, queues, granted_by_human_id, created_at, revoked_at

-- name: grant_authenticate
-- A live grant of an enabled endpoint, found by its token hash.
SELECT g.id, g.endpoint_id, g.verbs, g.queues, g.granted_by_human_id, g.created_at, g.revoked_at
FROM grants g JOIN endpoints e ON e.id = g.endpoint_id
WHERE g.token_hash = %(token_hash)s AND g.revoked_at IS NULL AND e.disabled_at IS NULL

-- name: agent_authenticate
-- A live grant and its endpoint's slug: everything an MCP request needs to know about its
-- caller, in one indexed lookup.
SELECT g.id, g.endpoint_id, g.verbs, g.queues, g.granted_by_human_id, g.created_at,
       g.revoked_at, e.slug AS endpoint_slug
FROM grants g JOIN endpoints e ON e.id = g.endpoint_id
WHERE g.token_hash = %(token_hash)s AND g.revoked_at IS NULL AND e.disabled_at IS NULL

-- name: grant_list
SELECT id, endpoint_id, verbs, queues, granted_by_human_id, created_at, revoked_at
FROM grants WHERE endpoint_id = %(endpoint_id)s ORDER BY created_at

-- name: grant_revoke
UPDATE grants SET revoked_at = coalesce(revoked_at, now())
WHERE id = %(id)s AND endpoint_id = ANY(%(endpoint_ids)s::uuid[])
RETURNING id, endpoint_id, verbs, queues, granted_by_human_id, created_at, revoked_at
