"""Doorbell rows (SPEC §7): the todo_ready outbox, rings, presence, hook deliveries, gates."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.rows import class_row

from switchboard.store import load_queries

_Q = load_queries("doorbells")

# Causes of a ring (todo_ready_rings.cause); the outbox holds all but "reopen".
CREATE, RELEASE, RETRY, LAPSE, HEARTBEAT, REOPEN = (
    "create",
    "release",
    "retry",
    "lapse",
    "heartbeat",
    "reopen",
)


@dataclass(frozen=True)
class Owed:
    """A ring owed for a queue, taken from the outbox."""

    endpoint_id: UUID
    queue: str
    cause: str


@dataclass(frozen=True)
class Ring:
    """One todo_ready as a stream reads it."""

    id: int
    endpoint: str  # the slug
    queue: str
    pending: int
    cause: str
    rung_at: datetime


@dataclass(frozen=True)
class Hook:
    slug: str
    notify_url: str | None
    attached: bool


@dataclass(frozen=True)
class Delivery:
    """A notify-hook POST leased to this process."""

    id: UUID
    url: str
    body: str
    attempts: int
    secret: str


@dataclass(frozen=True)
class DeliveryRecord:
    id: UUID
    ring_id: int
    url: str
    body: str
    status: str
    attempts: int
    last_error: str | None
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class Gate:
    policy_id: UUID
    endpoint_id: UUID
    queue: str
    deferred_since: datetime


def request_ring(
    conn: Connection[Any], *, endpoint_id: UUID, queue: str, cause: str, now: datetime | None
) -> bool:
    """Owe a ring for the queue; True when this call created the debt (and woke dispatchers)."""
    params = {"endpoint_id": endpoint_id, "queue": queue, "cause": cause, "now": now}
    row = conn.execute(_Q["request_ring"], params).fetchone()
    return bool(row and row[0])


def request_rings(
    conn: Connection[Any],
    *,
    pairs: Sequence[tuple[UUID, str]],
    cause: str,
    now: datetime | None,
) -> int:
    """Owe rings for many (endpoint, queue) pairs; returns how many debts are new."""
    if not pairs:
        return 0
    params = {
        "endpoint_ids": [endpoint_id for endpoint_id, _ in pairs],
        "queues": [queue for _, queue in pairs],
        "cause": cause,
        "now": now,
    }
    row = conn.execute(_Q["request_rings"], params).fetchone()
    return int(row[0]) if row else 0


def take_due(
    conn: Connection[Any], *, now: datetime, interval: timedelta, limit: int
) -> list[Owed]:
    """Take owed rings of queues not rung within ``interval`` (SKIP LOCKED)."""
    with conn.cursor(row_factory=class_row(Owed)) as cur:
        params = {"now": now, "interval": interval, "limit": limit}
        return cur.execute(_Q["take_due"], params).fetchall()


def owed_count(conn: Connection[Any]) -> int:
    row = conn.execute(_Q["owed_count"]).fetchone()
    return int(row[0]) if row else 0


def claimable_count(
    conn: Connection[Any], *, endpoint_id: UUID, queue: str, now: datetime, cap: int
) -> int:
    """Claimable todos of the queue per state, each counted up to ``cap``."""
    params = {"endpoint_id": endpoint_id, "queue": queue, "now": now, "cap": cap}
    row = conn.execute(_Q["claimable_count"], params).fetchone()
    return int(row[0]) if row else 0


def pending_count(conn: Connection[Any], *, endpoint_id: UUID, queue: str, cap: int) -> int:
    """Pending todos of the queue, counted up to ``cap``."""
    params = {"endpoint_id": endpoint_id, "queue": queue, "cap": cap}
    row = conn.execute(_Q["pending_count"], params).fetchone()
    return int(row[0]) if row else 0


def ring(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    queue: str,
    pending: int,
    cause: str,
    now: datetime,
) -> int:
    """Record a todo_ready (streams everywhere are woken at commit); returns its id."""
    params = {
        "endpoint_id": endpoint_id,
        "queue": queue,
        "pending": pending,
        "cause": cause,
        "now": now,
    }
    row = conn.execute(_Q["ring"], params).fetchone()
    assert row is not None
    return int(row[0])


def endpoint_hook(conn: Connection[Any], *, endpoint_id: UUID, attached_since: datetime) -> Hook:
    with conn.cursor(row_factory=class_row(Hook)) as cur:
        params = {"endpoint_id": endpoint_id, "attached_since": attached_since}
        row = cur.execute(_Q["endpoint_hook"], params).fetchone()
    assert row is not None
    return row


def enqueue_delivery(
    conn: Connection[Any], *, endpoint_id: UUID, ring_id: int, url: str, body: str, now: datetime
) -> UUID:
    params = {"endpoint_id": endpoint_id, "ring_id": ring_id, "url": url, "body": body, "now": now}
    row = conn.execute(_Q["enqueue_delivery"], params).fetchone()
    assert row is not None
    return UUID(str(row[0]))


def rings_since(conn: Connection[Any], *, endpoint_id: UUID, since: datetime) -> list[Ring]:
    with conn.cursor(row_factory=class_row(Ring)) as cur:
        return cur.execute(
            _Q["rings_since"], {"endpoint_id": endpoint_id, "since": since}
        ).fetchall()


# --- presence ------------------------------------------------------------------------------------


def stream_open(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    grant_id: UUID,
    session_id: UUID | None,
    era: str,
    client_name: str,
) -> tuple[UUID, datetime]:
    """Record an attached stream; returns its id and the database's opening time."""
    params = {
        "endpoint_id": endpoint_id,
        "grant_id": grant_id,
        "session_id": session_id,
        "era": era,
        "client_name": client_name,
    }
    row = conn.execute(_Q["stream_open"], params).fetchone()
    assert row is not None
    return UUID(str(row[0])), row[1]


def stream_touch(conn: Connection[Any], *, id: UUID) -> None:
    conn.execute(_Q["stream_touch"], {"id": id})


def stream_close(conn: Connection[Any], *, id: UUID) -> None:
    conn.execute(_Q["stream_close"], {"id": id})


def streams_prune(conn: Connection[Any], *, before: datetime) -> int:
    return conn.execute(_Q["streams_prune"], {"before": before}).rowcount


# --- notify-hook deliveries ----------------------------------------------------------------------


def delivery_take(conn: Connection[Any], *, now: datetime, lease: timedelta) -> Delivery | None:
    with conn.cursor(row_factory=class_row(Delivery)) as cur:
        return cur.execute(_Q["delivery_take"], {"now": now, "lease": lease}).fetchone()


def delivery_done(conn: Connection[Any], *, id: UUID, now: datetime) -> None:
    conn.execute(_Q["delivery_done"], {"id": id, "now": now})


def delivery_retry(
    conn: Connection[Any], *, id: UUID, next_attempt_at: datetime, error: str
) -> None:
    conn.execute(
        _Q["delivery_retry"], {"id": id, "next_attempt_at": next_attempt_at, "error": error}
    )


def delivery_give_up(conn: Connection[Any], *, id: UUID, now: datetime, error: str) -> None:
    conn.execute(_Q["delivery_give_up"], {"id": id, "now": now, "error": error})


def deliveries(conn: Connection[Any], *, endpoint_id: UUID) -> list[DeliveryRecord]:
    with conn.cursor(row_factory=class_row(DeliveryRecord)) as cur:
        return cur.execute(_Q["deliveries"], {"endpoint_id": endpoint_id}).fetchall()


# --- reopen gates --------------------------------------------------------------------------------


def gate_defer(
    conn: Connection[Any], *, endpoint_id: UUID, queue: str, reason: str, now: datetime
) -> None:
    """Mark the budgeted queue's gate deferred (kept as is when already deferred)."""
    params = {"endpoint_id": endpoint_id, "queue": queue, "reason": reason, "now": now}
    conn.execute(_Q["gate_defer"], params)


def gates_deferred(
    conn: Connection[Any], *, endpoint_id: UUID | None = None, queue: str | None = None
) -> list[Gate]:
    with conn.cursor(row_factory=class_row(Gate)) as cur:
        params = {"endpoint_id": endpoint_id, "queue": queue}
        return cur.execute(_Q["gates_deferred"], params).fetchall()


def gate_reopen(
    conn: Connection[Any], *, policy_id: UUID, now: datetime, window_start: datetime | None
) -> bool:
    """Clear a deferred gate; True for the one caller that cleared it."""
    params = {"policy_id": policy_id, "now": now, "window_start": window_start}
    return conn.execute(_Q["gate_reopen"], params).fetchone() is not None


def gates_prune(conn: Connection[Any]) -> int:
    return conn.execute(_Q["gates_prune"]).rowcount


# --- sweep reads ---------------------------------------------------------------------------------


def lapsed_queues(
    conn: Connection[Any], *, since: datetime, now: datetime
) -> list[tuple[UUID, str]]:
    rows = conn.execute(_Q["lapsed_queues"], {"since": since, "now": now}).fetchall()
    return [(row[0], row[1]) for row in rows]


def unrung_queues(conn: Connection[Any], *, before: datetime) -> list[tuple[UUID, str]]:
    rows = conn.execute(_Q["unrung_queues"], {"before": before}).fetchall()
    return [(row[0], row[1]) for row in rows]
