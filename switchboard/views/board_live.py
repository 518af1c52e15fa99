"""Live queue pages (SPEC §8): one poller thread per process, one statement per second.

Each open live page (an SSE stream) watches one (endpoint, queue). The poller reads the
version of every watched queue in one statement (``store.board.queue_versions``: last event,
in-flight, policy and window counter, last doorbell) and wakes the streams whose version
changed; each stream then re-renders its header and cards. No NOTIFY on the claim path: a
NOTIFY serialises commits, and a board is fine a second behind.

Streams per process are bounded so they never take every thread from the claim path; one more
gets 503 with Retry-After and the browser's EventSource retries.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any
from uuid import UUID

import psycopg

from switchboard.db import Database
from switchboard.mcp.streams import _at_thread_exit
from switchboard.store import board as store

log = logging.getLogger(__name__)

Key = tuple[UUID, str]
POLL_SECONDS = 1.0
KEEP_ALIVE = b": keep-alive\n\n"
HANGUP_POLL_SECONDS = 1.0


class Busy(Exception):
    """Every live-page slot of this process is taken."""


class Watcher:
    """One open live page: its queue and the event the poller sets when that queue changed."""

    def __init__(self, key: Key) -> None:
        self.key = key
        self.changed = threading.Event()


class BoardLive:
    """The live pages of one process and their poller."""

    def __init__(self, db: Database, *, limit: int, poll_seconds: float = POLL_SECONDS) -> None:
        self.db = db
        self.limit = limit
        self.poll_seconds = poll_seconds
        self._slots = threading.BoundedSemaphore(max(limit, 1))
        self._lock = threading.Lock()
        self._watchers: dict[Key, set[Watcher]] = {}
        self._versions: dict[Key, Any] = {}
        self._thread: threading.Thread | None = None
        self.closing = threading.Event()
        # At interpreter exit (a gunicorn worker's), before the thread pool is joined: end the
        # live pages now. A weak reference, so an app dropped by tests is not kept alive.
        this = weakref.ref(self)

        def close_at_exit() -> None:
            live = this()
            if live is not None:
                live.close()

        _at_thread_exit(close_at_exit)

    def close(self) -> None:
        """End every live page of this process (at worker exit) and the poller."""
        self.closing.set()
        with self._lock:
            watchers = [w for ws in self._watchers.values() for w in ws]
        for watcher in watchers:
            watcher.changed.set()

    def watch(self, key: Key) -> Watcher:
        """Register a live page; raises Busy when the process's slots are all taken."""
        if self.closing.is_set() or self.limit <= 0 or not self._slots.acquire(False):
            raise Busy(f"this worker already serves {self.limit} live pages")
        watcher = Watcher(key)
        with self._lock:
            self._watchers.setdefault(key, set()).add(watcher)
            if self._thread is None:
                self._thread = threading.Thread(target=self._poll, name="board-live", daemon=True)
                self._thread.start()
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        with self._lock:
            watchers = self._watchers.get(watcher.key)
            if watchers is not None and watcher in watchers:
                watchers.discard(watcher)
                self._slots.release()
                if not watchers:
                    del self._watchers[watcher.key]
                    self._versions.pop(watcher.key, None)

    def poll_once(self) -> int:
        """Read every watched queue's version once; wake the pages of those that changed.
        Returns how many queues changed."""
        with self._lock:
            keys = sorted(self._watchers)
        if not keys:
            return 0
        with self.db.transaction() as conn:
            versions = store.queue_versions(conn, keys=keys)
        changed = 0
        with self._lock:
            for version in versions:
                key = (version.endpoint_id, version.queue)
                if key in self._watchers and self._versions.get(key) != version:
                    self._versions[key] = version
                    changed += 1
                    for watcher in self._watchers[key]:
                        watcher.changed.set()
        return changed

    def _poll(self) -> None:
        while not self.closing.wait(self.poll_seconds):
            try:
                self.poll_once()
            except psycopg.Error as exc:  # the database is away: try again next second
                log.warning("board live poll failed: %s", exc)


def sse(event: str, html: str) -> bytes:
    """One SSE event whose data is an HTML fragment (one ``data:`` line per line)."""
    lines = "".join(f"data: {line}\n" for line in html.splitlines() or [""])
    return f"event: {event}\n{lines}\n".encode()


def stream(
    live: BoardLive,
    watcher: Watcher,
    *,
    render: Callable[[], tuple[bytes, float | None] | None],
    gone: Callable[[], bool],
    keepalive: float,
) -> Iterator[bytes]:
    """A live page's body: the rendering now, then a fresh one whenever the queue changed or
    its derived status is due to change on its own (``render`` returns the bytes and the
    epoch second of that moment, e.g. a window reset, or None to end), keep-alives in between."""
    try:
        rendered = render()
        if rendered is None:
            return
        body, due = rendered
        yield body
        while True:
            quiet_until = time.monotonic() + keepalive
            while not watcher.changed.is_set() and (due is None or time.time() < due):
                if time.monotonic() >= quiet_until:
                    break
                until_due = HANGUP_POLL_SECONDS if due is None else due - time.time()
                watcher.changed.wait(max(0.0, min(HANGUP_POLL_SECONDS, until_due)))
                if gone():
                    return
            if live.closing.is_set():
                return
            if watcher.changed.is_set() or (due is not None and time.time() >= due):
                watcher.changed.clear()
                rendered = render()
                if rendered is None:
                    return
                body, due = rendered
                yield body
            else:
                yield KEEP_ALIVE
    finally:
        live.unwatch(watcher)
