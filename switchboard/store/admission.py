"""Admission policies, window counters and the policy audit (SPEC §4)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

from switchboard.store import load_queries

_Q = load_queries("admission")


@dataclass(frozen=True)
class PolicyRecord:
    id: UUID
    endpoint_id: UUID
    queue: str
    max_in_flight: int | None
    max_claims_per_window: int | None
    window_period: str | None
    window_tz: str | None
    window_start: str | None
    window_weekday: str | None
    created_by_human_id: UUID
    updated_by_human_id: UUID
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True)
class PolicyState:
    """A policy with what its status is derived from, read without locks."""

    id: UUID
    endpoint_id: UUID
    queue: str
    max_in_flight: int | None
    max_claims_per_window: int | None
    window_period: str | None
    window_tz: str | None
    window_start: str | None
    window_weekday: str | None
    now: datetime
    latest_window_start: datetime | None
    latest_used: int | None
    in_flight: int | None
    live_in_flight: int | None
    earliest_lease_expiry: datetime | None


@dataclass(frozen=True)
class AuditRecord:
    id: int
    policy_id: UUID
    endpoint_id: UUID
    queue: str
    actor_human_id: UUID
    actor_endpoint_id: UUID | None
    action: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    at: datetime


@dataclass(frozen=True)
class WindowRecord:
    policy_id: UUID
    window_start: datetime
    used: int
    updated_at: datetime


def states(
    conn: Connection[Any],
    *,
    endpoint_ids: Sequence[UUID],
    queues: Sequence[str] | None = None,
    count_in_flight: bool = False,
    now: datetime | None = None,
) -> list[PolicyState]:
    """Policies over the endpoints' queues (None: all) with their usage inputs."""
    with conn.cursor(row_factory=class_row(PolicyState)) as cur:
        cur.execute(
            _Q["states"],
            {
                "endpoint_ids": list(endpoint_ids),
                "queues": list(queues) if queues is not None else None,
                "count_in_flight": count_in_flight,
                "now": now,
            },
        )
        return cur.fetchall()


def waiting(
    conn: Connection[Any], *, endpoint_id: UUID, queues: Sequence[str], now: datetime | None
) -> dict[str, int]:
    """How many claimable todos wait in each of the queues (absent: none)."""
    rows = conn.execute(
        _Q["waiting"], {"endpoint_id": endpoint_id, "queues": list(queues), "now": now}
    ).fetchall()
    return {row[0]: int(row[1]) for row in rows}


def get_for_update(conn: Connection[Any], *, endpoint_id: UUID, queue: str) -> PolicyRecord | None:
    """The policy of a queue, locked for a write, or None."""
    with conn.cursor(row_factory=class_row(PolicyRecord)) as cur:
        return cur.execute(
            _Q["policy_get_for_update"], {"endpoint_id": endpoint_id, "queue": queue}
        ).fetchone()


def upsert(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    queue: str,
    fields: dict[str, Any],
    actor_human_id: UUID,
) -> PolicyRecord:
    """Create or fully replace the queue's policy, keeping its id."""
    with conn.cursor(row_factory=class_row(PolicyRecord)) as cur:
        row = cur.execute(
            _Q["policy_upsert"],
            {
                "endpoint_id": endpoint_id,
                "queue": queue,
                "actor_human_id": actor_human_id,
                **fields,
            },
        ).fetchone()
    assert row is not None
    return row


def delete(conn: Connection[Any], *, endpoint_id: UUID, queue: str) -> PolicyRecord | None:
    """Delete the queue's policy (its windows cascade); the deleted row, or None."""
    with conn.cursor(row_factory=class_row(PolicyRecord)) as cur:
        return cur.execute(
            _Q["policy_delete"], {"endpoint_id": endpoint_id, "queue": queue}
        ).fetchone()


def audit(
    conn: Connection[Any],
    *,
    policy_id: UUID,
    endpoint_id: UUID,
    queue: str,
    actor_human_id: UUID,
    actor_endpoint_id: UUID | None,
    action: str,
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
) -> None:
    """Record one policy change."""
    conn.execute(
        _Q["audit_insert"],
        {
            "policy_id": policy_id,
            "endpoint_id": endpoint_id,
            "queue": queue,
            "actor_human_id": actor_human_id,
            "actor_endpoint_id": actor_endpoint_id,
            "action": action,
            "before": Jsonb(before) if before is not None else None,
            "after": Jsonb(after) if after is not None else None,
        },
    )


def audit_tail(
    conn: Connection[Any], *, endpoint_id: UUID, queue: str, limit: int = 50
) -> list[AuditRecord]:
    """The newest audit rows of a queue's policy."""
    with conn.cursor(row_factory=class_row(AuditRecord)) as cur:
        return cur.execute(
            _Q["audit_list"], {"endpoint_id": endpoint_id, "queue": queue, "limit": limit}
        ).fetchall()


def recent_windows(
    conn: Connection[Any], *, policy_id: UUID, limit: int = 30
) -> list[WindowRecord]:
    """The newest window counters of a policy."""
    with conn.cursor(row_factory=class_row(WindowRecord)) as cur:
        return cur.execute(_Q["windows_list"], {"policy_id": policy_id, "limit": limit}).fetchall()
