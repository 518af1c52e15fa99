"""The ``switchboard`` command: serve, migrate, bootstrap."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import click
import psycopg
from gunicorn.app.base import BaseApplication

from switchboard import config as configmod
from switchboard import db as dbmod
from switchboard.errors import SwitchboardError
from switchboard.pgserver import EmbeddedPostgres
from switchboard.services import accounts


def _fail(message: str) -> NoReturn:
    click.echo(f"switchboard: {message}", err=True)
    sys.exit(1)


def _config() -> configmod.Config:
    try:
        return configmod.load()
    except configmod.ConfigError as exc:
        _fail(f"configuration error: {exc}")


@contextmanager
def _database_url(config: configmod.Config) -> Iterator[str]:
    """The configured database, or the embedded one for the duration of the block."""
    if config.database_url is not None:
        yield config.database_url
        return
    server = EmbeddedPostgres(config.data_dir)
    try:
        yield server.start()
    finally:
        server.stop()


@click.group()
def main() -> None:
    """Switchboard: a dispatch board for people and AI agents."""


@main.command()
def migrate() -> None:
    """Apply pending database migrations."""
    config = _config()
    try:
        with _database_url(config) as url:
            applied = dbmod.migrate(url)
    except psycopg.Error as exc:
        _fail(f"cannot migrate: {exc}")
    click.echo(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none pending'}")


@main.command()
@click.option("--email", required=True, help="The first admin's email.")
@click.option("--password", default=None, help="A password for the board (optional).")
def bootstrap(email: str, password: str | None) -> None:
    """Create the first admin and print only its API token."""
    config = _config()
    try:
        with _database_url(config) as url:
            dbmod.migrate(url)
            database = dbmod.Database(url, min_size=1, max_size=1)
            database.open(wait=True)
            try:
                with database.transaction() as conn:
                    created = accounts.bootstrap(conn, email=email, password=password)
            finally:
                database.close()
    except SwitchboardError as exc:
        _fail(exc.message if not exc.details.get("fields") else _fields_line(exc.details))
    except psycopg.Error as exc:
        _fail(f"cannot reach the database: {exc}")
    click.echo(created.token)


def _fields_line(details: dict[str, Any]) -> str:
    fields = details["fields"]
    return "; ".join(f"{name}: {' '.join(map(str, msgs))}" for name, msgs in fields.items())


@main.command()
def serve() -> None:
    """Start PostgreSQL if embedded, migrate, and serve with gunicorn (gthread)."""
    config = _config()
    with _database_url(config) as url:
        try:
            dbmod.migrate(url)
        except psycopg.Error as exc:
            _fail(f"cannot migrate: {exc}")
        os.environ["DATABASE_URL"] = url  # workers use this server and start nothing
        click.echo(f"Switchboard serving on {config.public_url}")
        sys.stdout.flush()
        _Gunicorn(
            {
                "bind": config.bind,
                "workers": config.workers,
                "threads": config.threads,
                "worker_class": "gthread",
                "graceful_timeout": 20,
                "timeout": 60,
                "accesslog": None,
            }
        ).run()


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from app import create_app

        return create_app()
