"""Retention (SPEC §9): exactly the rows past their bound go, boundary rows on both sides stay
or go as documented, and every kept window's counter still equals its attempt rows
(R-CHARGE)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

from switchboard.db import Database
from switchboard.retention import Retention, run_once
from switchboard.scheduler import Leadership, retain
from tests.mcp_fixtures import Agent, make_agent

NOW = datetime(2026, 11, 30, tzinfo=UTC)  # pinned: every bound is computed from it
DAY = timedelta(days=1)
SECOND = timedelta(seconds=1)
KEEP = Retention(todo_days=30, event_days=90)
TODO_BOUND = NOW - 30 * DAY  # 2026-10-31
WINDOW_BOUND = NOW - 35 * DAY  # 2026-10-26
EVENT_BOUND = NOW - 90 * DAY  # 2026-09-01


@pytest.fixture
def db(clone_db: str) -> Iterator[Database]:
    database = Database(clone_db, min_size=1, max_size=2)
    database.open(wait=True)
    yield database
    database.close()


class Rows:
    """Rows written straight into the test database at chosen times."""

    def __init__(self, url: str, agent: Agent) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.endpoint_id = agent.endpoint_id
        self.agent = agent
        [(self.human_id,)] = self.conn.execute(
            "SELECT owner_human_id FROM endpoints WHERE id = %s", (self.endpoint_id,)
        ).fetchall()

    def one(self, query: str, *params: Any) -> Any:
        row = self.conn.execute(query, params).fetchone()
        return row[0] if row else None

    def ids(self, table: str, column: str = "id") -> set[Any]:
        return {row[0] for row in self.conn.execute(f"SELECT {column} FROM {table}")}

    def todo(
        self,
        queue: str,
        state: str,
        *,
        created: datetime,
        finished: datetime | None = None,
        claims: tuple[datetime, ...] = (),
        event_at: datetime | None = None,
    ) -> uuid.UUID:
        todo_id = uuid.uuid4()
        lease = created + DAY if state == "claimed" else None
        self.conn.execute(
            "INSERT INTO todos (id, endpoint_id, queue, title, state, attempt, created_at,"
            " updated_at, finished_at, lease_expires_at)"
            " VALUES (%s, %s, %s, 't', %s, %s, %s, %s, %s, %s)",
            (todo_id, self.endpoint_id, queue, state, len(claims), created, created, finished,
             lease),
        )  # fmt: skip
        for attempt, claimed_at in enumerate(claims, start=1):
            self.conn.execute(
                "INSERT INTO todo_attempts (todo_id, endpoint_id, queue, attempt, kind,"
                " claimed_at, claimed_by_endpoint_id)"
                " VALUES (%s, %s, %s, %s, 'first', %s, %s)",
                (todo_id, self.endpoint_id, queue, attempt, claimed_at, self.endpoint_id),
            )
        self.event(event_at or finished or created, todo_id, queue)
        return todo_id

    def event(self, at: datetime, todo_id: uuid.UUID | None = None, queue: str = "q") -> int:
        return int(
            self.one(
                "INSERT INTO events (at, endpoint_id, queue, todo_id, kind, actor)"
                " VALUES (%s, %s, %s, %s, 'created', 'test') RETURNING id",
                at, self.endpoint_id, queue, todo_id,
            )
        )  # fmt: skip

    def policy(self, queue: str) -> uuid.UUID:
        return uuid.UUID(
            str(
                self.one(
                    "INSERT INTO admission_policies (endpoint_id, queue, max_claims_per_window,"
                    " window_period, window_tz, window_start, created_by_human_id,"
                    " updated_by_human_id) VALUES (%s, %s, 100, 'day', 'UTC', '00:00', %s, %s)"
                    " RETURNING id",
                    self.endpoint_id, queue, self.human_id, self.human_id,
                )
            )
        )  # fmt: skip

    def window(self, policy_id: uuid.UUID, start: datetime, used: int) -> None:
        self.conn.execute(
            "INSERT INTO admission_windows (policy_id, window_start, used) VALUES (%s, %s, %s)",
            (policy_id, start, used),
        )

    def audit(self, policy_id: uuid.UUID, at: datetime, action: str = "update") -> int:
        return int(
            self.one(
                "INSERT INTO admission_policy_audit (policy_id, endpoint_id, queue,"
                " actor_human_id, action, at) VALUES (%s, %s, 'q', %s, %s, %s) RETURNING id",
                policy_id, self.endpoint_id, self.human_id, action, at,
            )
        )  # fmt: skip


@pytest.fixture
def rows(clone_db: str) -> Iterator[Rows]:
    written = Rows(clone_db, make_agent(clone_db))
    yield written
    written.conn.close()


def test_retention_deletes_exactly_the_rows_past_their_bounds(db: Database, rows: Rows) -> None:
    day = datetime(2026, 10, 27, tzinfo=UTC)  # a kept window (WINDOW_BOUND is 10-26 00:00)
    # Todos of a budgeted queue, and its window counters (each counting one attempt).
    policy = rows.policy("metered")
    rows.window(policy, WINDOW_BOUND - DAY, 1)  # gone: started before the bound
    rows.window(policy, WINDOW_BOUND, 1)  # kept: starts exactly at the bound
    rows.window(policy, day, 1)
    gone_old = rows.todo(
        "metered", "done", created=WINDOW_BOUND - DAY, claims=(WINDOW_BOUND - DAY + SECOND,),
        finished=WINDOW_BOUND - DAY + 2 * SECOND,
    )  # fmt: skip
    # Finished long enough ago, but claimed inside a kept window: kept (R-CHARGE).
    kept_edge = rows.todo(
        "metered", "done", created=WINDOW_BOUND, claims=(WINDOW_BOUND,),
        finished=WINDOW_BOUND + DAY / 2,
    )  # fmt: skip
    kept_window = rows.todo(
        "metered", "done", created=day, claims=(day + SECOND,), finished=day + 2 * SECOND
    )
    # Todos of a queue without a policy.
    old = datetime(2026, 10, 20, tzinfo=UTC)
    gone_done = rows.todo("plain", "done", created=old, claims=(old,), finished=old + SECOND)
    gone_cancelled = rows.todo(
        "plain", "cancelled", created=old, finished=TODO_BOUND - SECOND
    )  # fmt: skip
    kept_failed_edge = rows.todo(
        "plain", "failed", created=old, claims=(old,), finished=TODO_BOUND
    )  # fmt: skip
    kept_recent = rows.todo(
        "plain", "done", created=NOW - 2 * DAY, claims=(NOW - 2 * DAY,), finished=NOW - DAY
    )
    ancient = datetime(2026, 8, 1, tzinfo=UTC)
    kept_pending = rows.todo("plain", "pending", created=ancient, claims=(ancient + DAY,))
    kept_claimed = rows.todo(
        "plain", "claimed", created=ancient, claims=(ancient,), event_at=EVENT_BOUND + DAY
    )
    # Events without a todo, on both sides of the events bound.
    gone_event = rows.event(EVENT_BOUND - SECOND)
    kept_event = rows.event(EVENT_BOUND)
    # The policy audit: the newest row of a policy in force stays, however old.
    other = rows.policy("other")
    removed = uuid.uuid4()  # a deleted policy: its audit goes entirely once old
    gone_audit = {
        rows.audit(policy, ancient - DAY, "create"),
        rows.audit(other, EVENT_BOUND - SECOND, "create"),
        rows.audit(removed, ancient - DAY, "create"),
        rows.audit(removed, ancient, "delete"),
    }
    kept_audit = {rows.audit(policy, ancient), rows.audit(other, EVENT_BOUND)}
    # Doorbell bookkeeping, on both sides of a day.
    rings = {
        at: rows.one(
            "INSERT INTO todo_ready_rings (endpoint_id, queue, pending, cause, rung_at)"
            " VALUES (%s, 'plain', 1, 'create', %s) RETURNING id",
            rows.endpoint_id, at,
        )
        for at in (NOW - DAY - SECOND, NOW - DAY)
    }  # fmt: skip
    deliveries = {
        (status, at): rows.one(
            "INSERT INTO notify_deliveries (endpoint_id, ring_id, url, body, status,"
            " created_at, finished_at) VALUES (%s, 1, 'http://hook.example', '{}', %s, %s, %s)"
            " RETURNING id",
            rows.endpoint_id, status, NOW - 10 * DAY, at,
        )
        for status, at in (
            ("delivered", NOW - DAY - SECOND), ("given_up", NOW - DAY), ("pending", None)
        )
    }  # fmt: skip
    streams = {
        at: rows.one(
            "INSERT INTO mcp_streams (endpoint_id, grant_id, era, seen_at)"
            " VALUES (%s, %s, 'listen', %s) RETURNING id",
            rows.endpoint_id, rows.agent.grant_id, at,
        )
        for at in (NOW - DAY - SECOND, NOW - DAY)
    }  # fmt: skip
    todos_before = rows.ids("todos")
    event_todo = dict(rows.conn.execute("SELECT id, todo_id FROM events").fetchall())

    counts = run_once(db, now=NOW, keep=KEEP)

    assert counts == {
        "admission_windows": 1,
        "todos": 3,
        "events": 2,  # kept_pending's two-month-old event and the todo-less one
        "admission_policy_audit": 4,
        "todo_ready_rings": 1,
        "notify_deliveries": 1,
        "mcp_streams": 1,
    }
    gone_todos = {gone_old, gone_done, gone_cancelled}
    kept_todos = {
        kept_edge, kept_window, kept_failed_edge, kept_recent, kept_pending, kept_claimed
    }  # fmt: skip
    assert rows.ids("todos") == todos_before - gone_todos
    assert kept_todos <= rows.ids("todos")
    assert rows.ids("todo_attempts", "todo_id") == kept_todos
    assert rows.ids("admission_windows", "window_start") == {WINDOW_BOUND, day}
    # Events: those of kept todos (but kept_pending's, older than the events bound) and the
    # todo-less one logged exactly at the bound.
    kept_events = {e for e, t in event_todo.items() if t in kept_todos - {kept_pending}}
    assert rows.ids("events") == kept_events | {kept_event}
    assert gone_event in event_todo and len(kept_events) == len(kept_todos) - 1
    assert rows.ids("admission_policy_audit") == kept_audit
    assert gone_audit.isdisjoint(rows.ids("admission_policy_audit"))
    assert rows.ids("todo_ready_rings") == {rings[NOW - DAY]}
    assert rows.ids("notify_deliveries") == {
        deliveries[("given_up", NOW - DAY)], deliveries[("pending", None)]
    }  # fmt: skip
    assert rows.ids("mcp_streams") == {streams[NOW - DAY]}

    # R-CHARGE: every kept window's counter still equals the attempt rows claimed in it.
    for start, used in rows.conn.execute("SELECT window_start, used FROM admission_windows"):
        attempts = rows.one(
            "SELECT count(*) FROM todo_attempts WHERE queue = 'metered'"
            " AND claimed_at >= %s AND claimed_at < %s",
            start, start + DAY,
        )  # fmt: skip
        assert attempts == used

    assert set(run_once(db, now=NOW, keep=KEEP).values()) == {0}  # idempotent


def test_retention_deletes_in_batches_until_nothing_is_left(db: Database, rows: Rows) -> None:
    old = NOW - 60 * DAY
    rows.conn.execute(
        "INSERT INTO todos (endpoint_id, queue, title, state, created_at, finished_at)"
        " SELECT %s, 'bulk', 't', 'done', %s + n * interval '1 s', %s + n * interval '1 s'"
        " FROM generate_series(1, 2500) n",
        (rows.endpoint_id, old, old),
    )
    rows.conn.execute(
        "INSERT INTO events (at, endpoint_id, queue, kind, actor)"
        " SELECT %s, %s, 'bulk', 'noise', 'test' FROM generate_series(1, 2100)",
        (NOW - 200 * DAY, rows.endpoint_id),
    )
    counts = run_once(db, now=NOW, keep=KEEP)
    assert (counts["todos"], counts["events"]) == (2500, 2100)  # three batches each
    assert rows.one("SELECT count(*) FROM todos") == 0


def test_only_the_leader_runs_retention(db: Database, rows: Rows, clone_db: str) -> None:
    rows.event(EVENT_BOUND - DAY)
    leader, standby = Leadership(clone_db), Leadership(clone_db)
    try:
        assert leader.acquire()
        assert retain(db, standby, keep=KEEP, now=NOW) == {}
        assert rows.one("SELECT count(*) FROM events") == 1
        assert retain(db, leader, keep=KEEP, now=NOW)["events"] == 1
    finally:
        leader.release()
        standby.release()
