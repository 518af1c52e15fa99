"""R-SCHED: every process ticks, only the advisory-lock holder sweeps, and a dead holder is
replaced within one tick."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from switchboard.db import Database
from switchboard.scheduler import SWEEPS, Leadership, tick
from tests.conftest import make_endpoint, make_human


@pytest.fixture
def db(clone_db: str) -> Any:
    database = Database(clone_db, min_size=1, max_size=2)
    database.open(wait=True)
    yield database
    database.close()


def test_only_one_process_leads_and_release_hands_over(clone_db: str) -> None:
    first, second = Leadership(clone_db), Leadership(clone_db)
    try:
        assert first.acquire() is True
        assert second.acquire() is False
        assert first.acquire() is True  # re-verified, still held
        first.release()
        assert second.acquire() is True
    finally:
        first.release()
        second.release()


def _lead_forever(url: str, ready: Any) -> None:
    leadership = Leadership(url)
    assert leadership.acquire()
    ready.set()
    time.sleep(600)


def test_a_killed_leader_is_replaced_within_one_tick(clone_db: str) -> None:
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    leader = context.Process(target=_lead_forever, args=(clone_db, ready))
    leader.start()
    standby = Leadership(clone_db)
    try:
        assert ready.wait(30)
        assert standby.acquire() is False
        assert leader.pid is not None
        os.kill(leader.pid, signal.SIGKILL)
        leader.join(10)
        # The server notices the dead client and drops its session lock; the standby's next
        # tick (polled here rather than slept through) takes over.
        deadline = time.monotonic() + 5
        while not standby.acquire():
            assert time.monotonic() < deadline, "leadership was not released"
            time.sleep(0.05)
    finally:
        standby.release()
        if leader.is_alive():
            leader.kill()


def test_a_terminated_leader_session_loses_and_regains_leadership(clone_db: str) -> None:
    leadership = Leadership(clone_db)
    try:
        assert leadership.acquire()
        with psycopg.connect(clone_db, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks"
                " WHERE locktype = 'advisory' AND pid <> pg_backend_pid()"
            )
        assert leadership.acquire() is False  # the broken session is noticed, not trusted
        assert leadership.acquire() is True  # and the lock is taken again on a new one
    finally:
        leadership.release()


def test_ticks_sweep_only_in_the_leader(db: Database, clone_db: str) -> None:
    with psycopg.connect(clone_db) as conn:
        endpoint = make_endpoint(conn, make_human(conn))
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title, state, attempt, max_attempts,"
            " lease_expires_at, claimed_at, retry_at) VALUES"
            " (%(e)s, 'q', 'lapsed', 'claimed', 1, 1, now() - interval '1 minute', now(), NULL),"
            " (%(e)s, 'q', 'due', 'retry_wait', 1, 3, NULL, NULL, now() - interval '1 second')",
            {"e": endpoint.id},
        )
        conn.execute("INSERT INTO queues (endpoint_id, name) VALUES (%s, 'q')", (endpoint.id,))
    leader, follower = Leadership(clone_db), Leadership(clone_db)
    try:
        assert leader.acquire()
        assert tick(db, follower) == {}
        idle = dict.fromkeys(SWEEPS, 0)
        # The requeued retry is new claimable work: its doorbell is paid in the same tick.
        assert tick(db, leader) == {
            **idle,
            "reap_expired": 1,
            "requeue_due_retries": 1,
            "doorbell_dispatch": 1,
        }
        assert tick(db, leader) == idle
        # A day on, that work still waits unclaimed: the heartbeat sweep rings it again, once.
        later = datetime.now(UTC) + timedelta(days=1)
        again = {**idle, "doorbell_heartbeat": 1, "doorbell_dispatch": 1}
        assert tick(db, leader, now=later) == again
        assert tick(db, leader, now=later + timedelta(seconds=1)) == idle
    finally:
        leader.release()
        follower.release()
    with psycopg.connect(clone_db) as conn:
        states = sorted(r[0] for r in conn.execute("SELECT state FROM todos").fetchall())
    assert states == ["failed", "pending"]


def test_the_leader_vacuums_todos_once_dead_entries_pile_up(db: Database, clone_db: str) -> None:
    from switchboard import sweeps
    from switchboard.scheduler import maintain

    with psycopg.connect(clone_db, autocommit=True) as conn:
        endpoint = make_endpoint(conn, make_human(conn))
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title)"
            " SELECT %s, 'q', 't' FROM generate_series(1, 3000)",
            (endpoint.id,),
        )
        conn.execute("UPDATE todos SET state = 'cancelled'")
        conn.execute("SELECT pg_stat_force_next_flush()")
    follower, leader = Leadership(clone_db), Leadership(clone_db)
    try:
        assert leader.acquire()
        assert maintain(db, follower) == 0  # not the leader: nothing
        assert sweeps.vacuum_todos(db, threshold=10**9) == 0  # below threshold: nothing
        assert maintain(db, leader) >= 2000
    finally:
        leader.release()
        follower.release()
    with psycopg.connect(clone_db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT vacuum_count FROM pg_stat_user_tables WHERE relname = 'todos'"
        ).fetchone()
    assert row is not None and row[0] >= 1


def test_idle_pool_connections_broken_by_a_restart_are_replaced(
    db: Database, clone_db: str
) -> None:
    with db.transaction() as conn:
        conn.execute("SELECT 1")
    with psycopg.connect(clone_db, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    db.check_idle()
    with db.transaction() as conn:  # no request pays for the broken connection
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_jobs_asking_at_once_share_one_session_and_all_lead(clone_db: str) -> None:
    """The tick, upkeep and retention jobs start together: they must not each open a session
    (the lock taken on a dropped one would be lost, and the process would not know it leads)."""
    leadership = Leadership(clone_db)
    barrier = threading.Barrier(8)
    answers: list[bool] = []

    def ask() -> None:
        barrier.wait()
        answers.append(leadership.acquire())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert answers == [True] * 8
        with psycopg.connect(clone_db) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name LIKE 'switchboard-scheduler-%%'"
            ).fetchone()
        assert row is not None and row[0] == 1
    finally:
        leadership.release()
