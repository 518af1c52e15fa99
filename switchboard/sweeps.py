"""Background sweeps as run-once functions: each takes ``now``, returns a count, is idempotent.

The scheduler runs them only in the elected process; tests call them directly.
"""

from __future__ import annotations

from datetime import datetime

from switchboard.db import Database
from switchboard.store import todos


def reap_expired(db: Database, *, now: datetime | None = None) -> int:
    """Fail lapsed claims that have no attempts left, batch by batch; returns how many."""
    total = 0
    while True:
        with db.transaction() as conn:
            reaped = todos.reap_expired(conn, now=now)
        total += reaped
        if reaped == 0:
            return total


def requeue_due_retries(db: Database, *, now: datetime | None = None) -> int:
    """Move due retries back to pending, batch by batch; returns how many."""
    total = 0
    while True:
        with db.transaction() as conn:
            moved = todos.requeue_due_retries(conn, now=now)
        total += moved
        if moved == 0:
            return total
