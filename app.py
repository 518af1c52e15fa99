"""The Flask application factory."""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from typing import Any

from flask import Flask
from werkzeug.middleware.proxy_fix import ProxyFix

from switchboard import config as configmod
from switchboard import doorbells, extensions, metrics, sweeps
from switchboard.db import Database
from switchboard.mcp.streams import Streams
from switchboard.pgserver import EmbeddedPostgres
from switchboard.retention import Retention
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
    doorbells.configure(keepalive_seconds=config.mcp_keepalive_seconds)
    sweeps.configure(
        tick_seconds=config.tick_seconds, bell_repeat_seconds=config.bell_repeat_seconds
    )
    if config.doorbells:
        _start_bell(db, mcp.streams_of(app))
    metrics.init_app(app, db, token=config.metrics_token)
    if config.proxy_hops:  # behind nginx: the client's address, scheme and host (R-SAFE)
        hops = config.proxy_hops
        app.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops, x_port=hops
        )
    if config.scheduler:
        _start_scheduler(db, config)
    return app


def _start_bell(db: Database, streams: Streams) -> None:
    """Listen for doorbells in this process: pay owed rings, wake this process's streams."""
    bell = doorbells.Bell(db, wake=streams.wake)
    bell.start()
    atexit.register(bell.stop)


def _start_scheduler(db: Database, config: configmod.Config) -> None:
    """Tick in this process; only the advisory-lock holder's ticks do work (R-SCHED)."""
    keep = Retention(config.retention_days, config.events_retention_days)
    scheduler = Scheduler(db, tick_seconds=config.tick_seconds, keep=keep)
    scheduler.start()
    atexit.register(scheduler.shutdown)


def _start_embedded(config: configmod.Config) -> str:
    """No DATABASE_URL: run (or join) the embedded PostgreSQL in the data dir."""
    server = EmbeddedPostgres(config.data_dir)
    url = server.start()
    atexit.register(server.stop)
    return url
