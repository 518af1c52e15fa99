"""Server→client SSE streams: the legacy GET stream of a session and ``subscriptions/listen``.

A stream holds a worker thread but no database connection while it waits: every keep-alive
interval it borrows a connection for one short transaction that checks it may go on and
collects the doorbells due to it (its :class:`Feed`; a ring elsewhere wakes it at once). Streams
per worker are bounded, so they can never take every thread from the claim path; over the
bound a request gets 503. A stream ends when its session ends or its grant is revoked (within
one interval; at once when the session is deleted on this worker), or when the client goes,
and all of them at once when the worker process exits (so shutdown never waits on a stream).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import weakref
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
from psycopg import Connection

from switchboard.db import Database
from switchboard.mcp import resources
from switchboard.mcp.jsonrpc import INTERNAL_ERROR, RpcError
from switchboard.mcp.protocol import SUBSCRIPTION_ID_KEY
from switchboard.store import doorbells as doorbell_store

log = logging.getLogger(__name__)

KEEP_ALIVE = b": keep-alive\n\n"
OPENED = b": stream open\n\n"
RETRY_AFTER_SECONDS = 5
HANGUP_POLL_SECONDS = 1.0  # how often an idle stream looks whether its client hung up


@dataclass(frozen=True)
class Target:
    """Whom a stream serves: the grant, and the legacy session or the listen subscription."""

    grant_id: UUID
    endpoint_id: UUID
    session_id: UUID | None = None
    subscription_id: Any = None  # the listen request's JSON-RPC id (2026-07-28)

    @property
    def keys(self) -> tuple[Hashable, ...]:
        """What can wake the stream early (see ``Streams.wake``)."""
        keys: list[Hashable] = [("grant", self.grant_id), ("endpoint", self.endpoint_id)]
        if self.session_id is not None:
            keys.append(("session", self.session_id))
        return tuple(keys)


def _never() -> bool:
    return False


def _at_thread_exit(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the interpreter starts to exit, before non-daemon threads (the
    WSGI server's pool) are joined; ``threading._register_atexit`` is the hook
    ``concurrent.futures`` itself uses, and ours, registered later, runs first."""
    register: Callable[[Callable[[], None]], None] = getattr(threading, "_register_atexit")  # noqa: B009
    register(callback)


class Feed:
    """The doorbells of one stream (R-BELL): rings of its endpoint after it opened, as
    ``notifications/resources/updated`` for the URIs it subscribed to. Its presence row says the
    endpoint has an agent attached; it is touched while the stream lives and removed after."""

    OVERLAP = timedelta(seconds=5)  # ring ids may commit out of order: read a little back

    def __init__(
        self,
        *,
        endpoint_id: UUID,
        presence_id: UUID,
        opened_at: datetime,
        subscribed: Callable[[Connection[Any]], list[str]],
        touch_every: timedelta,
    ) -> None:
        self.endpoint_id = endpoint_id
        self.presence_id = presence_id
        self.subscribed = subscribed
        self.touch_every = touch_every
        self._since = opened_at
        self._touched = time.monotonic()
        self._seen: dict[int, datetime] = {}
        self._detached = threading.Event()

    def due(self, conn: Connection[Any]) -> list[dict[str, Any]]:
        """The notifications of rings not yet delivered (and keep presence fresh)."""
        if time.monotonic() - self._touched >= self.touch_every.total_seconds():
            doorbell_store.stream_touch(conn, id=self.presence_id)
            self._touched = time.monotonic()
        rings = doorbell_store.rings_since(
            conn, endpoint_id=self.endpoint_id, since=self._since - self.OVERLAP
        )
        fresh = [ring for ring in rings if ring.id not in self._seen]
        if not fresh:
            return []
        for ring in fresh:
            self._seen[ring.id] = ring.rung_at
        self._since = max(self._since, *(ring.rung_at for ring in fresh))
        horizon = self._since - self.OVERLAP
        self._seen = {id: at for id, at in self._seen.items() if at > horizon}
        return resources.notifications(fresh, self.subscribed(conn))

    def detach(self, db: Database) -> None:
        """Remove the presence row, once (best effort: the prune sweep forgets a dead
        process's)."""
        if self._detached.is_set():
            return
        self._detached.set()
        try:
            with db.transaction() as conn:
                doorbell_store.stream_close(conn, id=self.presence_id)
        except psycopg.Error as exc:
            log.warning("could not remove a stream's presence row: %s", exc)


def frame(message: dict[str, Any]) -> bytes:
    """One SSE event carrying a JSON-RPC message."""
    data = json.dumps(message, separators=(",", ":"), ensure_ascii=False)
    return f"event: message\ndata: {data}\n\n".encode()


def _stamp(notification: dict[str, Any], target: Target) -> dict[str, Any]:
    """A listen stream's notifications carry its subscription id in ``params._meta``."""
    if target.subscription_id is None:
        return notification
    params = dict(notification.get("params") or {})
    params["_meta"] = {**params.get("_meta", {}), SUBSCRIPTION_ID_KEY: target.subscription_id}
    return {**notification, "params": params}


class _Slot:
    """One of a worker's stream slots; released once, however many times it is asked to."""

    def __init__(self, semaphore: threading.BoundedSemaphore) -> None:
        self._semaphore = semaphore
        self._lock = threading.Lock()
        self._held = True

    def release(self) -> None:
        with self._lock:
            if self._held:
                self._held = False
                self._semaphore.release()


@dataclass
class Stream:
    """An open stream: the bytes to send and what to call when the response closes."""

    body: Iterator[bytes]
    on_close: Callable[[], None]


class Streams:
    """The streams of one worker process: their slots and their wake-up events."""

    def __init__(self, db: Database, *, keepalive: float, limit: int) -> None:
        self.db = db
        self.keepalive = keepalive
        self.limit = limit
        self._semaphore = threading.BoundedSemaphore(max(limit, 1))
        self._lock = threading.Lock()
        self._waiting: dict[Hashable, set[threading.Event]] = {}
        self._closing = threading.Event()
        # At interpreter exit, before the thread pool joins its threads (gunicorn's worker
        # exit): end every stream now rather than after its client or session goes away.
        this = weakref.ref(self)

        def close_at_exit() -> None:
            streams = this()
            if streams is not None:
                streams.close()

        _at_thread_exit(close_at_exit)

    def close(self) -> None:
        """End every open stream of this worker (sending its tail) and refuse new ones."""
        self._closing.set()
        with self._lock:
            events = [event for waiting in self._waiting.values() for event in waiting]
        for event in events:
            event.set()

    def open(
        self,
        target: Target,
        *,
        live: Callable[[Connection[Any]], bool],
        head: list[dict[str, Any]] | None = None,
        tail: dict[str, Any] | None = None,
        gone: Callable[[], bool] | None = None,
        feed: Feed | None = None,
    ) -> Stream:
        """Open a stream: ``head`` first, then notifications and keep-alives while ``live``
        says so, then ``tail``. ``gone`` (cheap, no I/O wait) tells that the client hung up,
        so its slot comes back within a second instead of at the next failed write.
        Raises RpcError (503, Retry-After) when the worker's streams are all taken."""
        if self._closing.is_set() or self.limit <= 0 or not self._semaphore.acquire(False):
            if feed is not None:
                feed.detach(self.db)
            raise RpcError(
                INTERNAL_ERROR,
                f"Service Unavailable: this worker already holds {self.limit} open streams; "
                "retry later",
                status=503,
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
        slot = _Slot(self._semaphore)
        body = self._run(
            target, live=live, head=head or [], tail=tail, slot=slot, gone=gone or _never, feed=feed
        )

        def on_close() -> None:
            slot.release()
            if feed is not None:
                feed.detach(self.db)

        return Stream(body=body, on_close=on_close)

    def wake(self, key: Hashable) -> None:
        """Make this worker's streams registered under ``key`` check their state now."""
        with self._lock:
            events = list(self._waiting.get(key, ()))
        for event in events:
            event.set()

    def _run(
        self,
        target: Target,
        *,
        live: Callable[[Connection[Any]], bool],
        head: list[dict[str, Any]],
        tail: dict[str, Any] | None,
        slot: _Slot,
        gone: Callable[[], bool],
        feed: Feed | None,
    ) -> Iterator[bytes]:
        event = threading.Event()
        self._register(target.keys, event)
        try:
            yield b"".join(frame(message) for message in head) if head else OPENED
            while True:
                if not self._idle(event, gone):
                    return  # the client hung up: nobody to tell
                due = None if self._closing.is_set() else self._check(live, feed)
                if due is None:
                    if tail is not None:
                        yield frame(tail)
                    return
                yield b"".join(frame(_stamp(m, target)) for m in due) if due else KEEP_ALIVE
        finally:
            self._unregister(target.keys, event)
            slot.release()
            if feed is not None:
                feed.detach(self.db)

    def _idle(self, event: threading.Event, gone: Callable[[], bool]) -> bool:
        """Wait one keep-alive interval, or less if woken; False when the client hung up."""
        deadline = time.monotonic() + self.keepalive
        while (left := deadline - time.monotonic()) > 0:
            if event.wait(min(left, HANGUP_POLL_SECONDS)):
                break
            if gone():
                return False
        event.clear()
        return True

    def _check(
        self, live: Callable[[Connection[Any]], bool], feed: Feed | None
    ) -> list[dict[str, Any]] | None:
        """The notifications due now, or None when the stream must end."""
        try:
            with self.db.transaction() as conn:
                if not live(conn):
                    return None
                return feed.due(conn) if feed is not None else []
        except psycopg.OperationalError as exc:
            # The database is gone (restart, pool timeout): end the stream; clients reconnect.
            log.warning("ending an MCP stream: database unavailable: %s", exc)
            return None

    def _register(self, keys: tuple[Hashable, ...], event: threading.Event) -> None:
        with self._lock:
            for key in keys:
                self._waiting.setdefault(key, set()).add(event)

    def _unregister(self, keys: tuple[Hashable, ...], event: threading.Event) -> None:
        with self._lock:
            for key in keys:
                waiting = self._waiting.get(key)
                if waiting is not None:
                    waiting.discard(event)
                    if not waiting:
                        del self._waiting[key]
