"""MCP ``claim_next`` over HTTP through gunicorn (SPEC §10 R-PERF): claims/s, p50/p99 latency.

``python -m bench.mcp`` creates a throw-away database ``sb_benchmcp_<random>`` on the server
(``--database-url``, else $DATABASE_URL, else an embedded PostgreSQL in a temporary directory),
migrates it, makes one agent and seeds one queue of pending todos, starts ``switchboard serve``
(gunicorn, 2 workers x 8 threads by default) on a free loopback port, and then, for each era,
runs N client threads, each on its own persistent connection (``http.client``), calling
``tools/call claim_next`` as fast as the server answers:

- ``legacy``: one ``initialize``d session per client (2025-11-25), ``Mcp-Session-Id`` on each call;
- ``modern``: stateless 2026-07-28 requests (``_meta`` envelope and routing headers).

Beside them, the service's own ``claim_next`` on the same queue with the same number of
threads (no HTTP) is the reference. The figures are interleaved (reference, legacy, modern,
reference, legacy, modern, ...: ``--rounds``) so drift on this shared machine hits all alike;
each is the sum over its rounds. The first second of each measurement is warm-up and not
counted. While the server runs, the RSS of every gunicorn worker is sampled (peak per worker,
target <= 200 MiB) and the workers' CPU time per MCP claim is taken from /proc (psutil).
``bench.claim`` runs this inside ``make bench``. Exit status 1 if any call failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import requests

from bench.claim import bench_database, server
from bench.profile import MiB, PeakMemory, PostgresFootprint, cpu_seconds, postgres_footprint
from switchboard import db
from switchboard.models import Actor
from switchboard.services import accounts, todos

QUEUE = "bench"
WARMUP_SECONDS = 1.0
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
}


@dataclass(frozen=True)
class Options:
    database_url: str | None
    seconds: float
    clients: int
    pending: int
    workers: int
    threads: int
    eras: tuple[str, ...]
    rounds: int = 2


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp", description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or None)
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--clients", type=int, default=16, help="client threads")
    parser.add_argument("--pending", type=int, default=200_000, help="todos seeded")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers")
    parser.add_argument("--threads", type=int, default=8, help="threads per worker")
    parser.add_argument("--era", choices=("legacy", "modern", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 s, 20,000 todos")
    args = parser.parse_args(argv)
    eras = ("legacy", "modern") if args.era == "both" else (args.era,)
    if args.quick:
        args.seconds, args.pending, args.rounds = 2.0, 20_000, 1
    return Options(
        args.database_url,
        args.seconds,
        args.clients,
        args.pending,
        args.workers,
        args.threads,
        eras,
        args.rounds,
    )


# --- database and server ------------------------------------------------------------------


@dataclass(frozen=True)
class Seeded:
    token: str
    endpoint_id: Any


def seed(url: str, pending: int) -> Seeded:
    """One human, endpoint and drain grant; ``pending`` todos in one queue, oldest first."""
    with psycopg.connect(url) as conn:
        human = accounts.create_human(conn, data={"email": "bench@localhost"}).human
        endpoint = accounts.create_endpoint(conn, owner=human, data={"slug": "bench"})
        grant = accounts.create_grant(
            conn, endpoint=endpoint, granted_by=human, verbs=["claim_next"]
        )
        conn.execute("INSERT INTO queues (endpoint_id, name) VALUES (%s, %s)", (endpoint.id, QUEUE))
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title, created_at, updated_at)"
            " SELECT %(endpoint)s, %(queue)s, 'bench ' || g, at, at"
            " FROM generate_series(1, %(pending)s) g,"
            " LATERAL (SELECT timestamptz '2000-01-01' + g * interval '1 millisecond' AS at) t",
            {"endpoint": endpoint.id, "queue": QUEUE, "pending": pending},
        )
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE todos, queues")
    return Seeded(grant.token, endpoint.id)


def add_pending(url: str, seeded: Seeded, pending: int) -> None:
    """``pending`` more todos at the end of the seeded queue."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title)"
            " SELECT %s, %s, 'more ' || g FROM generate_series(1, %s) g",
            (seeded.endpoint_id, QUEUE, pending),
        )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve(url: str, options: Options) -> Iterator[tuple[str, int]]:
    """``switchboard serve`` on a free loopback port; yields the /mcp URL and the gunicorn
    master's pid (the workers are its children)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    with tempfile.TemporaryDirectory(prefix="sb-benchmcp-serve-") as tmp:
        env.update(
            DATABASE_URL=url,
            SWITCHBOARD_DATA_DIR=tmp,
            SWITCHBOARD_BIND=f"127.0.0.1:{port}",
            SWITCHBOARD_WORKERS=str(options.workers),
            SWITCHBOARD_THREADS=str(options.threads),
        )
        command = [str(Path(sys.executable).parent / "switchboard"), "serve"]
        with open(Path(tmp) / "serve.log", "w") as log:
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, process, Path(tmp) / "serve.log")
            yield base + "/mcp", process.pid
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=30)


def wait_ready(base: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"switchboard serve exited:\n{log.read_text()}")
        try:
            if requests.get(base + "/readyz", timeout=5).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise SystemExit(f"switchboard serve did not become ready:\n{log.read_text()}")


# --- measuring ----------------------------------------------------------------------------


@dataclass
class Tally:
    """What the clients saw after warm-up."""

    latencies: list[float] = field(default_factory=list)
    claims: int = 0
    idle: int = 0
    calls: int = 0  # every answered call, warm-up included (for CPU per call)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(
        self, latencies: list[float], claims: int, idle: int, errors: list[str], calls: int
    ) -> None:
        with self.lock:
            self.calls += calls
            self.latencies.extend(latencies)
            self.claims += claims
            self.idle += idle
            self.errors.extend(errors)


Caller = Callable[[], bool]  # one claim_next; True when it claimed, raises on failure


def measure(make_caller: Callable[[], Caller], clients: int, seconds: float) -> Tally:
    """Run ``clients`` threads calling as fast as answered for warm-up plus ``seconds``."""
    tally = Tally()
    start = time.monotonic() + 0.2
    counted_from, stop = start + WARMUP_SECONDS, start + WARMUP_SECONDS + seconds

    def client() -> None:
        caller = make_caller()
        latencies: list[float] = []
        claims = idle = calls = 0
        errors: list[str] = []
        while time.monotonic() < start:
            time.sleep(0.001)
        while (now := time.monotonic()) < stop:
            try:
                claimed = caller()
            except Exception as exc:  # a bench reports failures; it does not stop at one
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            calls += 1
            if now >= counted_from:
                latencies.append(time.monotonic() - now)
                claims += claimed
                idle += not claimed
        tally.add(latencies, claims, idle, errors[:5], calls)

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return tally


def rpc_caller(url: str, token: str, era: str) -> Callable[[], Caller]:
    """A factory of per-thread callers: each with its own persistent HTTP/1.1 connection
    (``http.client``: the lightest client, so the figure is the server's) and, for the
    legacy era, its own session."""
    parts = urlsplit(url)

    def make() -> Caller:
        http = HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=30)
        headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
        }
        params: dict[str, Any] = {"name": "claim_next", "arguments": {}}
        if era == "legacy":
            headers.update(initialize(url, headers))
        else:
            headers.update(
                {
                    "MCP-Protocol-Version": "2026-07-28",
                    "Mcp-Method": "tools/call",
                    "Mcp-Name": "claim_next",
                }
            )
            params["_meta"] = META
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params}
        ).encode()

        def call() -> bool:
            http.request("POST", parts.path, body, headers)
            response = http.getresponse()
            text = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {text[:200]!r}")
            result = json.loads(text)["result"]
            if result["isError"]:
                raise RuntimeError(json.dumps(result["structuredContent"]))
            return "todo" in result["structuredContent"]

        return call

    return make


def initialize(url: str, headers: dict[str, str]) -> dict[str, str]:
    """Start a legacy session; returns the headers every later request carries."""
    response = requests.post(
        url,
        json={
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "bench", "version": "1"},
            },
        },
        headers=headers,
        timeout=30,
    )
    response.raise_for_status()
    session = {
        "Mcp-Session-Id": response.headers["Mcp-Session-Id"],
        "MCP-Protocol-Version": "2025-11-25",
    }
    requests.post(
        url,
        json={"jsonrpc": "2.0", "method": "notifications/initialized"},
        headers={**headers, **session},
        timeout=30,
    ).raise_for_status()
    return session


def service_caller(url: str, seeded: Seeded, clients: int) -> tuple[Callable[[], Caller], Any]:
    """The reference: ``services.todos.claim_next`` on a pool, one connection per thread."""
    database = db.Database(url, min_size=clients, max_size=clients)
    database.open(wait=True)
    actor = Actor(endpoint_id=seeded.endpoint_id)

    def make() -> Caller:
        def call() -> bool:
            outcome = todos.claim_next(
                database,
                endpoint_id=seeded.endpoint_id,
                granted_queues=None,
                asked_queues=None,
                actor=actor,
            )
            return isinstance(outcome, todos.Claimed)

        return call

    return make, database


# --- the interleaved run ---------------------------------------------------------------------


@dataclass
class Figure:
    """One figure summed over its rounds."""

    label: str
    tallies: list[Tally] = field(default_factory=list)
    seconds: float = 0.0
    server_cpu: float | None = None  # gunicorn workers' CPU seconds during its rounds

    @property
    def claims(self) -> int:
        return sum(t.claims for t in self.tallies)

    @property
    def rate(self) -> float:
        return self.claims / self.seconds if self.seconds else 0.0

    @property
    def latencies(self) -> list[float]:
        return sorted(x for t in self.tallies for x in t.latencies)

    def percentile(self, q: float) -> float:
        """Latency in ms (q = 0.5: the median)."""
        ordered = self.latencies
        if not ordered:
            return float("nan")
        if q == 0.5:
            return statistics.median(ordered) * 1000
        return ordered[int(q * (len(ordered) - 1))] * 1000

    @property
    def errors(self) -> list[str]:
        return [e for t in self.tallies for e in t.errors]

    @property
    def idle(self) -> int:
        return sum(t.idle for t in self.tallies)

    @property
    def cpu_per_claim_us(self) -> float | None:
        """Server CPU per call (warm-up calls included on both sides; every call claims)."""
        calls = sum(t.calls for t in self.tallies)
        if self.server_cpu is None or not calls:
            return None
        return self.server_cpu / calls * 1e6


@dataclass
class McpRun:
    options: Options
    seeded: Seeded
    figures: list[Figure]
    worker_peaks: dict[int, int]  # gunicorn worker pid -> peak RSS (bytes)
    postgres: PostgresFootprint | None

    @property
    def reference(self) -> Figure:
        return self.figures[0]


LABELS = {"legacy": "MCP legacy (session)", "modern": "MCP 2026-07-28 (stateless)"}


def run(url: str, options: Options) -> McpRun:
    """Seed, serve, and measure the reference and each era, interleaved round by round."""
    seeded = seed(url, options.pending)
    reference = Figure("service claim_next (ref)")
    eras = {era: Figure(LABELS[era]) for era in options.eras}
    make_ref, database = service_caller(url, seeded, options.clients)
    try:
        with serve(url, options) as (mcp_url, master):
            sampler = PeakMemory(master)
            sampler.start()
            try:
                for _ in range(options.rounds):
                    reference.tallies.append(measure(make_ref, options.clients, options.seconds))
                    reference.seconds += options.seconds
                    for era, figure in eras.items():
                        before = cpu_seconds(master)
                        caller = rpc_caller(mcp_url, seeded.token, era)
                        figure.tallies.append(measure(caller, options.clients, options.seconds))
                        figure.seconds += options.seconds
                        spent = cpu_seconds(master) - before
                        figure.server_cpu = (figure.server_cpu or 0.0) + spent
                postgres = postgres_footprint(url)  # its backends still open, after the load
            finally:
                sampler.stop.set()
                sampler.join(timeout=5)
            peaks = {pid: rss for pid, rss in sampler.peaks.items() if pid != master}
    finally:
        database.close()
    return McpRun(options, seeded, [reference, *eras.values()], peaks, postgres)


# --- report -------------------------------------------------------------------------------


def line(figure: Figure, reference: float | None) -> str:
    ratio = f"{figure.rate / reference:5.2f}x" if reference else "  ref"
    cpu = figure.cpu_per_claim_us
    return (
        f"{figure.label:<26} {figure.rate:9.0f} {figure.percentile(0.5):9.2f} "
        f"{figure.percentile(0.99):9.2f} {ratio:>8} {len(figure.errors):>7} {figure.idle:>6}"
        f" {f'{cpu:,.0f}' if cpu is not None else '':>10}"
    )


def print_run(result: McpRun) -> None:
    options = result.options
    print(
        f"MCP claim_next: {options.pending:,} pending todos in one queue, "
        f"{options.clients} client threads, {options.rounds} interleaved rounds of "
        f"{options.seconds:g} s per figure (+{WARMUP_SECONDS:g} s warm-up each); gunicorn "
        f"{options.workers} workers x {options.threads} threads (gthread), same machine as "
        "PostgreSQL."
    )
    print(
        f"{'figure':<26} {'claims/s':>9} {'p50 ms':>9} {'p99 ms':>9} {'vs ref':>8} "
        f"{'errors':>7} {'idle':>6} {'srv us/cl':>10}"
    )
    for figure in result.figures:
        print(line(figure, None if figure is result.reference else result.reference.rate))
        for error in figure.errors[:3]:
            print(f"  error: {error}")
    peaks = ", ".join(f"{rss / MiB:,.0f}" for rss in sorted(result.worker_peaks.values()))
    print(f"peak RSS per gunicorn worker (MiB): {peaks or 'not sampled'}")
    if result.postgres is not None:
        print(f"PostgreSQL after the load: {result.postgres.describe()}")


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    with server(options.database_url) as admin, bench_database(admin) as url:
        result = run(url, options)
    print_run(result)
    return 1 if any(f.errors for f in result.figures) else 0


if __name__ == "__main__":
    sys.exit(main())
