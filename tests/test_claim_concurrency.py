"""Concurrency is proven by hammering one database, not argued (R-CLAIM, R-CAND).

16 threads, each on its own connection, drain 2,000 todos in 5 queues; then the same with
every lease lapsed so takeovers race each other.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest

from switchboard.db import Database
from switchboard.models import Claim
from switchboard.store import todos
from tests.conftest import make_endpoint, make_human

THREADS = 16
QUEUES = [f"q{i}" for i in range(5)]
TODOS = 2000


def seed(url: str, *, max_attempts: int = 5) -> UUID:
    with psycopg.connect(url) as conn:
        endpoint = make_endpoint(conn, make_human(conn))
        conn.execute(
            "INSERT INTO queues (endpoint_id, name) SELECT %s, unnest(%s::text[])",
            (endpoint.id, QUEUES),
        )
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title, max_attempts, created_at)"
            " SELECT %s, 'q' || (i %% 5), 'todo ' || i, %s,"
            "        clock_timestamp() + make_interval(secs => i)"
            " FROM generate_series(1, %s) i",
            (endpoint.id, max_attempts, TODOS),
        )
    return endpoint.id


def drain(db: Database, endpoint_id: UUID, now: datetime | None = None) -> list[Claim]:
    """Run THREADS claimers until every one sees an empty queue; returns all claims."""
    claims: list[Claim] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(THREADS)

    def claimer() -> None:
        try:
            start.wait()
            while True:
                with db.transaction() as conn:
                    claim = todos.claim_next(
                        conn,
                        endpoint_id=endpoint_id,
                        queues=None,
                        claimant_endpoint_id=endpoint_id,
                        claimant_human_id=None,
                        actor=f"endpoint:{endpoint_id}",
                        now=now,
                    )
                if claim is None:
                    return
                with lock:
                    claims.append(claim)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads)
    return claims


@pytest.fixture
def db(clone_db: str) -> Any:
    database = Database(clone_db, min_size=THREADS, max_size=THREADS)
    database.open(wait=True)
    yield database
    database.close()


def attempt_rows(url: str) -> Counter[tuple[UUID, int]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT todo_id, attempt FROM todo_attempts").fetchall()
    return Counter((row[0], row[1]) for row in rows)


def test_sixteen_threads_claim_every_todo_exactly_once(db: Database, clone_db: str) -> None:
    endpoint_id = seed(clone_db)
    claims = drain(db, endpoint_id)
    ids = Counter(claim.todo.id for claim in claims)
    assert len(ids) == TODOS and set(ids.values()) == {1}
    assert {claim.kind for claim in claims} == {"first"}
    rows = attempt_rows(clone_db)
    assert sum(rows.values()) == len(claims) == TODOS and set(rows.values()) == {1}
    with psycopg.connect(clone_db) as conn:
        states = dict(conn.execute("SELECT state, count(*) FROM todos GROUP BY state").fetchall())
        events = conn.execute("SELECT count(*) FROM events WHERE kind = 'claimed'").fetchone()
    assert states == {"claimed": TODOS}
    assert events == (TODOS,)


def test_racing_takeovers_have_one_winner_per_todo_per_attempt(db: Database, clone_db: str) -> None:
    endpoint_id = seed(clone_db)
    first = drain(db, endpoint_id)
    assert len(first) == TODOS
    # Every lease lapses: a second wave of 16 claimers races for the takeovers.
    later = datetime.now(UTC) + timedelta(hours=1)
    second = drain(db, endpoint_id, now=later)
    ids = Counter(claim.todo.id for claim in second)
    assert len(ids) == TODOS and set(ids.values()) == {1}
    assert {claim.kind for claim in second} == {"takeover"}
    assert {claim.todo.attempt for claim in second} == {2}
    rows = attempt_rows(clone_db)
    assert sum(rows.values()) == 2 * TODOS and set(rows.values()) == {1}
    with psycopg.connect(clone_db) as conn:
        outcomes = dict(
            conn.execute(
                "SELECT coalesce(outcome, 'open'), count(*) FROM todo_attempts GROUP BY 1"
            ).fetchall()
        )
    assert outcomes == {"lapsed": TODOS, "open": TODOS}


def test_mixed_waves_of_fresh_work_and_takeovers(db: Database, clone_db: str) -> None:
    """Half the claims lapse while new work is pending: both kinds drain, none twice."""
    endpoint_id = seed(clone_db)
    with db.transaction() as conn:
        for _ in range(TODOS // 2):
            todos.claim_next(
                conn,
                endpoint_id=endpoint_id,
                queues=None,
                claimant_endpoint_id=endpoint_id,
                claimant_human_id=None,
                actor="endpoint:x",
            )
    later = datetime.now(UTC) + timedelta(hours=1)
    claims = drain(db, endpoint_id, now=later)
    kinds = Counter(claim.kind for claim in claims)
    assert kinds == {"takeover": TODOS // 2, "first": TODOS // 2}
    assert len({claim.todo.id for claim in claims}) == TODOS
