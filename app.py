"""The Flask application factory."""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from typing import Any

from flask import Flask

from switchboard import config as configmod
from switchboard import extensions
from switchboard.db import Database
from switchboard.pgserver import EmbeddedPostgres
from switchboard.scheduler import Scheduler
from switchboard.views import api, board, errors, health, mcp

MAX_CONTENT_LENGTH = 1024 * 1024  # request bodies above 1 MiB are refused with 413


def create_app(test_config: Mapping[str, Any] | None = None) -> Flask:
    """Build the app: defaults, then ``SWITCHBOARD_*`` env, then test overrides, then init_app.

    ``test_config`` may carry ``config`` (a ready :class:`Config`) and Flask settings.
    """
    overrides = dict(test_config or {})
    config = overrides.pop("config", None) or configmod.load()
    app = Flask("switchboard")
    app.config.update(SECRET_KEY=config.secret_key, MAX_CONTENT_LENGTH=MAX_CONTENT_LENGTH)
    app.config.update(overrides)

    url = config.database_url or _start_embedded(config)
    db = Database(url, min_size=config.pool_min_size, max_size=config.pool_max_size)
    db.open()
    extensions.init_app(app, extensions.State(config, db))
    errors.init_app(app)
    app.register_blueprint(health.bp)
    mcp.init_app(app)
    app.register_blueprint(mcp.bp)
    app.register_blueprint(api.bp)
    board.init_app(app)
    if config.scheduler:
        _start_scheduler(db, config.tick_seconds)
    return app


def _start_scheduler(db: Database, tick_seconds: int) -> None:
    """Tick in this process; only the advisory-lock holder's ticks do work (R-SCHED)."""
    scheduler = Scheduler(db, tick_seconds=tick_seconds)
    scheduler.start()
    atexit.register(scheduler.shutdown)


def _start_embedded(config: configmod.Config) -> str:
    """No DATABASE_URL: run (or join) the embedded PostgreSQL in the data dir."""
    server = EmbeddedPostgres(config.data_dir)
    url = server.start()
    atexit.register(server.stop)
    return url
