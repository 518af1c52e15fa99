"""Doorbells on a real PostgreSQL with ``now`` pinned (SPEC §7 R-BELL, R-GATE, R-REOPEN): which
changes owe a ring, which rings are gated, that a reopening rings exactly once, and the notify
hook's signed deliveries with retries. HTTP and the SDK client: tests/test_doorbells_http.py."""

from __future__ import annotations

import hashlib
import hmac
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg import Connection

from switchboard import doorbells
from switchboard.admission import service as admission
from switchboard.db import Database
from switchboard.errors import Deferred
from switchboard.models import Actor, Endpoint, Human
from switchboard.services import todos as service
from switchboard.services.todos import Claimed, Idle
from switchboard.store import doorbells as store
from tests.conftest import SingleConnection, make_endpoint, make_human
from tests.test_admission import NEXT_NY_MIDNIGHT, NY_DAY, T0, add, budget, next_claim


def claim_next(conn: Connection[Any], endpoint: Endpoint) -> Claimed | Idle:
    return next_claim(conn, endpoint)


def dispatch(conn: Connection[Any], now: datetime = T0) -> doorbells.Dispatched:
    return doorbells.dispatch(SingleConnection(conn), now=now)  # type: ignore[arg-type]


def rings(conn: Connection[Any], endpoint: Endpoint) -> list[tuple[str, int, str]]:
    rows = conn.execute(
        "SELECT queue, pending, cause FROM todo_ready_rings WHERE endpoint_id = %s ORDER BY id",
        (endpoint.id,),
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def deliveries(conn: Connection[Any], endpoint: Endpoint) -> list[store.DeliveryRecord]:
    return store.deliveries(conn, endpoint_id=endpoint.id)


def with_hook(conn: Connection[Any], endpoint: Endpoint, url: str = "http://127.0.0.1:9/h") -> None:
    conn.execute("UPDATE endpoints SET notify_url = %s WHERE id = %s", (url, endpoint.id))


def test_a_burst_of_creates_owes_one_ring_and_dispatch_pays_it(
    conn: Connection[Any], endpoint: Endpoint
) -> None:
    add(conn, endpoint, n=50)
    assert store.owed_count(conn) == 1  # fifty creates, one debt: the outbox coalesces
    paid = dispatch(conn)
    assert (paid.rung, paid.gated, paid.held) == (1, 0, 0)
    assert rings(conn, endpoint) == [("q", 50, "create")]
    # More work within the coalescing interval waits for it; after it, it rings again.
    add(conn, endpoint, n=1)
    assert dispatch(conn, T0 + timedelta(milliseconds=100)).held == 1
    assert dispatch(conn, T0 + doorbells.COALESCE + timedelta(milliseconds=1)).rung == 1
    assert [r[1] for r in rings(conn, endpoint)] == [50, 51]


def test_nobody_attached_means_a_signed_hook_delivery(
    conn: Connection[Any], endpoint: Endpoint
) -> None:
    with_hook(conn, endpoint)
    add(conn, endpoint, n=2)
    dispatch(conn)
    (delivery,) = deliveries(conn, endpoint)
    assert delivery.url == "http://127.0.0.1:9/h" and delivery.status == "pending"
    assert '"event":"todo_ready"' in delivery.body and '"pending":2' in delivery.body


def test_an_attached_agent_takes_the_ring_instead_of_the_hook(
    conn: Connection[Any], endpoint: Endpoint
) -> None:
    with_hook(conn, endpoint)
    grant = conn.execute(
        "INSERT INTO grants (endpoint_id, token_hash, verbs, granted_by_human_id)"
        " VALUES (%s, %s, '{claim_next}', %s) RETURNING id",
        (endpoint.id, b"x" * 32, endpoint.owner_human_id),
    ).fetchone()
    assert grant is not None
    store.stream_open(
        conn, endpoint_id=endpoint.id, grant_id=grant[0], session_id=None, era="listen",
        client_name="t",
    )  # fmt: skip
    add(conn, endpoint)
    # Presence is read against the database clock: ring "now".
    doorbells.dispatch(SingleConnection(conn), now=datetime.now(UTC))  # type: ignore[arg-type]
    assert len(rings(conn, endpoint)) == 1 and deliveries(conn, endpoint) == []


def test_an_exhausted_queue_rings_nothing_and_its_rollover_rings_once(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    with_hook(conn, endpoint)
    budget(conn, endpoint, owner, max_claims_per_window=1, window=NY_DAY)
    add(conn, endpoint)
    assert isinstance(claim_next(conn, endpoint), Claimed)  # the day's one claim
    conn.execute("DELETE FROM todo_ready_rings; DELETE FROM notify_deliveries")
    add(conn, endpoint, n=10)
    paid = dispatch(conn)
    assert (paid.rung, paid.gated) == (0, 1)  # R-GATE: ten creates, no ring, no hook
    assert rings(conn, endpoint) == [] and deliveries(conn, endpoint) == []
    sweep: Any = SingleConnection(conn)
    assert doorbells.reopen(sweep, now=T0 + timedelta(hours=1)) == 0
    # The window rolls: exactly one todo_ready, however often the sweep runs after it.
    for _ in range(3):
        doorbells.reopen(sweep, now=NEXT_NY_MIDNIGHT)
    # Eleven claimable: the ten, and the first claim, whose lease lapsed overnight.
    assert rings(conn, endpoint) == [("q", 11, "reopen")]
    assert len(deliveries(conn, endpoint)) == 1


def test_a_refused_claim_next_waits_and_the_freed_slot_rings_at_once(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    budget(conn, endpoint, owner, max_in_flight=1)
    add(conn, endpoint, n=3)
    dispatch(conn)
    first = claim_next(conn, endpoint)
    assert isinstance(first, Claimed)
    idle = claim_next(conn, endpoint)
    assert isinstance(idle, Idle) and idle.deferred[0].reason == admission.IN_FLIGHT_FULL
    before = len(rings(conn, endpoint))
    claim = first.claim.todo
    service.complete(
        conn, id=claim.id, endpoint_id=endpoint.id, attempt=claim.attempt,
        actor=Actor(endpoint_id=endpoint.id), now=T0,
    )  # fmt: skip
    # Inline in complete's transaction: no dispatch, no tick.
    assert rings(conn, endpoint)[before:] == [("q", 2, "reopen")]
    assert doorbells.reopen(SingleConnection(conn), now=T0) == 0  # type: ignore[arg-type]


def test_a_refused_claim_by_id_waits_too(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    budget(conn, endpoint, owner, max_in_flight=1)
    first, second = add(conn, endpoint, n=2)
    agent = Actor(endpoint_id=endpoint.id)
    db: Any = SingleConnection(conn)
    held = service.claim(db, id=first.id, endpoint_id=endpoint.id, granted_queues=None,
                         actor=agent, now=T0)  # fmt: skip
    with pytest.raises(Deferred):
        service.claim(db, id=second.id, endpoint_id=endpoint.id, granted_queues=None,
                      actor=agent, now=T0)  # fmt: skip
    assert [g.queue for g in store.gates_deferred(conn)] == ["q"]
    todo = held.claim.todo
    service.complete(conn, id=todo.id, endpoint_id=endpoint.id, attempt=todo.attempt,
                     actor=agent, now=T0)  # fmt: skip
    assert rings(conn, endpoint)[-1] == ("q", 1, "reopen")


def test_release_rings_once_and_a_raised_limit_reopens_inline(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    budget(conn, endpoint, owner, max_claims_per_window=1, window=NY_DAY)
    add(conn, endpoint, n=2)
    claimed = claim_next(conn, endpoint)
    assert isinstance(claimed, Claimed)
    assert isinstance(claim_next(conn, endpoint), Idle)  # exhausted: the caller now waits
    conn.execute("DELETE FROM todo_ready_rings; DELETE FROM todo_ready_outbox")
    todo = claimed.claim.todo
    service.release(
        conn, id=todo.id, endpoint_id=endpoint.id, attempt=todo.attempt,
        actor=Actor(endpoint_id=endpoint.id), now=T0,
    )  # fmt: skip
    assert dispatch(conn).gated == 1 and rings(conn, endpoint) == []  # still exhausted
    budget(conn, endpoint, owner, max_claims_per_window=5, window=NY_DAY)
    doorbells.policy_written(conn, endpoint_id=endpoint.id, queue="q", now=T0)
    assert rings(conn, endpoint) == [("q", 2, "reopen")]  # in the write's transaction
    doorbells.policy_written(conn, endpoint_id=endpoint.id, queue="q", now=T0)
    assert len(rings(conn, endpoint)) == 1  # that reopening has rung


def test_the_heartbeat_sweep_rings_lapses_and_long_unclaimed_work(
    conn: Connection[Any], endpoint: Endpoint
) -> None:
    (todo,) = add(conn, endpoint)
    dispatch(conn)
    conn.execute(
        "UPDATE todos SET state = 'claimed', attempt = 1, lease_expires_at = %s WHERE id = %s",
        (T0 + timedelta(seconds=10), todo.id),
    )
    later = T0 + timedelta(seconds=20)
    sweep = SingleConnection(conn)
    owed = doorbells.heartbeat(
        sweep,  # type: ignore[arg-type]
        now=later, lapsed_since=timedelta(seconds=60), repeat=timedelta(minutes=5),
    )  # fmt: skip
    assert owed == 1 and dispatch(conn, later).rung == 1
    assert rings(conn, endpoint)[-1] == ("q", 1, "lapse")
    conn.execute("UPDATE todos SET state = 'pending', lease_expires_at = NULL")
    quiet = doorbells.heartbeat(
        sweep,  # type: ignore[arg-type]
        now=later + timedelta(minutes=1), lapsed_since=timedelta(seconds=60),
        repeat=timedelta(minutes=5),
    )  # fmt: skip
    assert quiet == 0  # rung a minute ago
    owed = doorbells.heartbeat(
        sweep,  # type: ignore[arg-type]
        now=later + timedelta(minutes=6), lapsed_since=timedelta(seconds=60),
        repeat=timedelta(minutes=5),
    )  # fmt: skip
    assert owed == 1


# --- concurrency: one reopening, one ring, however many processes -------------------------------


def test_racing_reopen_sweeps_ring_exactly_once(clone_db: str) -> None:
    with psycopg.connect(clone_db) as conn:
        owner = make_human(conn)
        endpoint = make_endpoint(conn, owner)
        budget(conn, endpoint, owner, max_claims_per_window=1, window=NY_DAY)
        add(conn, endpoint, n=5)
        conn.execute(
            "INSERT INTO admission_windows (policy_id, window_start, used)"
            " SELECT id, %s, 1 FROM admission_policies",
            (NEXT_NY_MIDNIGHT - timedelta(days=1),),
        )
        assert dispatch(conn).gated == 1
    db = Database(clone_db, max_size=12)
    db.open()
    barrier = threading.Barrier(8)
    counts: list[int] = []

    def sweep() -> None:
        barrier.wait()
        counts.append(doorbells.reopen(db, now=NEXT_NY_MIDNIGHT))

    try:
        threads = [threading.Thread(target=sweep) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        db.close()
    assert sum(counts) == 1
    with psycopg.connect(clone_db) as conn:
        assert rings(conn, endpoint) == [("q", 5, "reopen")]


# --- notify-hook deliveries ----------------------------------------------------------------------


class Receiver:
    """A stand-in poster that records requests and fails the first ``failures`` of them."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.calls: list[tuple[str, bytes, dict[str, str]]] = []

    def __call__(self, url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
        self.calls.append((url, body, headers))
        if len(self.calls) <= self.failures:
            raise OSError("connection refused")


def test_a_failing_hook_is_retried_with_backoff_then_given_up(
    conn: Connection[Any], endpoint: Endpoint
) -> None:
    with_hook(conn, endpoint)
    add(conn, endpoint)
    dispatch(conn)
    db: Any = SingleConnection(conn)
    receiver = Receiver(failures=100)
    at = T0
    assert doorbells.deliver_due(db, now=at, poster=receiver).retried == 1
    assert doorbells.deliver_due(db, now=at + timedelta(seconds=1), poster=receiver).retried == 0
    for backoff in doorbells.HOOK_BACKOFF:
        at += backoff
        result = doorbells.deliver_due(db, now=at, poster=receiver)
        assert result.retried + result.given_up == 1
    (delivery,) = deliveries(conn, endpoint)
    assert delivery.status == "given_up" and delivery.attempts == doorbells.HOOK_ATTEMPTS
    assert delivery.last_error == "OSError: connection refused"
    assert len(receiver.calls) == doorbells.HOOK_ATTEMPTS
    assert doorbells.deliver_due(db, now=at + timedelta(days=1), poster=receiver).given_up == 0


def test_a_hook_that_recovers_is_delivered_once_and_signed(
    conn: Connection[Any], endpoint: Endpoint
) -> None:
    with_hook(conn, endpoint)
    add(conn, endpoint)
    dispatch(conn)
    db: Any = SingleConnection(conn)
    receiver = Receiver(failures=1)
    doorbells.deliver_due(db, now=T0, poster=receiver)
    assert doorbells.deliver_due(db, now=T0 + timedelta(minutes=1), poster=receiver).delivered == 1
    (delivery,) = deliveries(conn, endpoint)
    assert delivery.status == "delivered"
    _, body, headers = receiver.calls[-1]
    expected = hmac.new(endpoint.notify_secret.encode(), body, hashlib.sha256).hexdigest()
    assert headers[doorbells.SIGNATURE_HEADER] == f"sha256={expected}"


def test_signature_helper_matches_the_documented_recipe() -> None:
    body = b'{"event":"todo_ready"}'
    digest = hmac.new(b"secret", body, hashlib.sha256).hexdigest()
    assert doorbells.sign("secret", body) == "sha256=" + digest
