"""The one table from domain errors to HTTP statuses (and, later, JSON-RPC and board messages)."""

from __future__ import annotations

import logging
from typing import Any

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from switchboard import errors

HTTP_STATUS: dict[type[errors.SwitchboardError], int] = {
    errors.Invalid: 422,
    errors.Unauthorized: 401,
    errors.Forbidden: 403,
    errors.NotFound: 404,
    errors.Conflict: 409,
    errors.Deferred: 429,
    errors.AdmissionUnavailable: 503,
}

log = logging.getLogger(__name__)


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one JSON error shape: ``{"error": {"code", "message", "details"?}}``."""
    body: dict[str, Any] = {"code": code, "message": message}
    if details:
        body["details"] = details
    return {"error": body}


def status_of(error: errors.SwitchboardError) -> int:
    """The HTTP status for a domain error."""
    for cls in type(error).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 400


def _domain(error: errors.SwitchboardError) -> tuple[Response, int]:
    return jsonify(error_body(error.code, error.message, error.details)), status_of(error)


def _http(error: HTTPException) -> tuple[Response, int]:
    code = (error.name or "error").lower().replace(" ", "_")
    return jsonify(error_body(code, error.description or error.name)), error.code or 500


def _unexpected(error: Exception) -> tuple[Response, int]:
    log.exception("unhandled error", exc_info=error)
    return jsonify(error_body("internal", "internal server error")), 500


def init_app(app: Flask) -> None:
    """Answer every error as JSON, never with a trace."""
    app.register_error_handler(errors.SwitchboardError, _domain)
    app.register_error_handler(HTTPException, _http)
    app.register_error_handler(Exception, _unexpected)
