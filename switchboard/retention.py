"""Retention (SPEC §9): the leader prunes old rows once a day, batch by batch.

What goes, and when (``now`` minus):

- ``admission_windows`` that started more than 35 days ago (``WINDOW_DAYS``);
- finished todos (done, failed, cancelled) finished more than ``SWITCHBOARD_RETENTION_DAYS``
  ago, with their ``todo_attempts`` and ``events`` — except a todo with an attempt claimed in
  the last 35 days: that attempt may be counted by a window counter that is kept, and a kept
  window's ``used`` always equals its attempt rows (R-CHARGE). Such a todo goes once its last
  claim is 35 days old;
- ``events`` and ``admission_policy_audit`` older than the events bound
  (``SWITCHBOARD_EVENTS_RETENTION_DAYS``), but the newest audit row of each policy in force;
- doorbell bookkeeping older than a day (``DOORBELL_DAYS``): rings, finished notify-hook
  deliveries, presence rows of streams not seen (a live stream touches its row every few
  seconds).

Each batch is its own short transaction (``sweeps._until_done``), so retention never holds a
lock on more than one batch of rows; every function is idempotent and returns its count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from switchboard.db import Database
from switchboard.store import retention as store
from switchboard.sweeps import _until_done

WINDOW_DAYS = 35
DOORBELL_DAYS = 1


@dataclass(frozen=True)
class Retention:
    """How long finished todos and the events log are kept, in days."""

    todo_days: int = 30
    event_days: int = 90


def run_once(
    db: Database, *, now: datetime | None = None, keep: Retention = Retention()
) -> dict[str, int]:
    """Prune every table once; returns the rows deleted per table (todos: the todos)."""
    now = now or datetime.now(UTC)
    return {
        "admission_windows": prune_windows(db, now=now),
        "todos": prune_todos(db, now=now, days=keep.todo_days),
        "events": prune_events(db, now=now, days=keep.event_days),
        "admission_policy_audit": prune_audit(db, now=now, days=keep.event_days),
        "todo_ready_rings": _prune(db, store.prune_rings, now - timedelta(days=DOORBELL_DAYS)),
        "notify_deliveries": _prune(
            db, store.prune_deliveries, now - timedelta(days=DOORBELL_DAYS)
        ),
        "mcp_streams": _prune(db, store.prune_streams, now - timedelta(days=DOORBELL_DAYS)),
    }


def prune_windows(db: Database, *, now: datetime) -> int:
    """Delete window counters that started more than WINDOW_DAYS ago; returns how many."""
    return _prune(db, store.prune_windows, now - timedelta(days=WINDOW_DAYS))


def prune_todos(db: Database, *, now: datetime, days: int) -> int:
    """Delete todos finished more than ``days`` ago (none claimed in the last WINDOW_DAYS), with
    their attempts and events; returns how many todos."""
    before = now - timedelta(days=days)
    keep_claimed_since = now - timedelta(days=WINDOW_DAYS)
    with db.transaction() as conn:
        endpoint_ids = store.endpoint_ids(conn)
    return sum(
        _until_done(
            db,
            lambda conn, now, endpoint_id=endpoint_id: store.prune_todos(
                conn, endpoint_id=endpoint_id, before=before, keep_claimed_since=keep_claimed_since
            ),
            now,
        )
        for endpoint_id in endpoint_ids
    )


def prune_events(db: Database, *, now: datetime, days: int) -> int:
    """Delete events logged more than ``days`` ago; returns how many."""
    return _prune(db, store.prune_events, now - timedelta(days=days))


def prune_audit(db: Database, *, now: datetime, days: int) -> int:
    """Delete policy audit rows older than ``days`` but each policy's newest; returns how many."""
    return _prune(db, store.prune_audit, now - timedelta(days=days))


def _prune(db: Database, prune: Callable[..., int], before: datetime) -> int:
    return _until_done(db, lambda conn, now: prune(conn, before=before), None)
