"""Background sweeps as run-once functions: each takes ``now``, returns a count, is idempotent.

The scheduler runs them only in the elected process; tests call them directly.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from switchboard import doorbells
from switchboard.db import Database
from switchboard.store import maintenance, mcp_sessions, todos


def reap_expired(db: Database, *, now: datetime | None = None) -> int:
    """Fail lapsed claims that have no attempts left, batch by batch; returns how many."""
    return _until_done(db, todos.reap_expired, now)


def requeue_due_retries(db: Database, *, now: datetime | None = None) -> int:
    """Move due retries back to pending, batch by batch; returns how many."""
    return _until_done(db, todos.requeue_due_retries, now)


MCP_SESSION_RETENTION = timedelta(hours=24)


def prune_mcp_sessions(db: Database, *, now: datetime | None = None) -> int:
    """Forget MCP sessions ended or idle for a day, batch by batch; returns how many."""
    before = (now or datetime.now(UTC)) - MCP_SESSION_RETENTION
    return _until_done(db, lambda conn, now: mcp_sessions.prune(conn, before=before), now)


def _until_done(db: Database, batch: Callable[..., int], now: datetime | None) -> int:
    """Run one-batch store sweeps, each in its own short transaction, until one finds nothing."""
    total = 0
    while True:
        with db.transaction() as conn:
            done = batch(conn, now=now)
        total += done
        if done == 0:
            return total


# The heartbeat sweep: leases that lapsed since the last tick (two ticks back: a late tick
# misses none) owe a ring, and so does work left unclaimed and unrung for the repeat interval.
LAPSE_LOOKBACK = timedelta(seconds=60)
BELL_REPEAT = timedelta(minutes=5)


def configure(*, tick_seconds: int, bell_repeat_seconds: int) -> None:
    """Set the heartbeat sweep's intervals from the process's configuration."""
    global LAPSE_LOOKBACK, BELL_REPEAT
    LAPSE_LOOKBACK = timedelta(seconds=2 * tick_seconds)
    BELL_REPEAT = timedelta(seconds=bell_repeat_seconds)


def doorbell_heartbeat(db: Database, *, now: datetime | None = None) -> int:
    """Owe rings for lapsed leases and long-unclaimed work; returns the new debts."""
    return doorbells.heartbeat(db, now=now, lapsed_since=LAPSE_LOOKBACK, repeat=BELL_REPEAT)


VACUUM_THRESHOLD = 2000  # dead row versions; a few pages' worth at the front of the index


def vacuum_todos(db: Database, *, threshold: int = VACUUM_THRESHOLD) -> int:
    """VACUUM todos when enough dead versions piled up; returns the dead count it acted on
    (0 when it did nothing)."""
    with db.statement() as conn:
        dead = maintenance.dead_tuples(conn)
        if dead < threshold:
            return 0
        maintenance.vacuum_todos(conn)
    return dead
