"""Every transition of SPEC §3 at the store level, with time pinned (never slept through)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from psycopg import Connection

from switchboard.errors import Conflict, NotFound
from switchboard.models import Actor, Endpoint, Human, Todo
from switchboard.services import todos as service
from switchboard.services.todos import TodoDefaults
from switchboard.store import todos
from tests.conftest import SingleConnection

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def agent(endpoint: Endpoint) -> Actor:
    return Actor(endpoint_id=endpoint.id)


def new_todo(
    conn: Connection[Any], endpoint: Endpoint, queue: str = "q", *, now: datetime = T0, **extra: Any
) -> Todo:
    data = {"queue": queue, "title": "do it", **extra}
    return service.create(
        conn,
        endpoint_id=endpoint.id,
        data=data,
        actor=agent(endpoint),
        defaults=TodoDefaults(),
        now=now,
    )


def claim_next(
    conn: Connection[Any],
    endpoint: Endpoint,
    *,
    now: datetime = T0,
    queues: list[str] | None = None,
) -> Any:
    return todos.claim_next(
        conn,
        endpoint_id=endpoint.id,
        queues=queues,
        claimant_endpoint_id=endpoint.id,
        claimant_human_id=None,
        actor=agent(endpoint).label,
        now=now,
    )


def finish(
    conn: Connection[Any],
    action: str,
    todo: Todo,
    attempt: int,
    *,
    now: datetime = T0,
    **extra: Any,
) -> Todo:
    return todos.finish(
        conn,
        action=action,
        id=todo.id,
        endpoint_id=todo.endpoint_id,
        attempt=attempt,
        actor="endpoint:x",
        now=now,
        **extra,
    )


def kinds(conn: Connection[Any], todo: Todo) -> list[str]:
    return [event.kind for event in todos.events(conn, todo_id=todo.id)]


def test_create_is_pending_with_defaults_and_logged(conn: Connection[Any], endpoint: Endpoint):
    todo = new_todo(conn, endpoint, payload={"k": [1, 2]})
    assert (todo.state, todo.attempt, todo.max_attempts, todo.lease_seconds) == (
        "pending",
        0,
        5,
        300,
    )
    assert todo.payload == {"k": [1, 2]}
    assert todo.created_by_endpoint_id == endpoint.id
    assert kinds(conn, todo) == ["created"]


def test_claim_sets_lease_attempt_claimant_and_opens_attempt(
    conn: Connection[Any], endpoint: Endpoint
):
    todo = new_todo(conn, endpoint, lease_seconds=60)
    claim = claim_next(conn, endpoint)
    assert claim is not None and claim.todo.id == todo.id and claim.kind == "first"
    claimed = claim.todo
    assert claimed.state == "claimed" and claimed.attempt == 1
    assert claimed.claimed_at == T0 and claimed.lease_expires_at == T0 + timedelta(seconds=60)
    assert claimed.claimed_by_endpoint_id == endpoint.id
    [row] = todos.attempts(conn, todo_id=todo.id)
    assert (row.attempt, row.kind, row.outcome, row.claimed_at) == (1, "first", None, T0)
    assert kinds(conn, todo) == ["created", "claimed"]


def test_claim_next_is_oldest_first_across_queues_and_idle_when_empty(
    conn: Connection[Any], endpoint: Endpoint
):
    b = new_todo(conn, endpoint, "b", now=T0)
    a = new_todo(conn, endpoint, "a", now=T0 + timedelta(seconds=1))
    c = new_todo(conn, endpoint, "b", now=T0 + timedelta(seconds=2))
    got = [claim_next(conn, endpoint, now=T0 + timedelta(seconds=5)).todo.id for _ in range(3)]
    assert got == [b.id, a.id, c.id]
    assert claim_next(conn, endpoint, now=T0 + timedelta(seconds=5)) is None


def test_claim_next_draws_only_from_the_asked_queues(conn: Connection[Any], endpoint: Endpoint):
    new_todo(conn, endpoint, "a")
    b = new_todo(conn, endpoint, "b", now=T0 + timedelta(seconds=1))
    assert claim_next(conn, endpoint, queues=["b"]).todo.id == b.id
    assert claim_next(conn, endpoint, queues=["b", "zzz"]) is None


def test_claim_next_never_crosses_endpoints(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
):
    from tests.conftest import make_endpoint

    other = make_endpoint(conn, owner)
    new_todo(conn, other, "q")
    assert claim_next(conn, endpoint) is None


def test_heartbeat_extends_the_current_lease(conn: Connection[Any], endpoint: Endpoint):
    new_todo(conn, endpoint)
    todo = claim_next(conn, endpoint).todo
    later = T0 + timedelta(seconds=200)
    beat = todos.heartbeat(
        conn, id=todo.id, endpoint_id=endpoint.id, attempt=1, lease_seconds=30, now=later
    )
    assert beat.lease_expires_at == later + timedelta(seconds=30)
    with pytest.raises(Conflict):
        todos.heartbeat(conn, id=todo.id, endpoint_id=endpoint.id, attempt=2, now=later)


def test_complete_closes_attempt_and_stores_result(conn: Connection[Any], endpoint: Endpoint):
    new_todo(conn, endpoint)
    todo = claim_next(conn, endpoint).todo
    done = finish(conn, "complete", todo, 1, result={"ok": True}, now=T0 + timedelta(seconds=3))
    assert (done.state, done.result, done.finished_at) == (
        "done",
        {"ok": True},
        T0 + timedelta(seconds=3),
    )
    assert done.lease_expires_at is None
    [row] = todos.attempts(conn, todo_id=todo.id)
    assert (row.outcome, row.ended_at) == ("completed", T0 + timedelta(seconds=3))
    assert kinds(conn, todo) == ["created", "claimed", "completed"]


@pytest.mark.parametrize("attempt", [1, 2, 3, 4])
def test_fail_with_retry_backs_off_within_bounds(
    conn: Connection[Any], endpoint: Endpoint, attempt: int
):
    todo = new_todo(conn, endpoint, max_attempts=10)
    for n in range(1, attempt + 1):
        now = T0 + timedelta(hours=2 * n)
        claim = claim_next(conn, endpoint, now=now)
        assert claim is not None and claim.todo.attempt == n
        failed = finish(conn, "fail", todo, n, error="boom", now=now)
    base = 10 * 2 ** (attempt - 1)
    delay = (failed.retry_at - now).total_seconds()
    assert failed.state == "retry_wait" and failed.last_error == "boom"
    assert 0.8 * base <= delay <= base


def test_backoff_is_capped_at_one_hour(conn: Connection[Any], endpoint: Endpoint):
    todo = new_todo(conn, endpoint, max_attempts=20)
    now = T0
    for n in range(1, 13):
        now = now + timedelta(hours=2)
        assert claim_next(conn, endpoint, now=now).todo.attempt == n
        failed = finish(conn, "fail", todo, n, error="x", now=now)
    assert 2880 <= (failed.retry_at - now).total_seconds() <= 3600


def test_retry_wait_is_claimable_only_once_due_and_counts_as_retry(
    conn: Connection[Any], endpoint: Endpoint
):
    todo = new_todo(conn, endpoint)
    claim_next(conn, endpoint)
    failed = finish(conn, "fail", todo, 1, error="boom")
    assert claim_next(conn, endpoint, now=failed.retry_at - timedelta(seconds=1)) is None
    claim = claim_next(conn, endpoint, now=failed.retry_at)
    assert claim is not None and claim.kind == "retry" and claim.todo.attempt == 2
    assert claim.todo.retry_at is None


def test_fail_without_retry_or_attempts_left_is_final(conn: Connection[Any], endpoint: Endpoint):
    todo = new_todo(conn, endpoint)
    claim_next(conn, endpoint)
    assert finish(conn, "fail", todo, 1, error="fatal", retry=False).state == "failed"
    last = new_todo(conn, endpoint, max_attempts=1)
    claim_next(conn, endpoint)
    failed = finish(conn, "fail", last, 1, error="boom")
    assert (failed.state, failed.retry_at) == ("failed", None)
    assert failed.finished_at is not None
    assert kinds(conn, failed)[-1] == "failed"


def test_max_attempts_exhausted_through_retries_ends_failed(
    conn: Connection[Any], endpoint: Endpoint
):
    todo = new_todo(conn, endpoint, max_attempts=3)
    now = T0
    for n in (1, 2, 3):
        now += timedelta(hours=2)
        assert claim_next(conn, endpoint, now=now).todo.attempt == n
        result = finish(conn, "fail", todo, n, error=f"e{n}", now=now)
    assert result.state == "failed"
    assert claim_next(conn, endpoint, now=now + timedelta(days=1)) is None
    outcomes = [a.outcome for a in todos.attempts(conn, todo_id=todo.id)]
    assert outcomes == ["failed", "failed", "failed"]


def test_release_returns_to_pending_and_next_claim_is_a_reclaim(
    conn: Connection[Any], endpoint: Endpoint
):
    todo = new_todo(conn, endpoint)
    claim_next(conn, endpoint)
    released = finish(conn, "release", todo, 1)
    assert (released.state, released.attempt, released.lease_expires_at) == ("pending", 1, None)
    assert released.claimed_by_endpoint_id is None
    claim = claim_next(conn, endpoint)
    assert claim.kind == "reclaim" and claim.todo.attempt == 2
    assert [a.outcome for a in todos.attempts(conn, todo_id=todo.id)] == ["released", None]


def test_takeover_after_lease_lapse_fences_the_old_attempt(
    conn: Connection[Any], endpoint: Endpoint
):
    todo = new_todo(conn, endpoint, lease_seconds=10)
    claim_next(conn, endpoint)
    assert claim_next(conn, endpoint, now=T0 + timedelta(seconds=10)) is None  # not yet lapsed
    later = T0 + timedelta(seconds=11)
    takeover = claim_next(conn, endpoint, now=later)
    assert takeover.kind == "takeover" and takeover.todo.attempt == 2
    before = todos.get(conn, id=todo.id)
    for action in ("complete", "fail", "release"):
        with pytest.raises(Conflict):
            finish(conn, action, todo, 1, now=later, error="late")
    with pytest.raises(Conflict):
        todos.heartbeat(conn, id=todo.id, endpoint_id=endpoint.id, attempt=1, now=later)
    assert todos.get(conn, id=todo.id) == before  # nothing changed
    first, second = todos.attempts(conn, todo_id=todo.id)
    assert (first.outcome, first.ended_at, second.kind) == ("lapsed", later, "takeover")


def test_claim_todo_by_id_and_conflict_when_not_claimable(
    conn: Connection[Any], endpoint: Endpoint
):
    todo = new_todo(conn, endpoint)
    claim = service.claim(
        SingleConnection(conn),
        id=todo.id,
        endpoint_id=endpoint.id,
        granted_queues=None,
        actor=agent(endpoint),
        now=T0,
    )
    assert claim.claim.todo.state == "claimed" and claim.headroom is None
    with pytest.raises(Conflict) as err:
        service.claim(
            SingleConnection(conn),
            id=todo.id,
            endpoint_id=endpoint.id,
            granted_queues=None,
            actor=agent(endpoint),
            now=T0,
        )
    assert err.value.details["state"] == "claimed"


def test_claim_todo_outside_granted_queues_or_endpoint_is_not_found(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
):
    from tests.conftest import make_endpoint

    todo = new_todo(conn, endpoint, "secret")
    with pytest.raises(NotFound):
        service.claim(
            SingleConnection(conn),
            id=todo.id,
            endpoint_id=endpoint.id,
            granted_queues=["public"],
            actor=agent(endpoint),
            now=T0,
        )
    other = make_endpoint(conn, owner)
    with pytest.raises(NotFound):
        service.claim(
            SingleConnection(conn),
            id=todo.id,
            endpoint_id=other.id,
            granted_queues=None,
            actor=agent(other),
            now=T0,
        )
    assert todos.get(conn, id=todo.id).state == "pending"


def test_operator_owned_claim_by_owner_admin_but_not_stranger(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
):
    from tests.conftest import make_human

    first = new_todo(conn, endpoint)
    second = new_todo(conn, endpoint)
    stranger = make_human(conn)
    with pytest.raises(NotFound):
        service.claim_operator_owned(SingleConnection(conn), id=first.id, human=stranger, now=T0)
    claim = service.claim_operator_owned(SingleConnection(conn), id=first.id, human=owner, now=T0)
    claimed = claim.claim.todo
    assert claimed.claimed_by_human_id == owner.id and claimed.claimed_by_endpoint_id is None
    admin = make_human(conn, admin=True)
    assert (
        service.claim_operator_owned(
            SingleConnection(conn), id=second.id, human=admin, now=T0
        ).claim.todo.state
        == "claimed"
    )


def test_cancel_from_each_open_state_and_conflict_when_finished(
    conn: Connection[Any], endpoint: Endpoint
):
    pending = new_todo(conn, endpoint, "p")
    assert (
        todos.cancel(conn, id=pending.id, endpoint_id=endpoint.id, actor="human:x", now=T0).state
        == "cancelled"
    )
    claimed = new_todo(conn, endpoint, "c")
    claim_next(conn, endpoint, queues=["c"])
    cancelled = todos.cancel(conn, id=claimed.id, endpoint_id=endpoint.id, actor="human:x", now=T0)
    assert cancelled.state == "cancelled" and cancelled.lease_expires_at is None
    assert todos.attempts(conn, todo_id=claimed.id)[0].outcome == "cancelled"
    with pytest.raises(Conflict):
        finish(conn, "complete", claimed, 1)
    with pytest.raises(Conflict):
        todos.cancel(conn, id=claimed.id, endpoint_id=endpoint.id, actor="human:x", now=T0)
    assert kinds(conn, claimed) == ["created", "claimed", "cancelled"]


def test_reaper_fails_only_lapsed_claims_without_attempts_left_and_is_idempotent(
    conn: Connection[Any], endpoint: Endpoint
):
    last = new_todo(conn, endpoint, "a", max_attempts=1, lease_seconds=10)
    spare = new_todo(conn, endpoint, "b", max_attempts=2, lease_seconds=10)
    claim_next(conn, endpoint, queues=["a"])
    claim_next(conn, endpoint, queues=["b"])
    later = T0 + timedelta(seconds=11)
    assert todos.reap_expired(conn, now=T0 + timedelta(seconds=5)) == 0
    assert todos.reap_expired(conn, now=later) == 1
    assert todos.reap_expired(conn, now=later) == 0
    reaped = todos.get(conn, id=last.id)
    assert reaped.state == "failed" and "lease lapsed" in (reaped.last_error or "")
    assert todos.attempts(conn, todo_id=last.id)[0].outcome == "lapsed"
    assert todos.get(conn, id=spare.id).state == "claimed"  # still open to a takeover
    assert kinds(conn, reaped)[-1] == "lapsed"


def test_retry_requeue_moves_only_due_todos_and_is_idempotent(
    conn: Connection[Any], endpoint: Endpoint
):
    todo = new_todo(conn, endpoint)
    claim_next(conn, endpoint)
    failed = finish(conn, "fail", todo, 1, error="boom")
    assert todos.requeue_due_retries(conn, now=failed.retry_at - timedelta(seconds=1)) == 0
    assert todos.requeue_due_retries(conn, now=failed.retry_at) == 1
    assert todos.requeue_due_retries(conn, now=failed.retry_at) == 0
    assert todos.get(conn, id=todo.id).state == "pending"
    claim = claim_next(conn, endpoint, now=failed.retry_at)
    assert claim.kind == "retry"
    assert kinds(conn, todo) == ["created", "claimed", "retry_scheduled", "requeued", "claimed"]


def test_unknown_ids_are_not_found(conn: Connection[Any], endpoint: Endpoint):
    import uuid

    missing = uuid.uuid4()
    with pytest.raises(NotFound):
        todos.get(conn, id=missing)
    with pytest.raises(NotFound):
        todos.finish(
            conn, action="complete", id=missing, endpoint_id=endpoint.id, attempt=1, actor="x"
        )
    with pytest.raises(NotFound):
        todos.cancel(conn, id=missing, endpoint_id=endpoint.id, actor="x")
    with pytest.raises(NotFound):
        service.claim(
            SingleConnection(conn),
            id=missing,
            endpoint_id=endpoint.id,
            granted_queues=None,
            actor=agent(endpoint),
        )


def test_list_filters_and_keyset_pagination(conn: Connection[Any], endpoint: Endpoint):
    made = [
        new_todo(conn, endpoint, "a" if i % 2 else "b", now=T0 + timedelta(seconds=i))
        for i in range(7)
    ]
    page1 = todos.list_(conn, endpoint_ids=[endpoint.id], limit=3)
    assert [t.id for t in page1] == [t.id for t in reversed(made)][:3]
    page2 = todos.list_(
        conn, endpoint_ids=[endpoint.id], limit=3, after=(page1[-1].created_at, page1[-1].id)
    )
    assert [t.id for t in page2] == [t.id for t in reversed(made)][3:6]
    only_a = todos.list_(conn, endpoint_ids=[endpoint.id], queue="a", state="pending")
    assert {t.queue for t in only_a} == {"a"} and len(only_a) == 3


def test_listing_for_a_queue_limited_grant_pages_fully(conn: Connection[Any], endpoint: Endpoint):
    for i in range(6):
        new_todo(conn, endpoint, "mine", now=T0 + timedelta(seconds=2 * i))
        new_todo(conn, endpoint, "other", now=T0 + timedelta(seconds=2 * i + 1))
    page = service.list_(conn, endpoint_id=endpoint.id, granted_queues=["mine"], limit=4)
    assert len(page) == 4 and {t.queue for t in page} == {"mine"}
    rest = service.list_(
        conn,
        endpoint_id=endpoint.id,
        granted_queues=["mine"],
        limit=4,
        after=(page[-1].created_at, page[-1].id),
    )
    assert len(rest) == 2 and {t.queue for t in rest} == {"mine"}
