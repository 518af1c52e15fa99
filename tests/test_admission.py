"""Admission control on every claim path with time pinned (SPEC §4: R-POLICY … R-AUDIT)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import Connection

from switchboard.admission import service as admission
from switchboard.errors import AdmissionUnavailable, Deferred, Invalid, NotFound
from switchboard.models import Actor, Endpoint, Human, Todo
from switchboard.services import todos as service
from switchboard.services.todos import Claimed, Idle, TodoDefaults
from switchboard.store import todos
from tests.conftest import SingleConnection

# 2026-03-02 is a Monday; New York is on EST (UTC-5) until 2026-03-08.
T0 = datetime(2026, 3, 2, 15, 0, tzinfo=UTC)
NY_DAY = {"period": "day", "tz": "America/New_York", "start": "00:00"}
NEXT_NY_MIDNIGHT = datetime(2026, 3, 3, 5, 0, tzinfo=UTC)


def add(
    conn: Connection[Any], endpoint: Endpoint, queue: str = "q", n: int = 1, **extra: Any
) -> list[Todo]:
    return [
        service.create(
            conn,
            endpoint_id=endpoint.id,
            data={"queue": queue, "title": f"t{i}", **extra},
            actor=Actor(endpoint_id=endpoint.id),
            defaults=TodoDefaults(),
            now=T0 - timedelta(minutes=60 - i),
        )
        for i in range(n)
    ]


def budget(
    conn: Connection[Any], endpoint: Endpoint, owner: Human, queue: str = "q", **policy: Any
) -> None:
    admission.put_policy(conn, endpoint=endpoint, queue=queue, data=policy, actor_human_id=owner.id)


def next_claim(
    conn: Connection[Any],
    endpoint: Endpoint,
    queues: list[str] | None = None,
    now: datetime = T0,
    granted: list[str] | None = None,
) -> Claimed | Idle:
    return service.claim_next(
        SingleConnection(conn),
        endpoint_id=endpoint.id,
        granted_queues=granted,
        asked_queues=queues,
        actor=Actor(endpoint_id=endpoint.id),
        now=now,
    )


def claim_by_id(
    conn: Connection[Any], endpoint: Endpoint, todo: Todo, now: datetime = T0
) -> Claimed:
    return service.claim(
        SingleConnection(conn),
        id=todo.id,
        endpoint_id=endpoint.id,
        granted_queues=None,
        actor=Actor(endpoint_id=endpoint.id),
        now=now,
    )


def used(conn: Connection[Any]) -> list[tuple[datetime, int]]:
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT window_start, used FROM admission_windows ORDER BY window_start"
        ).fetchall()
    ]


def attempt_count(conn: Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM todo_attempts").fetchone()
    assert row is not None
    return int(row[0])


def test_window_limit_defers_with_exact_next_boundary(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=5)
    budget(conn, endpoint, owner, max_claims_per_window=2, window=NY_DAY)
    first = next_claim(conn, endpoint)
    assert isinstance(first, Claimed) and first.headroom is not None
    assert (first.headroom.used, first.headroom.remaining) == (1, 1)
    assert first.headroom.window_resets_at == NEXT_NY_MIDNIGHT
    assert first.headroom.max_claims_per_window == 2 and first.headroom.in_flight is None
    second = next_claim(conn, endpoint)
    assert isinstance(second, Claimed) and second.headroom.remaining == 0  # type: ignore[union-attr]
    idle = next_claim(conn, endpoint)
    assert isinstance(idle, Idle)
    [item] = idle.deferred
    assert (item.queue, item.reason, item.pending, item.next_eligible_at, item.exact) == (
        "q",
        "window_exhausted",
        3,
        NEXT_NY_MIDNIGHT,
        True,
    )
    assert used(conn) == [(datetime(2026, 3, 2, 5, 0, tzinfo=UTC), 2)]
    assert attempt_count(conn) == 2


def test_window_rollover_readmits(conn: Connection[Any], endpoint: Endpoint, owner: Human) -> None:
    add(conn, endpoint, n=3)
    budget(conn, endpoint, owner, max_claims_per_window=1, window=NY_DAY)
    assert isinstance(next_claim(conn, endpoint), Claimed)
    assert isinstance(next_claim(conn, endpoint, now=NEXT_NY_MIDNIGHT - timedelta(seconds=1)), Idle)
    again = next_claim(conn, endpoint, now=NEXT_NY_MIDNIGHT)
    assert isinstance(again, Claimed)
    assert again.headroom.window_resets_at == datetime(2026, 3, 4, 5, 0, tzinfo=UTC)  # type: ignore[union-attr]
    assert [u for _, u in used(conn)] == [1, 1]


def test_in_flight_cap_defers_until_a_claim_ends(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=3, lease_seconds=60)
    budget(conn, endpoint, owner, max_in_flight=1)
    held = next_claim(conn, endpoint)
    assert isinstance(held, Claimed) and held.headroom.in_flight == 1  # type: ignore[union-attr]
    assert held.headroom.used is None and held.headroom.window_resets_at is None  # type: ignore[union-attr]
    idle = next_claim(conn, endpoint)
    assert isinstance(idle, Idle)
    [item] = idle.deferred
    assert (item.reason, item.exact) == ("in_flight_full", False)
    assert item.next_eligible_at == T0 + timedelta(seconds=60)  # the lease's expiry
    service.complete(
        conn,
        id=held.claim.todo.id,
        endpoint_id=endpoint.id,
        attempt=1,
        actor=Actor(endpoint_id=endpoint.id),
        now=T0,
    )
    assert isinstance(next_claim(conn, endpoint), Claimed)


def test_a_limit_of_zero_pauses_with_no_eligible_time(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    [todo] = add(conn, endpoint)
    budget(conn, endpoint, owner, max_in_flight=0)
    idle = next_claim(conn, endpoint)
    assert isinstance(idle, Idle)
    assert [(d.reason, d.next_eligible_at, d.exact) for d in idle.deferred] == [
        ("paused", None, False)
    ]
    with pytest.raises(Deferred) as err:
        claim_by_id(conn, endpoint, todo)
    assert err.value.details["reason"] == "paused"
    budget(conn, endpoint, owner, max_claims_per_window=0, window=NY_DAY)
    assert next_claim(conn, endpoint).deferred[0].reason == "paused"  # type: ignore[union-attr]
    assert attempt_count(conn) == 0


def test_claim_by_id_and_operator_claim_are_deferred_with_details(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    first, second, third = add(conn, endpoint, n=3)
    budget(conn, endpoint, owner, max_claims_per_window=1, window=NY_DAY)
    claimed = claim_by_id(conn, endpoint, first)
    assert claimed.headroom is not None and claimed.headroom.remaining == 0
    with pytest.raises(Deferred) as err:
        claim_by_id(conn, endpoint, second)
    assert err.value.code == "deferred"
    assert err.value.details == {
        "queue": "q",
        "reason": "window_exhausted",
        "pending": 1,
        "next_eligible_at": NEXT_NY_MIDNIGHT,
        "exact": True,
    }
    with pytest.raises(Deferred):
        service.claim_operator_owned(SingleConnection(conn), id=third.id, human=owner, now=T0)
    assert todos.get(conn, id=second.id).state == "pending"
    assert attempt_count(conn) == 1 and used(conn)[0][1] == 1


def test_every_committed_claim_is_charged_and_nothing_refunds(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    """R-CHARGE: first claim, release + reclaim, fail + retry, lapse + takeover: 4 units."""
    [todo] = add(conn, endpoint, lease_seconds=10, max_attempts=10)
    budget(conn, endpoint, owner, max_claims_per_window=100, window=NY_DAY)
    actor = Actor(endpoint_id=endpoint.id)
    kinds = []
    claim = next_claim(conn, endpoint)
    kinds.append(claim.claim.kind)  # type: ignore[union-attr]
    service.release(conn, id=todo.id, endpoint_id=endpoint.id, attempt=1, actor=actor, now=T0)
    claim = next_claim(conn, endpoint)
    kinds.append(claim.claim.kind)  # type: ignore[union-attr]
    failed = service.fail(
        conn, id=todo.id, endpoint_id=endpoint.id, attempt=2, actor=actor, error="boom", now=T0
    )
    assert failed.retry_at is not None
    claim = next_claim(conn, endpoint, now=failed.retry_at)
    kinds.append(claim.claim.kind)  # type: ignore[union-attr]
    lapse = failed.retry_at + timedelta(seconds=11)
    claim = next_claim(conn, endpoint, now=lapse)
    kinds.append(claim.claim.kind)  # type: ignore[union-attr]
    assert kinds == ["first", "reclaim", "retry", "takeover"]
    service.fail(
        conn,
        id=todo.id,
        endpoint_id=endpoint.id,
        attempt=4,
        actor=actor,
        error="x",
        retry=False,
        now=lapse,
    )
    todos.cancel(conn, id=add(conn, endpoint)[0].id, endpoint_id=endpoint.id, actor="x", now=T0)
    assert used(conn) == [(datetime(2026, 3, 2, 5, 0, tzinfo=UTC), 4)]
    assert attempt_count(conn) == 4


def test_takeover_is_not_blocked_by_its_own_lapsed_claim(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, lease_seconds=10)
    budget(conn, endpoint, owner, max_in_flight=1)
    assert isinstance(next_claim(conn, endpoint), Claimed)
    takeover = next_claim(conn, endpoint, now=T0 + timedelta(seconds=11))
    assert isinstance(takeover, Claimed) and takeover.claim.kind == "takeover"
    assert takeover.headroom.in_flight == 1  # type: ignore[union-attr]


def test_put_keeps_usage_on_a_limit_change_and_a_new_window_resets(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=6)
    budget(conn, endpoint, owner, max_claims_per_window=2, window=NY_DAY)
    next_claim(conn, endpoint)
    next_claim(conn, endpoint)
    assert isinstance(next_claim(conn, endpoint), Idle)
    budget(conn, endpoint, owner, max_claims_per_window=3, window=NY_DAY)  # limit only
    raised = next_claim(conn, endpoint)
    assert isinstance(raised, Claimed) and raised.headroom.used == 3  # type: ignore[union-attr]
    assert isinstance(next_claim(conn, endpoint), Idle)
    budget(
        conn,
        endpoint,
        owner,
        max_claims_per_window=3,
        window={"period": "day", "tz": "America/New_York", "start": "06:00"},
    )
    reset = next_claim(conn, endpoint)  # 10:00 EST: the 06:00 window started today, unused
    assert isinstance(reset, Claimed) and reset.headroom.used == 1  # type: ignore[union-attr]
    actions = [
        r[0]
        for r in conn.execute("SELECT action FROM admission_policy_audit ORDER BY id").fetchall()
    ]
    assert actions == ["create", "update", "update"]


def test_unknown_zone_fails_closed(conn: Connection[Any], endpoint: Endpoint, owner: Human) -> None:
    [todo] = add(conn, endpoint, n=1)
    add(conn, endpoint, "open", n=1)
    budget(conn, endpoint, owner, max_claims_per_window=10, window=NY_DAY)
    # A zone the embedded tzdata no longer knows (e.g. removed by an upgrade).
    conn.execute("UPDATE admission_policies SET window_tz = 'Mars/Olympus_Mons'")
    result = next_claim(conn, endpoint, queues=["q"])
    assert isinstance(result, Idle)
    assert [d.reason for d in result.deferred] == ["admission_unavailable"]
    with pytest.raises(AdmissionUnavailable):
        claim_by_id(conn, endpoint, todo)
    other = next_claim(conn, endpoint)  # the open queue is still served
    assert isinstance(other, Claimed) and other.claim.todo.queue == "open"
    assert todos.get(conn, id=todo.id).state == "pending"


def test_starvation_nine_exhausted_queues_do_not_block_the_open_one(
    conn: Connection[Any], endpoint: Endpoint, owner: Human, monkeypatch: pytest.MonkeyPatch
) -> None:
    queues = [f"q{i}" for i in range(10)]
    for queue in queues[:9]:  # the nine oldest queues are exhausted
        add(conn, endpoint, queue, n=2)
        budget(conn, endpoint, owner, queue, max_claims_per_window=0, window=NY_DAY)
    add(conn, endpoint, "q9", n=1)
    calls = []
    original = todos.claim_next_budgeted

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["excluded"])
        return original(*args, **kwargs)

    monkeypatch.setattr(todos, "claim_next_budgeted", counting)
    result = next_claim(conn, endpoint, queues=queues)
    assert isinstance(result, Claimed) and result.claim.todo.queue == "q9"
    assert len(calls) == 1 and calls[0] == queues[:9]  # excluded by the pre-read


def test_refusals_under_the_lock_are_bounded_by_the_queue_count(
    conn: Connection[Any], endpoint: Endpoint, owner: Human, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exhaustion the pre-read cannot see (it raced) is found under the lock, one queue per
    try, and the loop ends after at most len(queues) + 2 statements."""
    queues = [f"q{i}" for i in range(4)]
    for queue in queues:
        add(conn, endpoint, queue, n=2)
        budget(conn, endpoint, owner, queue, max_claims_per_window=1, window=NY_DAY)
        assert isinstance(next_claim(conn, endpoint, queues=[queue]), Claimed)
    real_states = admission.store.states

    def raced(*args: Any, **kwargs: Any) -> Any:  # a pre-read that missed the last claims
        fresh = real_states(*args, **kwargs)
        return [dataclasses.replace(s, latest_window_start=None, latest_used=None) for s in fresh]

    monkeypatch.setattr(admission.store, "states", raced)
    calls = []
    original = todos.claim_next_budgeted
    monkeypatch.setattr(
        todos,
        "claim_next_budgeted",
        lambda *a, **k: calls.append(k["excluded"]) or original(*a, **k),
    )
    result = next_claim(conn, endpoint, queues=queues)
    assert isinstance(result, Idle)
    assert sorted(d.queue for d in result.deferred) == queues
    assert len(calls) <= len(queues) + 2  # one refusal per queue; idle: skip pass, then wait


def test_no_policy_runs_one_statement_per_claim(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    """R-ZERO: an unbudgeted claim is today's one statement (after one pre-read has seen no
    policy); a budgeted one is one statement too (the gate inside it), after one pre-read."""
    add(conn, endpoint, "free", n=3)
    add(conn, endpoint, "budgeted", n=1)
    budget(conn, endpoint, owner, "budgeted", max_claims_per_window=5, window=NY_DAY)
    statements: list[str] = []
    original = psycopg.Cursor.execute

    def recording(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        statements.append(str(query))
        return original(cursor, query, *args, **kwargs)

    def count(queues: list[str]) -> tuple[Claimed | Idle, int]:
        statements.clear()
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(psycopg.Cursor, "execute", recording)
            result = next_claim(conn, endpoint, queues=queues)
        return result, len(statements)

    first, first_count = count(["free"])
    second, second_count = count(["free"])
    add(conn, endpoint, "budgeted", n=1)
    budgeted, budgeted_count = count(["budgeted"])
    again, again_count = count(["budgeted"])
    assert isinstance(first, Claimed) and first.headroom is None
    assert isinstance(second, Claimed) and second.headroom is None
    assert (first_count, second_count) == (2, 1)  # pre-read once, then the claim alone
    assert isinstance(budgeted, Claimed) and budgeted.headroom is not None
    assert isinstance(again, Claimed) and again.headroom is not None
    assert again.headroom.used == 2
    assert (budgeted_count, again_count) == (2, 1)


def test_a_policy_created_after_the_no_policy_hint_still_binds(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=3)
    assert isinstance(next_claim(conn, endpoint, queues=["q"]), Claimed)  # hint: no policy
    budget(conn, endpoint, owner, max_in_flight=0)
    result = next_claim(conn, endpoint, queues=["q"])
    assert isinstance(result, Idle) and [d.reason for d in result.deferred] == ["paused"]
    budget(conn, endpoint, owner, max_claims_per_window=1, window=NY_DAY)
    claimed = next_claim(conn, endpoint, queues=["q"])
    assert isinstance(claimed, Claimed) and claimed.headroom is not None


def test_pending_todos_carry_the_derived_admission_block(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    deferred_todo, _ = add(conn, endpoint, "q", n=2)
    [free] = add(conn, endpoint, "free")
    [open_todo] = add(conn, endpoint, "open")
    budget(conn, endpoint, owner, "q", max_claims_per_window=1, window=NY_DAY)
    budget(conn, endpoint, owner, "open", max_claims_per_window=5, window=NY_DAY)
    claimed = next_claim(conn, endpoint, queues=["q"])
    assert isinstance(claimed, Claimed)
    rows = todos.list_(conn, endpoint_ids=[endpoint.id])
    blocks = admission.todo_admission(conn, rows, now=T0)
    pending_q = [t for t in rows if t.queue == "q" and t.state == "pending"]
    assert [blocks[t.id] for t in pending_q] == [
        admission.TodoAdmission(True, "window_exhausted", NEXT_NY_MIDNIGHT, True)
    ]
    assert blocks[open_todo.id] == admission.TodoAdmission(False)
    assert free.id not in blocks and claimed.claim.todo.id not in blocks
    assert deferred_todo.id in blocks or claimed.claim.todo.id == deferred_todo.id


def test_status_reads_agree_with_the_database(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=4)
    budget(conn, endpoint, owner, max_claims_per_window=3, max_in_flight=2, window=NY_DAY)
    next_claim(conn, endpoint)
    next_claim(conn, endpoint)
    [status] = admission.queue_statuses(conn, endpoint_ids=[endpoint.id], now=T0)
    verdict = status.verdict
    assert (
        status.queue,
        verdict.reason,
        verdict.in_flight,
        verdict.used,
        verdict.remaining,
        status.pending,
    ) == ("q", "in_flight_full", 2, 2, 1, 2)
    assert verdict.window_start == datetime(2026, 3, 2, 5, 0, tzinfo=UTC)
    assert verdict.window_resets_at == NEXT_NY_MIDNIGHT


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({}, "_schema"),
        ({"max_in_flight": None, "max_claims_per_window": None}, "_schema"),
        ({"max_in_flight": -1}, "max_in_flight"),
        ({"max_in_flight": 10001}, "max_in_flight"),
        ({"max_in_flight": "3"}, "max_in_flight"),
        ({"max_in_flight": 2.5}, "max_in_flight"),
        ({"max_claims_per_window": 5}, "window"),
        ({"max_claims_per_window": 1000001, "window": NY_DAY}, "max_claims_per_window"),
        ({"max_in_flight": 1, "window": NY_DAY}, "window"),
        ({"max_claims_per_window": 5, "window": {**NY_DAY, "period": "month"}}, "window"),
        ({"max_claims_per_window": 5, "window": {**NY_DAY, "tz": "Mars/Base"}}, "window"),
        ({"max_claims_per_window": 5, "window": {**NY_DAY, "tz": "../../etc/passwd"}}, "window"),
        ({"max_claims_per_window": 5, "window": {**NY_DAY, "start": "24:00"}}, "window"),
        ({"max_claims_per_window": 5, "window": {**NY_DAY, "start": "7:00"}}, "window"),
        ({"max_claims_per_window": 5, "window": {**NY_DAY, "period": "week"}}, "window"),
        ({"max_claims_per_window": 5, "window": {**NY_DAY, "weekday": "Mon"}}, "window"),
        (
            {
                "max_claims_per_window": 5,
                "window": {**NY_DAY, "period": "week", "weekday": "Monday"},
            },
            "window",
        ),
        ({"max_claims_per_window": 5, "window": {"tz": "UTC"}}, "window"),
        ({"max_claims_per_window": 5, "window": "daily"}, "window"),
        ({"max_in_flight": 1, "surprise": True}, "surprise"),
    ],
)
def test_bad_policies_are_named_and_write_nothing(
    conn: Connection[Any], endpoint: Endpoint, owner: Human, policy: dict[str, Any], field: str
) -> None:
    with pytest.raises(Invalid) as err:
        budget(conn, endpoint, owner, **policy)
    assert field in err.value.fields, err.value.fields
    counts = conn.execute(
        "SELECT (SELECT count(*) FROM admission_policies),"
        " (SELECT count(*) FROM admission_policy_audit)"
    ).fetchone()
    assert counts == (0, 0)


def test_bad_queue_name_and_non_object_policy(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    with pytest.raises(Invalid) as err:
        admission.put_policy(
            conn,
            endpoint=endpoint,
            queue="no spaces",
            data={"max_in_flight": 1},
            actor_human_id=owner.id,
        )
    assert "queue" in err.value.fields
    with pytest.raises(Invalid):
        admission.put_policy(conn, endpoint=endpoint, queue="q", data=[1], actor_human_id=owner.id)


def test_audit_records_actor_before_after_and_survives_delete(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    budget(conn, endpoint, owner, max_in_flight=2)
    admission.put_policy(
        conn,
        endpoint=endpoint,
        queue="q",
        data={"max_in_flight": 3},
        actor_human_id=owner.id,
        actor_endpoint_id=endpoint.id,
    )
    admission.delete_policy(conn, endpoint=endpoint, queue="q", actor_human_id=owner.id)
    with pytest.raises(NotFound):
        admission.delete_policy(conn, endpoint=endpoint, queue="q", actor_human_id=owner.id)
    tail = admission.store.audit_tail(conn, endpoint_id=endpoint.id, queue="q")
    assert [(a.action, a.actor_endpoint_id) for a in tail] == [
        ("delete", None),
        ("update", endpoint.id),
        ("create", None),
    ]
    assert all(a.actor_human_id == owner.id for a in tail)
    assert tail[1].before["max_in_flight"] == 2 and tail[1].after["max_in_flight"] == 3  # type: ignore[index]
    assert tail[0].after is None and len({a.policy_id for a in tail}) == 1


def test_deleting_a_policy_restores_todays_behaviour_at_once(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=2)
    budget(conn, endpoint, owner, max_in_flight=0)
    assert isinstance(next_claim(conn, endpoint), Idle)
    admission.delete_policy(conn, endpoint=endpoint, queue="q", actor_human_id=owner.id)
    claimed = next_claim(conn, endpoint)
    assert isinstance(claimed, Claimed) and claimed.headroom is None


def test_week_window_on_the_declared_weekday(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    add(conn, endpoint, n=2)
    week = {"period": "week", "tz": "Europe/London", "start": "09:00", "weekday": "Wed"}
    budget(conn, endpoint, owner, max_claims_per_window=1, window=week)
    claimed = next_claim(conn, endpoint)
    assert claimed.headroom.window_resets_at == datetime(2026, 3, 4, 9, 0, tzinfo=UTC)  # type: ignore[union-attr]
    idle = next_claim(conn, endpoint, now=datetime(2026, 3, 4, 8, 59, tzinfo=UTC))
    assert isinstance(idle, Idle)
    assert isinstance(
        next_claim(conn, endpoint, now=datetime(2026, 3, 4, 9, 0, tzinfo=UTC)), Claimed
    )


def test_a_window_redefined_between_pre_read_and_lock_starts_over(
    clone_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from switchboard.db import Database
    from tests.conftest import make_endpoint, make_human

    with psycopg.connect(clone_db) as setup:
        owner = make_human(setup)
        endpoint = make_endpoint(setup, owner)
        add(setup, endpoint, n=2)
        budget(setup, endpoint, owner, max_claims_per_window=5, window=NY_DAY)
    original = todos.claim_next_budgeted
    calls: list[Any] = []

    def redefine_first(*args: Any, **kwargs: Any) -> Any:
        if not calls:  # an owner moves the window after this claim read the policy
            with psycopg.connect(clone_db, autocommit=True) as other:
                other.execute("UPDATE admission_policies SET window_start = '06:00'")
        calls.append(kwargs["budgets"].window_starts)
        result = original(*args, **kwargs)
        calls.append(result.refusal)
        return result

    monkeypatch.setattr(todos, "claim_next_budgeted", redefine_first)
    db = Database(clone_db, min_size=1, max_size=2)
    db.open(wait=True)
    try:
        claimed = service.claim_next(
            db,
            endpoint_id=endpoint.id,
            granted_queues=None,
            asked_queues=["q"],
            actor=Actor(endpoint_id=endpoint.id),
            now=T0,
        )
    finally:
        db.close()
    assert isinstance(claimed, Claimed) and claimed.headroom is not None
    # First try: the 00:00 window (refused as stale, nothing written); then 06:00, charged.
    assert calls == [
        [datetime(2026, 3, 2, 5, 0, tzinfo=UTC)],
        "policy_changed",
        [datetime(2026, 3, 2, 11, 0, tzinfo=UTC)],
        None,
    ]
    with psycopg.connect(clone_db) as check:
        assert used(check) == [(datetime(2026, 3, 2, 11, 0, tzinfo=UTC), 1)]
        assert attempt_count(check) == 1
