"""Periodic sweeps in exactly one process (R-SCHED).

APScheduler runs in every serving process, but a tick does work only in the process that holds
a PostgreSQL advisory lock on a dedicated connection. The lock is a session lock: when the
holder dies, or its connection breaks, PostgreSQL releases it and another process takes it on
its next tick. No coordination service is needed across containers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from apscheduler.schedulers.background import BackgroundScheduler

from switchboard import doorbells, retention, sweeps
from switchboard.db import Database

log = logging.getLogger(__name__)

LEADER_LOCK = 0x5357_4C45_4144  # "SWLEAD": any fixed key, distinct from the migration lock

Sweep = Callable[[Database, datetime | None], int]

SWEEPS: dict[str, Sweep] = {
    "reap_expired": lambda db, now: sweeps.reap_expired(db, now=now),
    "requeue_due_retries": lambda db, now: sweeps.requeue_due_retries(db, now=now),
    "prune_mcp_sessions": lambda db, now: sweeps.prune_mcp_sessions(db, now=now),
    # Doorbells (SPEC §7). Every process's bell pays owed rings at once; these are the tick's
    # share: lapsed leases and unclaimed work owe rings, deferred queues that opened ring once,
    # and whatever a dead process left owed or undelivered is paid.
    "doorbell_heartbeat": lambda db, now: sweeps.doorbell_heartbeat(db, now=now),
    "admission_reopen": lambda db, now: doorbells.reopen(db, now=now),
    "doorbell_dispatch": lambda db, now: doorbells.dispatch(db, now=now).rung,
    "notify_hooks": lambda db, now: doorbells.deliver_due(db, now=now).delivered,
    "prune_presence": lambda db, now: doorbells.prune_presence(db, now=now),
}


class Leadership:
    """Holds (or tries to take) the scheduler's advisory lock on its own connection."""

    def __init__(self, url: str, key: int = LEADER_LOCK) -> None:
        self.url = url
        self.key = key
        self._conn: psycopg.Connection[Any] | None = None
        self.leading = False
        # The tick, upkeep and retention jobs ask at once from the scheduler's threads; without
        # this two of them could each open a session, and the lock taken on the one dropped
        # would be lost with it.
        self._mutex = threading.RLock()

    def acquire(self) -> bool:
        """True when this process leads: a held lock is re-verified, a free one is taken."""
        with self._mutex:
            return self._acquire()

    def _acquire(self) -> bool:
        try:
            conn = self._connection()
            if self.leading:
                conn.execute("SELECT 1")  # the lock lives exactly as long as this session
            else:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.key,)).fetchone()
                self.leading = bool(row and row[0])
        except psycopg.Error as exc:
            log.warning("scheduler leadership check failed: %s", exc)
            self._release()
        return self.leading

    def release(self) -> None:
        """Give up leadership: unlock, then close the session. Closing alone also drops the
        lock, but only once the server has processed the disconnect, so a successor asking at
        once could still find it held."""
        with self._mutex:
            self._release()

    def _release(self) -> None:
        if self._conn is not None:
            if self.leading and not self._conn.closed:
                with contextlib.suppress(psycopg.Error):
                    self._conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))
            self._conn.close()
        self._conn = None
        self.leading = False

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            # The application name says which process leads (pg_stat_activity, pg_locks).
            self._conn = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=5,
                application_name=f"switchboard-scheduler-{os.getpid()}",
            )
            self.leading = False
        return self._conn


def tick(db: Database, leadership: Leadership, *, now: datetime | None = None) -> dict[str, int]:
    """Run every sweep once if this process leads; returns their counts ({} when not leader)."""
    if not leadership.acquire():
        return {}
    counts: dict[str, int] = {}
    for name, sweep in SWEEPS.items():
        try:
            counts[name] = sweep(db, now)
        except psycopg.Error as exc:  # a failed sweep must not stop the others or the ticker
            log.warning("sweep %s failed: %s", name, exc)
    return counts


def maintain(db: Database, leadership: Leadership) -> int:
    """The leader's index upkeep: VACUUM todos once dead entries pile up (0: nothing done)."""
    if not leadership.acquire():
        return 0
    try:
        return sweeps.vacuum_todos(db)
    except psycopg.Error as exc:
        log.warning("vacuum of todos failed: %s", exc)
        return 0


RETENTION_SECONDS = 24 * 3600  # retention runs daily (and a minute after a process starts)


def retain(
    db: Database, leadership: Leadership, *, keep: retention.Retention, now: datetime | None = None
) -> dict[str, int]:
    """The leader's daily retention run; returns its counts ({} when not leader or failed)."""
    if not leadership.acquire():
        return {}
    try:
        return retention.run_once(db, now=now, keep=keep)
    except psycopg.Error as exc:  # the next run (or the next leader) picks up where this one was
        log.warning("retention failed: %s", exc)
        return {}


class Scheduler:
    """The per-process ticker; only the leader's sweeps do work. Every process also checks its
    own idle pooled connections, so a PostgreSQL restart costs no request a broken one."""

    def __init__(
        self,
        db: Database,
        *,
        tick_seconds: float,
        maintenance_seconds: float = 10,
        keep: retention.Retention | None = None,
    ) -> None:
        self.db = db
        self.keep = keep or retention.Retention()
        self.leadership = Leadership(db.url)
        self._scheduler = BackgroundScheduler(timezone="UTC")
        first = datetime.now(UTC)
        self._add(self._tick, tick_seconds, first)
        self._add(self._maintain, maintenance_seconds, first)
        self._add(self._retain, RETENTION_SECONDS, first + timedelta(minutes=1))

    def _add(self, job: Callable[[], None], seconds: float, first: datetime) -> None:
        self._scheduler.add_job(
            job, "interval", seconds=seconds, max_instances=1, coalesce=True, next_run_time=first
        )

    def _tick(self) -> None:
        counts = tick(self.db, self.leadership)
        if any(counts.values()):
            log.info("sweeps: %s", counts)

    def _maintain(self) -> None:
        try:
            self.db.check_idle()
        except psycopg.Error as exc:
            log.warning("pool check failed: %s", exc)
        if dead := maintain(self.db, self.leadership):
            log.info("vacuumed todos (%d dead row versions)", dead)

    def _retain(self) -> None:
        counts = retain(self.db, self.leadership, keep=self.keep)
        if any(counts.values()):
            log.info("retention: %s", counts)

    def start(self) -> None:
        """Start ticking in a background thread."""
        self._scheduler.start()

    def shutdown(self) -> None:
        """Stop ticking and give up leadership."""
        self._scheduler.shutdown(wait=False)
        self.leadership.release()
