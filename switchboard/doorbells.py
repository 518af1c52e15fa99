"""Doorbells (SPEC §7 R-BELL, R-GATE, R-REOPEN): no push for work that can't be claimed, exactly
one push when it can.

A change that makes work claimable owes a ring in its own transaction (``owe``: the
``todo_ready_outbox``, one row per queue, so bursts coalesce). ``dispatch`` pays what is owed:
it gates each queue on admission (a deferred queue is not rung; its gate remembers that
somebody waits), rings open ones (a ``todo_ready_rings`` row; NOTIFY wakes every process's
streams) and, when no agent of the endpoint is attached, queues a signed POST to its
``notify_url``. ``reopen`` rings a budgeted queue once when it opens again. Every function is
a run-once that takes ``now``; the per-process :class:`Bell` and the scheduler call them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg import Connection

from switchboard.admission import service as admission
from switchboard.db import Database
from switchboard.models import Todo
from switchboard.store import admission as admission_store
from switchboard.store import doorbells as store

log = logging.getLogger(__name__)

COALESCE = timedelta(milliseconds=500)  # at most one ring per queue per interval
PENDING_CAP = 10_000  # a ring's pending count is exact up to this many per state
TAKE_BATCH = 100
HOOK_TIMEOUT_SECONDS = 5.0
HOOK_BACKOFF = (timedelta(seconds=5), timedelta(seconds=30), timedelta(minutes=2),
                timedelta(minutes=10), timedelta(minutes=30))  # fmt: skip
HOOK_ATTEMPTS = len(HOOK_BACKOFF) + 1  # then given up
HOOK_LEASE = timedelta(seconds=HOOK_TIMEOUT_SECONDS * 6)
SIGNATURE_HEADER = "X-Switchboard-Signature"
BELL_CHANNEL = "switchboard_bell"
RING_CHANNEL = "switchboard_ring"
URI_PREFIX = "switchboard://queues/"

# An agent is attached while its stream's presence row was seen this recently. Streams touch
# it every keep-alive interval; ``configure`` sets it from the process's configuration.
_attached_window = timedelta(seconds=35)


def configure(*, keepalive_seconds: float) -> None:
    """Set the presence window from the stream keep-alive: two intervals and some slack."""
    global _attached_window
    _attached_window = timedelta(seconds=2 * keepalive_seconds + 5)


def attached_window() -> timedelta:
    return _attached_window


def queue_uri(endpoint: str, queue: str | None = None) -> str:
    """The MCP resource of a queue (or, without one, of all the endpoint's queues)."""
    return f"{URI_PREFIX}{endpoint}" if queue is None else f"{URI_PREFIX}{endpoint}/{queue}"


def sign(secret: str, body: bytes) -> str:
    """The signature header's value: ``sha256=`` and the hex HMAC-SHA256 of the raw body."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# --- owing ---------------------------------------------------------------------------------------


def owe(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    queue: str,
    cause: str,
    now: datetime | None = None,
) -> None:
    """In the caller's transaction: the queue has new claimable work; a ring is owed."""
    store.request_ring(conn, endpoint_id=endpoint_id, queue=queue, cause=cause, now=now)


# --- paying: dispatch ----------------------------------------------------------------------------


@dataclass
class Dispatched:
    rung: int = 0
    gated: int = 0  # deferred queues: not rung, their gate marked (R-GATE)
    idle: int = 0  # nothing claimable any more
    held: int = 0  # owed but rung within the coalescing interval: paid later


def dispatch(db: Database, *, now: datetime | None = None) -> Dispatched:
    """Pay every owed ring that is due; returns what happened to them."""
    result = Dispatched()
    while True:
        at = now or datetime.now(UTC)
        with db.transaction() as conn:
            owed = store.take_due(conn, now=at, interval=COALESCE, limit=TAKE_BATCH)
            for item in owed:
                outcome = _ring_if_open(conn, item.endpoint_id, item.queue, item.cause, at)
                setattr(result, outcome, getattr(result, outcome) + 1)
            if len(owed) < TAKE_BATCH:
                result.held = store.owed_count(conn)
                return result


def _ring_if_open(
    conn: Connection[Any],
    endpoint_id: UUID,
    queue: str,
    cause: str,
    now: datetime,
) -> str:
    states = admission_store.states(conn, endpoint_ids=[endpoint_id], queues=[queue], now=now)
    if states:
        verdict = admission.evaluate(states[0], for_claim=True)
        if verdict.deferred:
            store.gate_defer(
                conn, endpoint_id=endpoint_id, queue=queue, reason=verdict.reason or "", now=now
            )
            return "gated"
    if _ring(conn, endpoint_id, queue, cause, now) is None:
        return "idle"
    return "rung"


def _ring(
    conn: Connection[Any],
    endpoint_id: UUID,
    queue: str,
    cause: str,
    now: datetime,
) -> int | None:
    """Ring an open queue that has claimable work (and queue its hook POST when nobody is
    attached); None when there is nothing to claim."""
    pending = store.claimable_count(
        conn, endpoint_id=endpoint_id, queue=queue, now=now, cap=PENDING_CAP
    )
    if pending == 0:
        return None
    ring_id = store.ring(
        conn, endpoint_id=endpoint_id, queue=queue, pending=pending, cause=cause, now=now
    )
    hook = store.endpoint_hook(conn, endpoint_id=endpoint_id, attached_since=now - _attached_window)
    if hook.notify_url and not hook.attached:
        body = hook_body(hook.slug, queue, pending, cause, ring_id, now)
        store.enqueue_delivery(
            conn, endpoint_id=endpoint_id, ring_id=ring_id, url=hook.notify_url, body=body, now=now
        )
    return ring_id


def hook_body(slug: str, queue: str, pending: int, cause: str, ring_id: int, at: datetime) -> str:
    """The notify hook's JSON body (the exact text that is signed and POSTed)."""
    return json.dumps(
        {
            "event": "todo_ready",
            "endpoint": slug,
            "queue": queue,
            "pending": pending,
            "cause": cause,
            "resource": queue_uri(slug, queue),
            "ring_id": ring_id,
            "rung_at": at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        },
        separators=(",", ":"),
    )


# --- reopen (R-REOPEN) ---------------------------------------------------------------------------


def reopen(db: Database, *, now: datetime | None = None) -> int:
    """Ring each deferred budgeted queue that is claimable again, once; returns the rings."""
    at = now or datetime.now(UTC)
    with db.transaction() as conn:
        gates = store.gates_deferred(conn)
    rung = 0
    for gate in gates:
        with db.transaction() as conn:
            rung += _reopen_gate(conn, gate, at)
    return rung


def reopen_queue(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    queue: str,
    now: datetime | None = None,
) -> int:
    """Inline, in the caller's transaction (after complete, fail, release, a policy write):
    ring the queue if it was deferred and is open now. Costs one indexed probe otherwise."""
    at = now or datetime.now(UTC)
    gates = store.gates_deferred(conn, endpoint_id=endpoint_id, queue=queue)
    return sum(_reopen_gate(conn, gate, at) for gate in gates)


def waiting(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    deferred: Iterable[admission.DeferredQueue],
    now: datetime | None = None,
) -> None:
    """In an idle claim_next's transaction: its caller now waits for these deferred queues to
    open, so their gates must ring when they do (R-REOPEN)."""
    at = now or datetime.now(UTC)
    for item in deferred:
        store.gate_defer(
            conn, endpoint_id=endpoint_id, queue=item.queue, reason=item.reason, now=at
        )


def policy_written(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    queue: str,
    cleared: bool = False,
    now: datetime | None = None,
) -> None:
    """In the transaction of a policy write: a raised limit reopens at once; a cleared policy
    leaves the queue open, so waiting work is owed a ring."""
    if cleared:
        owe(conn, endpoint_id=endpoint_id, queue=queue, cause=store.REOPEN, now=now)
    else:
        reopen_queue(conn, endpoint_id=endpoint_id, queue=queue, now=now)


def after_finish(conn: Connection[Any], *, todo: Todo, now: datetime | None = None) -> None:
    """In the transaction of complete, fail or release: a freed slot reopens a deferred queue
    at once, and a released todo is new claimable work (rung once, not twice)."""
    reopened = reopen_queue(conn, endpoint_id=todo.endpoint_id, queue=todo.queue, now=now)
    if todo.state == "pending" and not reopened:
        owe(conn, endpoint_id=todo.endpoint_id, queue=todo.queue, cause=store.RELEASE, now=now)


def _reopen_gate(conn: Connection[Any], gate: store.Gate, now: datetime) -> int:
    states = admission_store.states(
        conn, endpoint_ids=[gate.endpoint_id], queues=[gate.queue], now=now
    )
    if not states:
        return 0
    verdict = admission.evaluate(states[0], for_claim=True)
    if verdict.deferred:
        return 0
    # Only the process that clears the gate (under its row lock) rings: one ring per reopening.
    if not store.gate_reopen(
        conn, policy_id=gate.policy_id, now=now, window_start=verdict.window_start
    ):
        return 0
    ring_id = _ring(conn, gate.endpoint_id, gate.queue, store.REOPEN, now)
    return 0 if ring_id is None else 1


# --- the heartbeat sweep -------------------------------------------------------------------------


def heartbeat(
    db: Database, *, now: datetime | None = None, lapsed_since: timedelta, repeat: timedelta
) -> int:
    """Owe rings for queues where a lease lapsed (a takeover is possible) and for queues whose
    waiting work went unclaimed and unrung for ``repeat``; returns the new debts."""
    at = now or datetime.now(UTC)
    with db.transaction() as conn:
        lapsed = store.lapsed_queues(conn, since=at - lapsed_since, now=at)
        owed = store.request_rings(conn, pairs=lapsed, cause=store.LAPSE, now=at)
        stale = store.unrung_queues(conn, before=at - repeat)
        owed += store.request_rings(conn, pairs=stale, cause=store.HEARTBEAT, now=at)
    return owed


def prune_presence(db: Database, *, now: datetime | None = None) -> int:
    """Forget presence rows of processes that died with streams open, and the gates of
    deleted policies; returns how many rows went."""
    at = now or datetime.now(UTC)
    with db.transaction() as conn:
        gone = store.streams_prune(conn, before=at - _attached_window * 4)
        return gone + store.gates_prune(conn)


# --- notify-hook delivery ------------------------------------------------------------------------


Poster = Callable[[str, bytes, dict[str, str], float], None]


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> None:
    """POST and raise unless the receiver answered 2xx."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read(1024)


@dataclass
class Delivered:
    delivered: int = 0
    retried: int = 0
    given_up: int = 0


def deliver_due(
    db: Database,
    *,
    now: datetime | None = None,
    poster: Poster = post,
    timeout: float = HOOK_TIMEOUT_SECONDS,
    limit: int = 100,
) -> Delivered:
    """POST due hook deliveries one by one (each leased first, so a crash retries it)."""
    result = Delivered()
    for _ in range(limit):
        at = now or datetime.now(UTC)
        with db.transaction() as conn:
            delivery = store.delivery_take(conn, now=at, lease=HOOK_LEASE)
        if delivery is None:
            break
        outcome = _attempt(db, delivery, at, poster, timeout)
        setattr(result, outcome, getattr(result, outcome) + 1)
    return result


def _attempt(
    db: Database, delivery: store.Delivery, now: datetime, poster: Poster, timeout: float
) -> str:
    body = delivery.body.encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "switchboard-doorbell",
        SIGNATURE_HEADER: sign(delivery.secret, body),
        "X-Switchboard-Delivery": str(delivery.id),
    }
    try:
        poster(delivery.url, body, headers, timeout)
    except (OSError, ValueError) as exc:  # URLError, HTTPError, timeouts, refused connections
        error = _describe(exc)
        with db.transaction() as conn:
            if delivery.attempts >= HOOK_ATTEMPTS:
                store.delivery_give_up(conn, id=delivery.id, now=now, error=error)
                return "given_up"
            backoff = HOOK_BACKOFF[delivery.attempts - 1]
            jitter = backoff * random.uniform(0, 0.2)
            store.delivery_retry(
                conn, id=delivery.id, next_attempt_at=now + backoff - jitter, error=error
            )
        return "retried"
    with db.transaction() as conn:
        store.delivery_done(conn, id=delivery.id, now=now)
    return "delivered"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError) or (
        isinstance(exc, urllib.error.URLError) and isinstance(exc.reason, TimeoutError)
    ):
        return "timed out"
    if isinstance(exc, urllib.error.HTTPError):
        return f"HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return f"unreachable: {exc.reason}"
    return f"{type(exc).__name__}: {exc}"[:500]


# --- the per-process bell ------------------------------------------------------------------------


class Bell:
    """Every serving process runs one: a thread LISTENing on its own connection. A
    ``switchboard_bell`` (an outbox row appeared) makes it dispatch at once; a
    ``switchboard_ring`` wakes this process's streams of that endpoint. Hook POSTs run on a
    small pool, each with its own timeout, so a dead hook delays nothing else."""

    POLL_SECONDS = 0.5  # also: how soon rings held back by coalescing are paid
    HOOK_POLL_SECONDS = 5.0

    def __init__(
        self,
        db: Database,
        *,
        wake: Callable[[Hashable], None],
        hook_workers: int = 4,
    ) -> None:
        self.db = db
        self.wake = wake
        self._held = 0
        self._hooks_due_at = 0.0
        self._stop = threading.Event()
        self._hooks = ThreadPoolExecutor(hook_workers, thread_name_prefix="notify-hook")
        self._hooks_busy = threading.Semaphore(hook_workers)
        self._thread = threading.Thread(target=self._run, name="doorbell", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._hooks.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        outage = False  # warn once per outage, not every retry
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.db.url, autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f"LISTEN {BELL_CHANNEL}")
                    conn.execute(f"LISTEN {RING_CHANNEL}")
                    if outage:
                        log.warning("doorbell listener: database reachable again")
                    outage = False
                    self._listen(conn)
            except psycopg.Error as exc:
                if not outage:
                    log.warning("doorbell listener: database unavailable: %s", exc)
                outage = True
                self._stop.wait(2.0)

    def _listen(self, conn: Connection[Any]) -> None:
        self._pay()  # whatever was owed while nobody listened
        while not self._stop.is_set():
            owed = rang = False
            # stop_after=1: act on a notification as it arrives (a larger batch would wait for
            # the timeout first); more that are queued come back at once on the next call.
            for note in conn.notifies(timeout=self.POLL_SECONDS, stop_after=1):
                if note.channel == RING_CHANNEL:
                    self._wake_endpoint(note.payload)
                    rang = True
                else:
                    owed = True
            if owed or self._held:
                self._pay()
            # Hooks: right after a ring (it may have queued one), else every few seconds for
            # the retries that came due.
            if rang or time.monotonic() >= self._hooks_due_at:
                self._hooks_due_at = time.monotonic() + self.HOOK_POLL_SECONDS
                self._post_hooks()

    def _pay(self) -> None:
        try:
            paid = dispatch(self.db)
        except psycopg.Error as exc:
            log.warning("doorbell dispatch failed: %s", exc)
            return
        self._held = paid.held

    def _wake_endpoint(self, payload: str) -> None:
        try:
            self.wake(("endpoint", UUID(payload)))
        except ValueError:
            log.warning("doorbell: ignoring a ring notification with payload %r", payload)

    def _post_hooks(self) -> None:
        """One delivery per free pool thread; each takes its own due row (SKIP LOCKED)."""
        while self._hooks_busy.acquire(blocking=False):
            self._hooks.submit(self._post_one)

    def _post_one(self) -> None:
        try:
            deliver_due(self.db, limit=1)
        except psycopg.Error as exc:
            log.warning("notify-hook delivery failed: %s", exc)
        finally:
            self._hooks_busy.release()
