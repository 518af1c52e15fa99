"""Operator reads: keyset pages of endpoints and humans, queue summaries, scope lookups."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.rows import class_row

from switchboard.models import Endpoint, Human
from switchboard.store import load_queries
from switchboard.store.admission import PolicyRecord

_Q = load_queries("operator")


@dataclass(frozen=True)
class GrantScope:
    """Which endpoint a grant belongs to, and who owns that endpoint."""

    id: UUID
    endpoint_id: UUID
    owner_human_id: UUID


@dataclass(frozen=True)
class QueueSummary:
    """One (endpoint, queue): todos by state and the age of its oldest pending todo."""

    endpoint_id: UUID
    endpoint: str  # slug
    queue: str
    pending: int
    claimed: int
    retry_wait: int
    done: int
    failed: int
    cancelled: int
    oldest_pending_age_s: int | None


def endpoint_page(
    conn: Connection[Any], *, owner_human_id: UUID | None, after: str | None, limit: int
) -> list[Endpoint]:
    """Endpoints owned by the human (None: all) by slug, after the slug ``after``."""
    with conn.cursor(row_factory=class_row(Endpoint)) as cur:
        return cur.execute(
            _Q["endpoint_page"],
            {"owner_human_id": owner_human_id, "after": after, "limit": limit},
        ).fetchall()


def human_page(conn: Connection[Any], *, after: str | None, limit: int) -> list[Human]:
    """Humans by lower-cased email, after the lower-cased email ``after``."""
    with conn.cursor(row_factory=class_row(Human)) as cur:
        return cur.execute(_Q["human_page"], {"after": after, "limit": limit}).fetchall()


def grant_scope(conn: Connection[Any], *, id: UUID) -> GrantScope | None:
    """The endpoint and owner of a grant, or None when there is no such grant."""
    with conn.cursor(row_factory=class_row(GrantScope)) as cur:
        return cur.execute(_Q["grant_scope"], {"id": id}).fetchone()


def queue_summaries(
    conn: Connection[Any],
    *,
    endpoint_ids: Sequence[UUID],
    queue: str | None = None,
    now: datetime | None = None,
) -> list[QueueSummary]:
    """Every queue of the endpoints (or just ``queue``), by endpoint slug and queue name."""
    with conn.cursor(row_factory=class_row(QueueSummary)) as cur:
        return cur.execute(
            _Q["queue_summaries"],
            {"endpoint_ids": list(endpoint_ids), "queue": queue, "now": now},
        ).fetchall()


def policy_get(conn: Connection[Any], *, endpoint_id: UUID, queue: str) -> PolicyRecord | None:
    """The queue's admission policy without a lock, or None."""
    with conn.cursor(row_factory=class_row(PolicyRecord)) as cur:
        return cur.execute(
            _Q["policy_get"], {"endpoint_id": endpoint_id, "queue": queue}
        ).fetchone()
