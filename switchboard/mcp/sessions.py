"""Legacy-era MCP sessions: started by ``initialize``, named by ``Mcp-Session-Id``, ended by
DELETE or after a day idle. Any worker of any container serves any session (PostgreSQL)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg import Connection

from switchboard.errors import NotFound
from switchboard.mcp.auth import Agent
from switchboard.mcp.jsonrpc import INVALID_REQUEST, RpcError
from switchboard.store import mcp_sessions
from switchboard.store.mcp_sessions import McpSession

IDLE = timedelta(hours=24)
_IDLE_SECONDS = int(IDLE.total_seconds())


def start(
    conn: Connection[Any],
    *,
    agent: Agent,
    protocol_version: str,
    client_info: dict[str, Any],
    client_capabilities: dict[str, Any],
) -> McpSession:
    """A new session for the agent's grant."""
    return mcp_sessions.create(
        conn,
        grant_id=agent.grant.id,
        protocol_version=protocol_version,
        client_info=client_info,
        client_capabilities=client_capabilities,
    )


def session_id(header: str | None) -> UUID:
    """The session a request names; raises RpcError 400 when it names none, NotFound when it
    names no possible session."""
    value = (header or "").strip()
    if not value:
        raise RpcError(
            INVALID_REQUEST, "Bad Request: Mcp-Session-Id header is required", status=400
        )
    try:
        return UUID(value)
    except ValueError:
        raise NotFound("session not found; initialize a new one") from None


def resume(conn: Connection[Any], *, agent: Agent, header: str | None) -> McpSession:
    """The agent's live session named by the header; raises RpcError (400) without a header,
    NotFound when the session is unknown, ended, idle too long or another grant's."""
    session = mcp_sessions.get_live(
        conn, id=session_id(header), grant_id=agent.grant.id, idle_seconds=_IDLE_SECONDS
    )
    if session is None:
        raise NotFound("session not found; initialize a new one")
    return session


def end(conn: Connection[Any], *, agent: Agent, header: str | None) -> UUID:
    """End the agent's session named by the header; returns its id. Raises like ``resume``."""
    ended = mcp_sessions.end(conn, id=session_id(header), grant_id=agent.grant.id)
    if ended is None:
        raise NotFound("session not found; initialize a new one")
    return ended.id


def is_live(conn: Connection[Any], *, id: UUID) -> bool:
    """Whether a session is still live (not ended or idle, its grant not revoked)."""
    return mcp_sessions.is_live(conn, id=id, idle_seconds=_IDLE_SECONDS)


def prune(conn: Connection[Any], *, now: datetime) -> int:
    """Run-once sweep: forget sessions ended or idle for a day; returns how many (one batch)."""
    return mcp_sessions.prune(conn, before=now - IDLE)
