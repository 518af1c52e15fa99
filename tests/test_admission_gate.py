"""The one-statement budgeted claim (migration 0005's admission_gate; SPEC §4 R-ADMIT, R-NEVER,
R-CHARGE; §10 R-PERF): what it reads after the policy lock, and how it treats a caller whose
assumptions went stale — a policy redefined since the pre-read, or a window placed by a clock on
the other side of a boundary. Nothing is ever charged to a window the claim's clock is not in.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg import Connection

from switchboard.admission.windows import Window
from switchboard.db import Database
from switchboard.models import Actor, Endpoint, Human
from switchboard.services import todos as service
from switchboard.services.todos import Claimed, Idle
from switchboard.store import todos
from tests.conftest import make_endpoint, make_human
from tests.test_admission import NY_DAY, T0, add, attempt_count, budget, next_claim, used
from tests.test_query_plans import CLAIM_INDEXES, nodes, seeded  # noqa: F401 (fixture)

UTC_HOUR = {"period": "hour", "tz": "UTC", "start": "00:00"}


def gate_claim(conn: Connection[Any], endpoint: Endpoint, budgets: todos.Budgets) -> Any:
    return todos.claim_next_budgeted(
        conn,
        endpoint_id=endpoint.id,
        queues=["q"],
        budgets=budgets,
        claimant_endpoint_id=endpoint.id,
        claimant_human_id=None,
        actor="agent",
        now=T0,
    )


def placed(window: dict[str, Any] | None, at: datetime) -> todos.Budgets:
    return service._place({"q": Window(**window) if window else None}, at)[2]


def nothing_written(conn: Connection[Any]) -> bool:
    states = conn.execute("SELECT DISTINCT state FROM todos").fetchall()
    return used(conn) == [] and attempt_count(conn) == 0 and states == [("pending",)]


def test_a_stale_window_assumption_is_refused_and_writes_nothing(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=2)
    budget(conn, endpoint, owner, max_claims_per_window=5, window=NY_DAY)
    stale = {
        "assumed unbudgeted": todos.Budgets([], [], [], [], [], [], []),
        "another window": placed({**NY_DAY, "start": "06:00"}, T0),
        "yesterday's window": placed(NY_DAY, T0 - timedelta(days=1)),
        "tomorrow's window": placed(NY_DAY, T0 + timedelta(days=1)),
    }
    refusals = {name: gate_claim(conn, endpoint, budgets) for name, budgets in stale.items()}
    assert {name: (r.refusal, r.claim) for name, r in refusals.items()} == {
        "assumed unbudgeted": ("policy_changed", None),
        "another window": ("policy_changed", None),
        "yesterday's window": ("window_moved", None),
        "tomorrow's window": ("window_moved", None),
    }
    assert nothing_written(conn)
    admitted = gate_claim(conn, endpoint, placed(NY_DAY, T0))
    assert admitted.refusal is None and admitted.claim is not None
    assert used(conn) == [(datetime(2026, 3, 2, 5, 0, tzinfo=UTC), 1)]


def test_a_deleted_policy_admits_as_today(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=1)
    result = gate_claim(conn, endpoint, placed(NY_DAY, T0))  # assumed a policy; there is none
    assert result.refusal is None and not result.budgeted and result.claim is not None
    assert used(conn) == []


@pytest.mark.parametrize("skew", [timedelta(hours=-2), timedelta(hours=2)], ids=["behind", "ahead"])
def test_python_clock_across_a_boundary_is_retried_on_the_database_clock(
    conn: Connection[Any],
    endpoint: Endpoint,
    owner: Human,
    monkeypatch: pytest.MonkeyPatch,
    skew: timedelta,
) -> None:
    """The window rolls over between Python's placement and the statement (here: Python's
    clock two hours off): the gate refuses it as window_moved, claim_next re-reads with the
    database clock, and the claim is charged to the window of the claim's own instant."""
    add(conn, endpoint, n=3)
    budget(conn, endpoint, owner, max_claims_per_window=10, window=UTC_HOUR)
    row = conn.execute("SELECT now(), date_trunc('hour', now())").fetchone()
    assert row is not None
    db_now, hour = row
    outcomes: list[str | None] = []
    original = todos.claim_next_budgeted

    def spy(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        outcomes.append(result.refusal)
        return result

    monkeypatch.setattr(todos, "claim_next_budgeted", spy)
    first = next_claim(conn, endpoint, now=None)  # pre-read: placed on the database clock
    monkeypatch.setattr(service, "_python_now", lambda: db_now + skew)
    second = next_claim(conn, endpoint, now=None)  # cached policies: placed on Python's clock
    assert isinstance(first, Claimed) and isinstance(second, Claimed)
    assert outcomes == [None, "window_moved", None]
    assert used(conn) == [(hour, 2)]
    assert second.headroom is not None and second.headroom.used == 2
    assert second.headroom.window_resets_at == hour + timedelta(hours=1)


def test_a_window_that_keeps_moving_fails_closed(
    conn: Connection[Any], endpoint: Endpoint, owner: Human, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(conn, endpoint, n=2)
    budget(conn, endpoint, owner, max_claims_per_window=5, window=NY_DAY)
    original = service._place
    monkeypatch.setattr(service, "_place", lambda p, t: original(p, t - timedelta(days=1)))
    calls = []
    real = todos.claim_next_budgeted
    monkeypatch.setattr(
        todos, "claim_next_budgeted", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    result = next_claim(conn, endpoint)
    assert isinstance(result, Idle)
    assert [(d.queue, d.reason) for d in result.deferred] == [("q", "admission_unavailable")]
    # The stale tries, then q excluded: idle (the pass skipping busy queues, then waiting).
    assert len(calls) == service._STALE_RETRIES + 3
    assert nothing_written(conn)


def _seed(url: str, policy: dict[str, Any]) -> tuple[Endpoint, UUID]:
    with psycopg.connect(url) as setup:
        owner = make_human(setup)
        endpoint = make_endpoint(setup, owner)
        oldest = add(setup, endpoint, n=3)[0]
        budget(setup, endpoint, owner, **policy)
    return endpoint, oldest.id


def _wait_for_lock_waiter(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as probe:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            row = probe.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.01)
    raise AssertionError("the claim never waited for the policy lock")


@pytest.mark.parametrize(
    ("policy", "charge", "reason"),
    [
        ({"max_in_flight": 1}, False, "in_flight_full"),
        (
            {"max_claims_per_window": 1, "window": {"period": "day", "tz": "UTC"}},
            True,
            "window_exhausted",
        ),
    ],
    ids=["in-flight", "window"],
)
def test_the_gate_counts_what_the_previous_lock_holder_committed(
    clone_db: str, policy: dict[str, Any], charge: bool, reason: str
) -> None:
    """READ COMMITTED takes the claim statement's snapshot before it waits for the policy lock.
    Here the previous holder claims (and charges) while our claim waits; the gate's counts run
    in snapshots taken after the lock, so they see that claim and refuse — a count in the
    statement's own snapshot would see 0 and admit a second claim past the limit."""
    endpoint, oldest = _seed(clone_db, policy)
    db = Database(clone_db, min_size=1, max_size=2)
    db.open(wait=True)
    results: list[Any] = []
    try:
        with psycopg.connect(clone_db) as holder:
            holder.execute("SELECT 1 FROM admission_policies FOR UPDATE")
            holder.execute(
                "UPDATE todos SET state = 'claimed', attempt = 1, claimed_at = now(),"
                " lease_expires_at = now() + interval '1 hour' WHERE id = %s",
                (oldest,),
            )
            if charge:
                holder.execute(
                    "INSERT INTO admission_windows (policy_id, window_start, used)"
                    " SELECT id, date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC',"
                    " 1 FROM admission_policies"
                )
            claimer = threading.Thread(
                target=lambda: results.append(
                    service.claim_next(
                        db,
                        endpoint_id=endpoint.id,
                        granted_queues=None,
                        asked_queues=["q"],
                        actor=Actor(endpoint_id=endpoint.id),
                    )
                )
            )
            claimer.start()
            _wait_for_lock_waiter(clone_db)
        claimer.join(timeout=20)  # the holder committed when its block ended
    finally:
        db.close()
    [result] = results
    assert isinstance(result, Idle)
    assert [(d.queue, d.reason) for d in result.deferred] == [("q", reason)]
    with psycopg.connect(clone_db) as check:
        claimed = check.execute("SELECT count(*) FROM todos WHERE state = 'claimed'").fetchone()
        assert claimed == (1,)
        assert attempt_count(check) == 0  # the holder's claim was hand-made, ours refused
        assert [u for _, u in used(check)] == ([1] if charge else [])


def test_the_gate_refuses_to_run_without_read_committed(clone_db: str) -> None:
    endpoint, _ = _seed(clone_db, {"max_in_flight": 5})
    with psycopg.connect(clone_db) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        with pytest.raises(psycopg.errors.RaiseException, match="READ COMMITTED"):
            gate_claim(conn, endpoint, placed(None, T0))


def test_the_budgeted_claim_is_index_driven(seeded: Any) -> None:  # noqa: F811
    conn, endpoint = seeded
    queues = [f"q{i}" for i in range(20)]
    conn.execute(
        "INSERT INTO admission_policies (endpoint_id, queue, max_in_flight,"
        " max_claims_per_window, window_period, window_tz, window_start, created_by_human_id,"
        " updated_by_human_id)"
        " SELECT e.id, q, 10000, 1000000, 'day', 'UTC', '00:00', e.owner_human_id,"
        " e.owner_human_id FROM endpoints e, unnest(%s::text[]) q WHERE e.id = %s",
        (queues, endpoint.id),
    )
    budgets = service._place({q: Window("day", "UTC", "00:00") for q in queues}, datetime.now(UTC))[
        2
    ]
    params = {
        "endpoint_id": endpoint.id,
        "queues": None,
        "excluded": [],
        "lease_seconds": None,
        "claimant_endpoint_id": endpoint.id,
        "claimant_human_id": None,
        "actor": "x",
        "now": None,
        "skip_busy": True,
        **budgets.params(),
    }
    query = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + todos._CLAIM_NEXT_BUDGETED.encode()
    row = conn.execute(query, params).fetchone()
    conn.rollback()
    assert row is not None
    plan = row[0][0]
    for scan in (n for n in nodes(plan["Plan"]) if n.get("Relation Name") == "todos"):
        if scan["Node Type"] == "ModifyTable":
            continue
        if scan["Node Type"] == "Bitmap Heap Scan":
            assert scan["Plans"][0]["Index Name"] == "todos_pkey", scan
        else:
            assert scan["Index Name"] in CLAIM_INDEXES, scan
        assert scan["Actual Rows"] <= 1, scan
    # The gate's own reads (policy, in-flight through idx_todos_claimed_endpoint_queue, the
    # window counter) are counted in the statement's buffers.
    assert plan["Plan"]["Shared Hit Blocks"] + plan["Plan"].get("Shared Read Blocks", 0) < 400


def test_a_claim_over_several_queues_passes_over_a_busy_policy(clone_db: str) -> None:
    """While another claim holds q0's policy, claim_next over [q0, q1] takes q1's todo at once
    instead of waiting; asked for q0 alone it waits, and is admitted once the holder ends."""
    with psycopg.connect(clone_db) as setup:
        owner = make_human(setup)
        endpoint = make_endpoint(setup, owner)
        add(setup, endpoint, "q0", n=2)  # older than q1's
        add(setup, endpoint, "q1", n=1)
        for queue in ("q0", "q1"):
            budget(setup, endpoint, owner, queue, max_claims_per_window=5, window=NY_DAY)
    db = Database(clone_db, min_size=1, max_size=3)
    db.open(wait=True)
    actor = Actor(endpoint_id=endpoint.id)

    def claim(queues: list[str]) -> Any:
        return service.claim_next(
            db, endpoint_id=endpoint.id, granted_queues=None, asked_queues=queues, actor=actor
        )

    waited: list[Any] = []
    try:
        with psycopg.connect(clone_db) as holder:
            holder.execute("SELECT 1 FROM admission_policies WHERE queue = 'q0' FOR UPDATE")
            spread = claim(["q0", "q1"])
            assert isinstance(spread, Claimed) and spread.claim.todo.queue == "q1"
            waiter = threading.Thread(target=lambda: waited.append(claim(["q0"])))
            waiter.start()
            _wait_for_lock_waiter(clone_db)
        waiter.join(timeout=20)
    finally:
        db.close()
    [alone] = waited
    assert isinstance(alone, Claimed) and alone.claim.todo.queue == "q0"
    with psycopg.connect(clone_db) as check:
        assert sorted(u for _, u in used(check)) == [1, 1]
