"""Retention deletes (SPEC §9): one batch per call, inside the caller's transaction."""

from __future__ import annotations

from datetime import datetime
from typing import Any, LiteralString
from uuid import UUID

from psycopg import Connection

from switchboard.store import load_queries

_Q = load_queries("retention")
BATCH = 1000


def endpoint_ids(conn: Connection[Any]) -> list[UUID]:
    """Every endpoint's id."""
    return [row[0] for row in conn.execute(_Q["endpoint_ids"])]


def prune_windows(conn: Connection[Any], *, before: datetime, batch: int = BATCH) -> int:
    """Delete window counters that started before ``before`` (one batch); returns how many."""
    return _count(conn, _Q["prune_windows"], before=before, batch=batch)


def prune_todos(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    before: datetime,
    keep_claimed_since: datetime,
    batch: int = BATCH,
) -> int:
    """Delete one endpoint's todos finished before ``before``, with their attempts and events,
    except those with an attempt claimed at or after ``keep_claimed_since`` (one batch);
    returns how many todos."""
    return _count(
        conn,
        _Q["prune_todos"],
        endpoint_id=endpoint_id,
        before=before,
        keep_claimed_since=keep_claimed_since,
        batch=batch,
    )


def prune_events(conn: Connection[Any], *, before: datetime, batch: int = BATCH) -> int:
    """Delete events logged before ``before`` (one batch); returns how many."""
    return _count(conn, _Q["prune_events"], before=before, batch=batch)


def prune_audit(conn: Connection[Any], *, before: datetime, batch: int = BATCH) -> int:
    """Delete policy audit rows older than ``before`` but the newest of each existing policy
    (one batch); returns how many."""
    return _count(conn, _Q["prune_audit"], before=before, batch=batch)


def prune_rings(conn: Connection[Any], *, before: datetime, batch: int = BATCH) -> int:
    """Delete doorbell rings rung before ``before`` (one batch); returns how many."""
    return _count(conn, _Q["prune_rings"], before=before, batch=batch)


def prune_deliveries(conn: Connection[Any], *, before: datetime, batch: int = BATCH) -> int:
    """Delete notify deliveries finished before ``before`` (one batch); returns how many."""
    return _count(conn, _Q["prune_deliveries"], before=before, batch=batch)


def prune_streams(conn: Connection[Any], *, before: datetime, batch: int = BATCH) -> int:
    """Delete presence rows of streams not seen since ``before`` (one batch); returns how many."""
    return _count(conn, _Q["prune_streams"], before=before, batch=batch)


def _count(conn: Connection[Any], query: LiteralString, **params: Any) -> int:
    row = conn.execute(query, params).fetchone()
    assert row is not None
    return int(row[0])
