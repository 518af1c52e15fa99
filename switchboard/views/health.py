"""Liveness and readiness probes."""

from __future__ import annotations

import psycopg
from flask import Blueprint, Response, current_app, jsonify

from switchboard import db as dbmod
from switchboard.extensions import database

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz() -> Response:
    """The process is up."""
    return jsonify({"status": "ok"})


@bp.get("/readyz")
def readyz() -> tuple[Response, int]:
    """The database answers and every migration is applied; 503 otherwise."""
    try:
        with database(current_app).transaction() as conn:
            pending = dbmod.pending_migrations(conn)
    except psycopg.Error as exc:  # pool timeouts are psycopg errors too
        return jsonify({"status": "unavailable", "reason": type(exc).__name__}), 503
    if pending:
        return jsonify(
            {"status": "unavailable", "reason": "migrations pending", "pending": pending}
        ), 503
    return jsonify({"status": "ready"}), 200
