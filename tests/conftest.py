"""Test PostgreSQL: embedded unless TEST_DATABASE_URL names a server (needs CREATEDB).

A template database is built from migrations/ once per session; each test module (or test,
for concurrency) gets a clone; store tests run in a transaction that always rolls back.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import Connection, sql
from psycopg.conninfo import make_conninfo

from switchboard import db as dbmod
from switchboard.models import Endpoint, Human
from switchboard.pgserver import EmbeddedPostgres
from switchboard.store import accounts

TEMPLATE = f"sb_template_{os.getpid()}"


@pytest.fixture(scope="session")
def pg_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A URL to a maintenance database on the test server."""
    configured = os.environ.get("TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    server = EmbeddedPostgres(Path(tmp_path_factory.mktemp("embedded")))
    url = server.start()
    yield url
    server.stop()


def database_url(server_url: str, name: str) -> str:
    return make_conninfo(server_url, dbname=name)


def create_database(server_url: str, name: str, template: str | None = None) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        if template is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        else:
            conn.execute(
                sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(template)
                )
            )
    return database_url(server_url, name)


def drop_database(server_url: str, name: str) -> None:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="session")
def template_db(pg_server_url: str) -> Iterator[str]:
    """The name of a database built by the migrations, to clone from."""
    url = create_database(pg_server_url, TEMPLATE)
    dbmod.migrate(url)
    yield TEMPLATE
    drop_database(pg_server_url, TEMPLATE)


@pytest.fixture
def clone_db(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A fresh migrated database for one test (concurrency, HTTP); yields its URL."""
    name = f"sb_test_{uuid.uuid4().hex[:12]}"
    yield create_database(pg_server_url, name, template_db)
    drop_database(pg_server_url, name)


@pytest.fixture(scope="module")
def module_db(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A migrated database shared by one test module; yields its URL."""
    name = f"sb_mod_{uuid.uuid4().hex[:12]}"
    yield create_database(pg_server_url, name, template_db)
    drop_database(pg_server_url, name)


@pytest.fixture
def conn(module_db: str) -> Iterator[Connection[Any]]:
    """A connection inside a transaction that is always rolled back."""
    with psycopg.connect(module_db) as connection:
        yield connection
        connection.rollback()


def make_human(conn: Connection[Any], *, admin: bool = False) -> Human:
    return accounts.create_human(
        conn,
        email=f"h-{uuid.uuid4().hex[:8]}@example.com",
        display_name="Test Human",
        password_hash=None,
        is_admin=admin,
    )


def make_endpoint(conn: Connection[Any], owner: Human) -> Endpoint:
    return accounts.create_endpoint(
        conn,
        slug=f"ep-{uuid.uuid4().hex[:8]}",
        display_name="Test Endpoint",
        owner_human_id=owner.id,
        notify_url=None,
        notify_secret="s" * 64,
    )


@pytest.fixture
def owner(conn: Connection[Any]) -> Human:
    return make_human(conn)


@pytest.fixture
def endpoint(conn: Connection[Any], owner: Human) -> Endpoint:
    return make_endpoint(conn, owner)


class SingleConnection:
    """A Database stand-in over one test connection: each transaction is a savepoint, so
    services that own their transactions compose inside the test's rolled-back one."""

    def __init__(self, conn: Connection[Any]) -> None:
        self.conn = conn

    @contextmanager
    def transaction(self) -> Iterator[Connection[Any]]:
        with self.conn.transaction():
            yield self.conn

    # Autocommit and pipelines are impossible inside the test's transaction: savepoints stand in.
    statement = transaction
    pipelined = transaction


@pytest.fixture
def db_conn(conn: Connection[Any]) -> SingleConnection:
    return SingleConnection(conn)


# MCP fixtures (gunicorn-served app, agents, npm tools) live in their own module.
# Operator API fixtures (a module-scoped app, two operators, an endpoint) for test_api_*.
from tests.api_support import alice, app, bob, slug  # noqa: E402, F401
from tests.mcp_fixtures import (  # noqa: E402, F401
    agent,
    agent_factory,
    conformance_server,
    mcp_db,
    mcp_server,
    npm_tools,
)
