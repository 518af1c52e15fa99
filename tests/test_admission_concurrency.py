"""R-NEVER and R-CHARGE under contention: several OS processes, each with several threads on
their own connections, hammer one budgeted queue.

Windows are real (the database clock); lease lapses and due retries are simulated by moving
lease_expires_at / retry_at into the past — time is never slept through.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from collections import Counter
from typing import Any
from uuid import UUID

import psycopg
import pytest

from switchboard.admission import service as admission
from switchboard.db import Database
from switchboard.errors import Conflict
from switchboard.models import Actor
from switchboard.services import todos as service
from switchboard.services.todos import Claimed
from tests.conftest import make_endpoint, make_human

PROCESSES = 4
THREADS = 4
DAY_UTC = {"period": "day", "tz": "UTC", "start": "00:00"}


def seed(url: str, todos: int, policy: dict[str, Any]) -> UUID:
    with psycopg.connect(url) as conn:
        owner = make_human(conn)
        endpoint = make_endpoint(conn, owner)
        conn.execute("INSERT INTO queues (endpoint_id, name) VALUES (%s, 'q')", (endpoint.id,))
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title, max_attempts, lease_seconds,"
            " created_at) SELECT %s, 'q', 't' || i, 20, 300,"
            " clock_timestamp() - make_interval(secs => 10000 - i)"
            " FROM generate_series(1, %s) i",
            (endpoint.id, todos),
        )
        admission.put_policy(
            conn, endpoint=endpoint, queue="q", data=policy, actor_human_id=owner.id
        )
    return endpoint.id


def _claimer(
    db: Database, endpoint_id: UUID, mode: str, report: list[Any], deadline: float
) -> None:
    actor = Actor(endpoint_id=endpoint_id)
    rng = random.Random()
    while time.monotonic() < deadline:
        outcome = service.claim_next(
            db, endpoint_id=endpoint_id, granted_queues=None, asked_queues=["q"], actor=actor
        )
        if not isinstance(outcome, Claimed):
            if any(d.reason == "in_flight_full" for d in outcome.deferred):
                continue  # capped, not empty: keep knocking
            return
        todo = outcome.claim.todo
        began = time.monotonic()
        report.append(("claim", outcome.claim.kind, todo.id, todo.attempt))
        if mode == "in_flight":
            time.sleep(rng.uniform(0.001, 0.006))  # hold the claim so overlaps would show
        ended = time.monotonic()
        action = (
            "complete"
            if mode != "mixed"
            else rng.choice(["complete", "complete", "retry", "release", "abandon"])
        )
        try:
            _finish(db, actor, todo.id, todo.attempt, action)
        except Conflict:
            pass  # taken over meanwhile: the stale attempt changes nothing
        report.append(("held", began, ended))


def _finish(db: Database, actor: Actor, todo_id: UUID, attempt: int, action: str) -> None:
    with db.transaction() as conn:
        common = {
            "id": todo_id,
            "endpoint_id": actor.endpoint_id,
            "attempt": attempt,
            "actor": actor,
        }
        if action == "complete":
            service.complete(conn, **common)
        elif action == "release":
            service.release(conn, **common)
        elif action == "retry":
            service.fail(conn, **common, error="flaky")
            conn.execute(
                "UPDATE todos SET retry_at = now() - interval '1 second'"
                " WHERE id = %s AND state = 'retry_wait'",
                (todo_id,),
            )
        else:  # abandon: the worker dies and its lease lapses
            conn.execute(
                "UPDATE todos SET lease_expires_at = now() - interval '1 second'"
                " WHERE id = %s AND attempt = %s AND state = 'claimed'",
                (todo_id, attempt),
            )


def worker(url: str, endpoint_id: UUID, mode: str, results: Any, seconds: float) -> None:
    """One OS process: THREADS claimers with their own connections."""
    db = Database(url, min_size=THREADS, max_size=THREADS)
    db.open(wait=True)
    report: list[Any] = []
    deadline = time.monotonic() + seconds
    threads = [
        threading.Thread(target=_claimer, args=(db, endpoint_id, mode, report, deadline))
        for _ in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    db.close()
    results.put(report)


def hammer(url: str, endpoint_id: UUID, mode: str, seconds: float = 60) -> list[Any]:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [
        context.Process(target=worker, args=(url, endpoint_id, mode, results, seconds))
        for _ in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    reports = [results.get(timeout=seconds + 60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
        assert process.exitcode == 0
    return [entry for report in reports for entry in report]


def charges(url: str) -> tuple[int, int]:
    """(sum of window counters, attempt rows) for the queue."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT (SELECT coalesce(sum(used), 0) FROM admission_windows),"
            " (SELECT count(*) FROM todo_attempts WHERE queue = 'q')"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_window_limit_admits_exactly_the_limit(clone_db: str) -> None:
    endpoint_id = seed(clone_db, 500, {"max_claims_per_window": 50, "window": DAY_UTC})
    entries = hammer(clone_db, endpoint_id, "window")
    claims = [e for e in entries if e[0] == "claim"]
    assert len(claims) == 50
    assert charges(clone_db) == (50, 50)
    assert len({c[2] for c in claims}) == 50


def test_window_limit_holds_with_retries_takeovers_and_releases(clone_db: str) -> None:
    endpoint_id = seed(clone_db, 200, {"max_claims_per_window": 120, "window": DAY_UTC})
    entries = hammer(clone_db, endpoint_id, "mixed")
    claims = [e for e in entries if e[0] == "claim"]
    assert len(claims) == 120
    assert charges(clone_db) == (120, 120)
    kinds = Counter(c[1] for c in claims)
    assert kinds["first"] > 0 and kinds["retry"] + kinds["takeover"] + kinds["reclaim"] > 0
    assert len({(c[2], c[3]) for c in claims}) == 120  # one winner per todo per attempt


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    points = sorted(
        [(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals],
        key=lambda p: (p[0], p[1]),
    )
    current = peak = 0
    for _, delta in points:
        current += delta
        peak = max(peak, current)
    return peak


class ClaimedMonitor(threading.Thread):
    """Samples the queue's claimed count in consistent snapshots while the hammer runs."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.peak, self.samples = url, 0, 0
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM todos WHERE queue = 'q' AND state = 'claimed'"
                ).fetchone()
                self.peak = max(self.peak, int(row[0]) if row else 0)
                self.samples += 1


@pytest.mark.parametrize("mode", ["in_flight"])
def test_in_flight_cap_is_never_exceeded(clone_db: str, mode: str) -> None:
    endpoint_id = seed(clone_db, 300, {"max_in_flight": 3})
    monitor = ClaimedMonitor(clone_db)
    monitor.start()
    entries = hammer(clone_db, endpoint_id, mode)
    monitor.stop.set()
    monitor.join(timeout=10)
    claims = [e for e in entries if e[0] == "claim"]
    held = [(e[1], e[2]) for e in entries if e[0] == "held"]
    assert len(claims) == 300 and len({c[2] for c in claims}) == 300
    # Each held interval lies inside its claim's true in-flight span (after the claim
    # committed, before the complete committed), so their overlap bounds the real one below.
    assert _max_overlap(held) <= 3
    assert 0 < monitor.peak <= 3 and monitor.samples > 10
    with psycopg.connect(clone_db) as conn:
        attempts = conn.execute("SELECT count(*) FROM todo_attempts").fetchone()
    assert attempts == (300,)


def test_in_flight_cap_with_takeovers_in_the_mix(clone_db: str) -> None:
    endpoint_id = seed(
        clone_db, 150, {"max_in_flight": 3, "max_claims_per_window": 400, "window": DAY_UTC}
    )
    monitor = ClaimedMonitor(clone_db)
    monitor.start()
    entries = hammer(clone_db, endpoint_id, "mixed")
    monitor.stop.set()
    monitor.join(timeout=10)
    claims = [e for e in entries if e[0] == "claim"]
    assert monitor.peak <= 3
    assert Counter(c[1] for c in claims)["takeover"] > 0
    used, attempts = charges(clone_db)
    assert used == attempts == len(claims) <= 400
    assert len({(c[2], c[3]) for c in claims}) == len(claims)
