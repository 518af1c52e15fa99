"""Board reads (SPEC §8): live-update versions, presence, last doorbells, the audit list."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.rows import class_row

from switchboard.store import load_queries

_Q = load_queries("board")


@dataclass(frozen=True)
class QueueVersion:
    """What a live queue page compares to know whether to push a fresh header and cards."""

    endpoint_id: UUID
    queue: str
    last_event_id: int | None
    in_flight: int
    policy_updated_at: datetime | None
    window_used: int | None
    last_ring_id: int | None


@dataclass(frozen=True)
class AttachedAgent:
    """Open MCP streams of one client name on an endpoint (presence)."""

    endpoint_id: UUID
    client_name: str
    streams: int
    seen_at: datetime


@dataclass(frozen=True)
class Ring:
    endpoint_id: UUID
    queue: str
    pending: int
    cause: str
    rung_at: datetime


@dataclass(frozen=True)
class AuditEntry:
    id: int
    at: datetime
    action: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    human_name: str
    human_email: str
    agent_endpoint: str | None  # set when an agent made the change on behalf of the human


def queue_versions(
    conn: Connection[Any], *, keys: Sequence[tuple[UUID, str]]
) -> list[QueueVersion]:
    """The version of each (endpoint id, queue) in ``keys``, in one statement."""
    if not keys:
        return []
    with conn.cursor(row_factory=class_row(QueueVersion)) as cur:
        return cur.execute(
            _Q["queue_versions"],
            {"endpoint_ids": [k[0] for k in keys], "queues": [k[1] for k in keys]},
        ).fetchall()


def attached_agents(
    conn: Connection[Any], *, endpoint_ids: Sequence[UUID], stale_seconds: float
) -> list[AttachedAgent]:
    """Clients with a stream seen within ``stale_seconds`` on each of the endpoints."""
    with conn.cursor(row_factory=class_row(AttachedAgent)) as cur:
        return cur.execute(
            _Q["attached_agents"],
            {"endpoint_ids": list(endpoint_ids), "stale_seconds": stale_seconds},
        ).fetchall()


def last_rings(conn: Connection[Any], *, endpoint_ids: Sequence[UUID]) -> list[Ring]:
    """The newest doorbell of each queue of the endpoints."""
    with conn.cursor(row_factory=class_row(Ring)) as cur:
        return cur.execute(_Q["last_rings"], {"endpoint_ids": list(endpoint_ids)}).fetchall()


def audit_page(
    conn: Connection[Any], *, endpoint_id: UUID, queue: str, limit: int = 100
) -> list[AuditEntry]:
    """A queue's policy audit, newest first, with its actors' names."""
    with conn.cursor(row_factory=class_row(AuditEntry)) as cur:
        return cur.execute(
            _Q["audit_page"], {"endpoint_id": endpoint_id, "queue": queue, "limit": limit}
        ).fetchall()


def human_names(conn: Connection[Any], *, ids: Sequence[UUID]) -> dict[UUID, str]:
    """Display names of the humans with these ids."""
    if not ids:
        return {}
    rows = conn.execute(_Q["human_names"], {"ids": list(ids)}).fetchall()
    return {row[0]: row[1] for row in rows}
