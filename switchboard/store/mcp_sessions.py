"""MCP sessions of the legacy revisions, stored so that any worker serves any session."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from switchboard.store import load_queries

_Q = load_queries("mcp_sessions")
_PRUNE_BATCH = 1000


@dataclass(frozen=True)
class McpSession:
    """A legacy-era MCP session (its id is the ``Mcp-Session-Id``)."""

    id: UUID
    grant_id: UUID
    protocol_version: str
    client_info: dict[str, Any]
    client_capabilities: dict[str, Any]
    created_at: datetime
    last_seen_at: datetime
    ended_at: datetime | None
    subscriptions: list[str]  # resources/subscribe URIs (doorbells, R-BELL)


def create(
    conn: Connection[Any],
    *,
    grant_id: UUID,
    protocol_version: str,
    client_info: dict[str, Any],
    client_capabilities: dict[str, Any],
) -> McpSession:
    """Start a session for the grant."""
    with conn.cursor(row_factory=class_row(McpSession)) as cur:
        row = cur.execute(
            _Q["create"],
            {
                "grant_id": grant_id,
                "protocol_version": protocol_version,
                "client_info": Jsonb(client_info),
                "client_capabilities": Jsonb(client_capabilities),
            },
        ).fetchone()
    assert row is not None
    return row


def get_live(
    conn: Connection[Any],
    *,
    id: UUID,
    grant_id: UUID,
    idle_seconds: int,
    now: datetime | None = None,
) -> McpSession | None:
    """The grant's session if it is live (not ended, not idle too long), touching it; or None."""
    with conn.cursor(row_factory=class_row(McpSession)) as cur:
        return cur.execute(
            _Q["get_live"],
            {"id": id, "grant_id": grant_id, "idle_seconds": idle_seconds, "now": now},
        ).fetchone()


def is_live(
    conn: Connection[Any], *, id: UUID, idle_seconds: int, now: datetime | None = None
) -> bool:
    """Whether the session is live and its grant not revoked."""
    row = conn.execute(
        _Q["is_live"], {"id": id, "idle_seconds": idle_seconds, "now": now}
    ).fetchone()
    return bool(row and row[0])


def end(
    conn: Connection[Any], *, id: UUID, grant_id: UUID, now: datetime | None = None
) -> McpSession | None:
    """End the grant's live session; None when there is no such session."""
    with conn.cursor(row_factory=class_row(McpSession)) as cur:
        return cur.execute(_Q["end"], {"id": id, "grant_id": grant_id, "now": now}).fetchone()


def prune(conn: Connection[Any], *, before: datetime) -> int:
    """Delete sessions ended or idle since before ``before`` (one batch); returns how many."""
    return conn.execute(_Q["prune"], {"before": before, "batch": _PRUNE_BATCH}).rowcount


def subscribe(conn: Connection[Any], *, id: UUID, uri: str, cap: int) -> bool:
    """Add a resource subscription; False when the session already holds ``cap`` of them (a
    URI it already holds is kept, and counts as done)."""
    return conn.execute(_Q["subscribe"], {"id": id, "uri": uri, "cap": cap}).fetchone() is not None


def unsubscribe(conn: Connection[Any], *, id: UUID, uri: str) -> None:
    conn.execute(_Q["unsubscribe"], {"id": id, "uri": uri})


def subscriptions(conn: Connection[Any], *, id: UUID) -> list[str]:
    """The session's subscribed resource URIs (none for an unknown session)."""
    row = conn.execute(_Q["subscriptions"], {"id": id}).fetchone()
    return list(row[0]) if row else []
