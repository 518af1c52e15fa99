-- 0003_mcp_sessions — MCP sessions of the legacy (2025-*) revisions, shared by every worker of
-- every container (SPEC §5 R-MCP). A session is never authentication: each request is
-- authorized by its bearer token, and a session is only usable with the grant that created it.

CREATE TABLE mcp_sessions (
    -- The Mcp-Session-Id: gen_random_uuid() draws from pg_strong_random, so ids are unguessable.
    id                  uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    grant_id            uuid NOT NULL REFERENCES grants(id) ON DELETE CASCADE,
    protocol_version    text NOT NULL,
    client_info         jsonb NOT NULL DEFAULT '{}',
    client_capabilities jsonb NOT NULL DEFAULT '{}',
    created_at          timestamptz NOT NULL DEFAULT now(),
    -- Refreshed at most once a minute by the requests that use the session (idle expiry).
    last_seen_at        timestamptz NOT NULL DEFAULT now(),
    ended_at            timestamptz
);
CREATE INDEX idx_mcp_sessions_grant ON mcp_sessions (grant_id) WHERE ended_at IS NULL;
-- The prune sweep: ended sessions and idle ones, oldest activity first.
CREATE INDEX idx_mcp_sessions_last_seen ON mcp_sessions (last_seen_at);
