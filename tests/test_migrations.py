"""The migration chain: applies to an empty database, is a no-op twice, and is serialized."""

from __future__ import annotations

import multiprocessing
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from switchboard import db as dbmod
from tests.conftest import create_database, drop_database


@pytest.fixture
def empty_db(pg_server_url: str) -> Iterator[str]:
    name = f"sb_empty_{uuid.uuid4().hex[:12]}"
    yield create_database(pg_server_url, name)
    drop_database(pg_server_url, name)


def test_chain_applies_to_an_empty_database_and_records_each_file(empty_db: str) -> None:
    files = dbmod.migration_files()
    assert [m.version for m in files] == sorted(m.version for m in files)
    applied = dbmod.migrate(empty_db)
    assert applied == [m.version for m in files]
    with psycopg.connect(empty_db) as conn:
        recorded = conn.execute("SELECT version, name FROM schema_migrations ORDER BY 1").fetchall()
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        }
        assert dbmod.pending_migrations(conn) == []
    assert recorded == [(m.version, m.name) for m in files]
    assert {
        "humans",
        "api_tokens",
        "endpoints",
        "grants",
        "queues",
        "todos",
        "todo_attempts",
        "events",
        "schema_migrations",
    } <= tables


def test_applying_twice_is_a_no_op(empty_db: str) -> None:
    dbmod.migrate(empty_db)
    assert dbmod.migrate(empty_db) == []


def _migrate_in_process(url: str, results: multiprocessing.Queue[list[str]]) -> None:
    results.put(dbmod.migrate(url))


def test_concurrent_starters_apply_each_file_exactly_once(empty_db: str) -> None:
    context = multiprocessing.get_context("spawn")
    results: multiprocessing.Queue[list[str]] = context.Queue()
    workers = [
        context.Process(target=_migrate_in_process, args=(empty_db, results)) for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    applied = [results.get(timeout=5) for _ in workers]
    versions = [m.version for m in dbmod.migration_files()]
    assert sorted(applied, key=len) == [[], [], [], versions]


def test_a_failing_migration_rolls_back_and_is_not_recorded(empty_db: str, tmp_path) -> None:
    (tmp_path / "0001_ok.sql").write_text("CREATE TABLE ok_table (id int);")
    (tmp_path / "0002_broken.sql").write_text("CREATE TABLE half (id int); SELECT 1/0;")
    with pytest.raises(psycopg.errors.DivisionByZero):
        dbmod.migrate(empty_db, tmp_path)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT version FROM schema_migrations").fetchall() == [("0001",)]
        assert conn.execute("SELECT to_regclass('half')").fetchone() == (None,)


def test_malformed_migration_names_are_refused(tmp_path) -> None:
    (tmp_path / "1_bad.sql").write_text("SELECT 1;")
    with pytest.raises(RuntimeError, match="NNNN_name"):
        dbmod.migration_files(tmp_path)
