"""Connection pool, transactions and the migration runner."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
_MIGRATION_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any fixed 64-bit key: concurrent starters queue on it, so each file is applied exactly once.
_MIGRATION_LOCK = 0x5357_4D49_4752  # "SWMIGR"


class Database:
    """A psycopg pool; ``transaction()`` is the one way code reaches the database."""

    def __init__(self, url: str, *, min_size: int = 1, max_size: int = 10) -> None:
        self.url = url
        self.pool = ConnectionPool(
            url,
            min_size=min_size,
            max_size=max_size,
            open=False,
            # No check on checkout: it would cost a round trip on every claim. The scheduler
            # checks idle connections every few seconds instead (Database.check_idle), and a
            # connection that breaks in use is discarded when it comes back to the pool.
            kwargs={"autocommit": False},
            name="switchboard",
        )

    def open(self, *, wait: bool = False, timeout: float = 30.0) -> None:
        """Open the pool (optionally waiting for min_size connections)."""
        self.pool.open(wait=wait, timeout=timeout)

    def close(self) -> None:
        """Close every pooled connection."""
        self.pool.close()

    @contextmanager
    def transaction(self) -> Iterator[Connection[Any]]:
        """One transaction: committed when the block ends, rolled back if it raises."""
        with self.pool.connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def pipelined(self) -> Iterator[Connection[Any]]:
        """A transaction in pipeline mode: BEGIN travels with the first statement, and COMMIT
        with every statement whose result is read only after the block (one round trip)."""
        with self.pool.connection() as conn, conn.pipeline(), conn.transaction():
            yield conn

    @contextmanager
    def statement(self) -> Iterator[Connection[Any]]:
        """A connection in autocommit: each statement is its own transaction, one round trip.
        For work that is a single statement (the unbudgeted claim) or cannot run in a
        transaction (VACUUM)."""
        with self.pool.connection() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                if not conn.closed:
                    conn.autocommit = False

    def check_idle(self) -> None:
        """Replace idle pooled connections that no longer work (e.g. PostgreSQL restarted)."""
        self.pool.check()


@dataclass(frozen=True)
class Migration:
    version: str
    name: str
    path: Path


def migration_files(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """The migration files in order; raises RuntimeError on a malformed or duplicate name."""
    found: dict[str, Migration] = {}
    for path in sorted(directory.glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if match is None:
            raise RuntimeError(f"migration file name {path.name!r} is not NNNN_name.sql")
        if match.group(1) in found:
            raise RuntimeError(f"two migrations share version {match.group(1)}")
        found[match.group(1)] = Migration(match.group(1), match.group(2), path)
    return list(found.values())


def migrate(url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply pending migrations, each in its own transaction; returns the versions applied."""
    applied: list[str] = []
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version text PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
            for migration in migration_files(directory):
                if migration.version in done:
                    continue
                with conn.transaction():
                    conn.execute(migration.path.read_text(encoding="utf-8").encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name) VALUES (%s, %s)",
                        (migration.version, migration.name),
                    )
                applied.append(migration.version)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return applied


def pending_migrations(conn: Connection[Any], directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Versions on disk not yet recorded in the database (all of them if none are)."""
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    done: set[str] = set()
    if exists and exists[0]:
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    return [m.version for m in migration_files(directory) if m.version not in done]
