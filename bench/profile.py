"""Python CPU per claim and where it goes (SPEC §10 R-PERF; issue 9), and the footprints.

``python -m bench.profile`` seeds a throw-away database (as ``bench.claim`` does) and prints, for
the store's ``claim_next`` without and with a policy and for MCP ``tools/call claim_next``
through the WSGI app in process: client CPU per claim (``time.process_time`` over N claims in
one thread, no profiler running) and the top costs by own CPU time under cProfile (timer:
``time.process_time``, so time blocked on PostgreSQL is not counted). ``bench.claim`` runs the
same functions inside ``make bench``.

cProfile (stdlib) rather than pyinstrument: the question is "which Python functions spend the
CPU of one claim", which a deterministic profiler with a CPU timer answers exactly over a few
thousand claims; a sampling profiler adds a dependency and answers in wall time.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]
import psycopg

MiB = 1024 * 1024


@dataclass(frozen=True)
class Cost:
    function: str  # file:line(name), shortened to the package path
    own_us: float  # own CPU per claim, microseconds
    share: float  # of the profiled CPU


@dataclass(frozen=True)
class Profile:
    label: str
    claims: int
    cpu_us: float  # client CPU per claim, no profiler
    wall_us: float  # wall time per claim (one thread)
    top: list[Cost]
    areas: list[tuple[str, float]]  # own CPU share by package, largest first
    phases: list[Cost]  # the project's functions by cumulative CPU: where a claim's CPU goes

    def summary(self, areas: int = 4) -> str:
        """The largest areas of own CPU, e.g. "psycopg 52%, switchboard 18%, ..."."""
        return ", ".join(f"{name} {share:.0%}" for name, share in self.areas[:areas])


def profile(label: str, claim: Callable[[], bool], claims: int, top: int = 8) -> Profile:
    """CPU per claim over ``claims`` claims (every call must claim), then the same number of
    claims under cProfile for the top costs."""
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(claims):
        if not claim():
            raise RuntimeError(f"{label}: nothing claimed")
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for _ in range(claims):
        claim()
    profiler.disable()
    return Profile(
        label,
        claims,
        cpu / claims * 1e6,
        wall / claims * 1e6,
        costs(profiler, claims, top),
        areas(profiler),
        phases(profiler, claims, top),
    )


def costs(profiler: cProfile.Profile, claims: int, top: int) -> list[Cost]:
    stats = pstats.Stats(profiler)
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in entries.values()) or 1.0
    ranked = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)[:top]
    return [Cost(_name(key), row[2] / claims * 1e6, row[2] / total) for key, row in ranked]


def phases(profiler: cProfile.Profile, claims: int, top: int) -> list[Cost]:
    """The project's own functions (switchboard/, app.py) by cumulative CPU per claim: the
    steps a claim goes through, each with everything it calls."""
    stats = pstats.Stats(profiler)
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in entries.values()) or 1.0
    ours = [
        (key, row)
        for key, row in entries.items()
        if _area(key[0]) == "switchboard" and not key[2].startswith("<")
    ]
    ranked = sorted(ours, key=lambda item: item[1][3], reverse=True)[:top]
    return [Cost(_name(key), row[3] / claims * 1e6, row[3] / total) for key, row in ranked]


def areas(profiler: cProfile.Profile) -> list[tuple[str, float]]:
    """Own CPU by package: the top directory under site-packages, "switchboard", "stdlib", or
    "builtins" (C functions: the caller's package is not known)."""
    stats = pstats.Stats(profiler)
    entries: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(row[2] for row in entries.values()) or 1.0
    shares: dict[str, float] = {}
    for (path, _, _), row in entries.items():
        shares[_area(path)] = shares.get(_area(path), 0.0) + row[2] / total
    return sorted(shares.items(), key=lambda item: item[1], reverse=True)


def _area(path: str) -> str:
    if path == "~":
        return "builtins"
    if "site-packages/" in path:
        return path.split("site-packages/", 1)[1].split("/", 1)[0].removesuffix(".py")
    if "/switchboard/" in path or path.endswith("app.py"):
        return "switchboard"
    if "/bench/" in path:
        return "bench"
    return "stdlib"


def _name(key: tuple[str, int, str]) -> str:
    path, line, name = key
    if path == "~":
        return name  # a builtin or C function: "<method 'execute' of ...>"
    for marker in ("site-packages/", "lib/python3", "/switchboard/", "/bench/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{line}({name})"


def print_profile(result: Profile) -> None:
    print(
        f"  {result.label}: {result.cpu_us:,.0f} us client CPU per claim "
        f"({result.wall_us:,.0f} us wall, one thread, {result.claims:,} claims); "
        f"own CPU by package: {result.summary(6)}; top functions by own CPU:"
    )
    # Shares are of the profiled CPU; "~us" scales them to the unprofiled CPU per claim (the
    # profiler's own overhead roughly doubles the absolute figures).
    for cost in result.top:
        print(f"    {cost.share:6.1%} ~{cost.share * result.cpu_us:6.0f} us  {cost.function}")
    print("    the project's functions by cumulative CPU (each with what it calls):")
    for cost in result.phases:
        print(f"    {cost.share:6.1%} ~{cost.share * result.cpu_us:6.0f} us  {cost.function}")


# --- MCP in process ---------------------------------------------------------------------------


@contextmanager
def mcp_app(url: str) -> Iterator[Any]:
    """The real app on ``url`` (no scheduler); yields its Flask test client."""
    from app import create_app
    from switchboard import config, extensions

    with tempfile.TemporaryDirectory(prefix="sb-bench-profile-") as tmp:
        app = create_app(
            {
                "config": config.load(
                    {
                        "DATABASE_URL": url,
                        "SWITCHBOARD_DATA_DIR": tmp,
                        "SWITCHBOARD_SCHEDULER": "off",
                    }
                )
            }
        )
        try:
            yield app.test_client()
        finally:
            extensions.database(app).close()


MODERN_META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
}


def mcp_claimer(client: Any, token: str) -> Callable[[], bool]:
    """One stateless (2026-07-28) ``tools/call claim_next`` through the WSGI app."""
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tools/call",
        "Mcp-Name": "claim_next",
    }
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "claim_next", "arguments": {}, "_meta": MODERN_META},
        }
    )

    def call() -> bool:
        response = client.post(
            "/mcp",
            data=body,
            headers=headers,
            content_type="application/json",
            base_url="http://127.0.0.1:8080",
        )
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.data[:200]!r}")
        result = json.loads(response.data)["result"]
        return "todo" in result["structuredContent"]

    return call


# --- footprints -------------------------------------------------------------------------------


class PeakMemory(threading.Thread):
    """Samples the RSS of a process's children (gunicorn workers) every ``interval`` seconds
    while running; ``peaks`` is pid → peak RSS in bytes."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.parent = psutil.Process(pid)
        self.interval = interval
        self.peaks: dict[int, int] = {}
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            for child in self.parent.children(recursive=True):
                try:
                    rss = child.memory_info().rss
                except psutil.Error:
                    continue
                self.peaks[child.pid] = max(self.peaks.get(child.pid, 0), rss)
            self.stop.wait(self.interval)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process's children (the gunicorn workers) so far."""
    total = 0.0
    for child in psutil.Process(pid).children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


@dataclass(frozen=True)
class PostgresFootprint:
    processes: int
    rss: int  # summed: shared_buffers pages are counted once per process that touched them
    pss: int  # proportional: shared pages divided among the processes sharing them
    data_dir: int | None  # bytes on disk, None when the directory is not readable here
    wal: int | None  # of which pg_wal
    databases: int  # pg_database_size over every database

    def describe(self) -> str:
        disk = ""
        if self.data_dir is not None:
            disk = f"data dir {self.data_dir / MiB:,.0f} MiB (WAL {(self.wal or 0) / MiB:,.0f} MiB)"
        return (
            f"{self.processes} processes, RSS sum {self.rss / MiB:,.0f} MiB, "
            f"PSS sum {self.pss / MiB:,.0f} MiB; {disk}"
            f" (databases {self.databases / MiB:,.0f} MiB)"
        )


def postgres_footprint(url: str) -> PostgresFootprint | None:
    """The server's processes (the postmaster and its children) on this machine, and its data
    directory; None when the server is not a local process we can see."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_backend_pid(), current_setting('data_directory'),"
            " (SELECT sum(pg_database_size(oid)) FROM pg_database)"
        ).fetchone()
        assert row is not None
        backend, data_dir, databases = row
        try:
            postmaster = psutil.Process(backend).parent()
        except psutil.Error:
            return None
        if postmaster is None:
            return None
        processes = [postmaster, *postmaster.children()]
        rss = pss = 0
        for process in processes:
            try:
                info = process.memory_full_info()
            except psutil.Error:
                continue
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
    wal = _du(Path(data_dir) / "pg_wal")
    return PostgresFootprint(len(processes), rss, pss, _du(Path(data_dir)), wal, int(databases))


def _du(path: Path) -> int | None:
    if not os.access(path, os.R_OK | os.X_OK):
        return None
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


# --- standalone -------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    from bench.claim import Fixture, bench_database, server
    from bench.mcp import seed
    from switchboard import db
    from switchboard.models import Actor
    from switchboard.services import todos as service

    parser = argparse.ArgumentParser(
        prog="python -m bench.profile", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or None)
    parser.add_argument(
        "--claims", type=int, default=3000, help="per profile (x2: timed, profiled)"
    )
    args = parser.parse_args(argv)
    with server(args.database_url) as admin, bench_database(admin) as url:
        fixture = Fixture(url)
        fixture.seed(args.claims * 5, ["hot"])
        database = db.Database(url, min_size=1, max_size=1)
        database.open(wait=True)
        actor = Actor(endpoint_id=fixture.endpoint_id)

        def claim() -> bool:
            outcome = service.claim_next(
                database,
                endpoint_id=fixture.endpoint_id,
                granted_queues=None,
                asked_queues=["hot"],
                actor=actor,
            )
            return isinstance(outcome, service.Claimed)

        try:
            print_profile(profile("store claim_next, no policy", claim, args.claims))
            fixture.budget(["hot"])
            print_profile(profile("store claim_next, budgeted", claim, args.claims))
        finally:
            database.close()
            fixture.close()
        with bench_database(admin) as mcp_url:
            seeded = seed(mcp_url, args.claims * 2)
            with mcp_app(mcp_url) as client:
                claimer = mcp_claimer(client, seeded.token)
                print_profile(profile("MCP claim_next in process (WSGI)", claimer, args.claims))
            footprint = postgres_footprint(mcp_url)
        print(f"  PostgreSQL: {footprint.describe() if footprint else 'not a local process'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
