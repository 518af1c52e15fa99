"""Reads behind ``/metrics``: endpoint labels and the scrape-time gauges (SPEC §9)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.rows import class_row, kwargs_row

from switchboard.store import load_queries
from switchboard.store.admission import PolicyState

_Q = load_queries("metrics")
_STATE_FIELDS = tuple(field.name for field in fields(PolicyState))


@dataclass(frozen=True)
class QueueGauge:
    """One queue's todos by state and the age of its oldest pending todo (None: none)."""

    endpoint: str
    queue: str
    pending: int
    claimed: int
    retry_wait: int
    done: int
    failed: int
    cancelled: int
    oldest_pending_age_seconds: float | None


@dataclass(frozen=True)
class PolicyGauge:
    """A policy's status inputs, its endpoint's slug, and the claimable todos waiting."""

    endpoint: str
    state: PolicyState
    waiting: int


def _policy_gauge(**columns: Any) -> PolicyGauge:
    state = PolicyState(**{name: columns[name] for name in _STATE_FIELDS})
    return PolicyGauge(endpoint=columns["endpoint"], state=state, waiting=int(columns["waiting"]))


def endpoint_slugs(conn: Connection[Any], *, ids: Sequence[UUID]) -> list[tuple[UUID, str]]:
    """(id, slug) of those of the endpoints that exist."""
    return [(row[0], row[1]) for row in conn.execute(_Q["endpoint_slugs"], {"ids": list(ids)})]


def todo_endpoint(conn: Connection[Any], *, id: UUID) -> UUID | None:
    """The endpoint of a todo, or None when the todo does not exist."""
    row = conn.execute(_Q["todo_endpoint"], {"id": id}).fetchone()
    return row[0] if row else None


def queue_gauges(conn: Connection[Any], *, now: datetime | None = None) -> list[QueueGauge]:
    """Every queue of every endpoint with its todos by state (one statement)."""
    with conn.cursor(row_factory=class_row(QueueGauge)) as cur:
        return cur.execute(_Q["queue_gauges"], {"now": now}).fetchall()


def admission_gauges(conn: Connection[Any], *, now: datetime | None = None) -> list[PolicyGauge]:
    """Every admission policy with its usage inputs and waiting todos (one statement)."""
    with conn.cursor(row_factory=kwargs_row(_policy_gauge)) as cur:
        return cur.execute(_Q["admission_gauges"], {"now": now}).fetchall()
