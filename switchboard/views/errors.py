"""The one table from domain errors to HTTP statuses, MCP outcomes and board messages."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any

import psycopg
from flask import Flask, Response, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from switchboard import errors
from switchboard.mcp.jsonrpc import INVALID_PARAMS, INVALID_REQUEST
from switchboard.views.schemas import dump_deferred, jsonable

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


# MCP (R-MCP): inside ``tools/call`` every domain error is a tool result with ``isError: true``
# whose structuredContent is ``tool_error(error)``. Outside a tool (authentication, the session)
# it ends the request as a JSON-RPC error with this code and the HTTP status above.
JSONRPC_CODE: dict[type[errors.SwitchboardError], int] = {errors.Invalid: INVALID_PARAMS}
# Errors whose details are a deferred item (SPEC Appendix A).
_DEFERRED_DETAILS = (errors.Deferred, errors.AdmissionUnavailable)


def tool_error(error: errors.SwitchboardError) -> dict[str, Any]:
    """The structuredContent of a failed tool call: ``{"error": {code, message, details?}}``."""
    details = error.details
    if isinstance(error, _DEFERRED_DETAILS) and "queue" in details:
        details = dump_deferred(details)
    return error_body(error.code, error.message, jsonable(details) or None)


def jsonrpc_code_of(error: errors.SwitchboardError) -> int:
    """The JSON-RPC error code for a domain error that ends an MCP request outside a tool."""
    for cls in type(error).__mro__:
        if cls in JSONRPC_CODE:
            return JSONRPC_CODE[cls]
    return INVALID_REQUEST


def _domain(error: errors.SwitchboardError) -> tuple[Response, int]:
    # The tool error's body is the wire shape: deferred details as in Appendix A, RFC 3339 times.
    response = jsonify(tool_error(error))
    seconds = retry_after(error)
    if seconds is not None:
        response.headers["Retry-After"] = str(seconds)
    return response, status_of(error)


def retry_after(error: errors.SwitchboardError, *, now: datetime | None = None) -> int | None:
    """Whole seconds (rounded up) until a deferral's exact ``next_eligible_at``; None when the
    error is not a deferral or its time is not exact (in_flight_full, paused)."""
    if not isinstance(error, errors.Deferred) or not error.details.get("exact"):
        return None
    at = error.details.get("next_eligible_at")
    if not isinstance(at, datetime):
        return None
    return max(0, math.ceil((at - (now or datetime.now(UTC))).total_seconds()))


# The board (HTML) titles its messages and error pages by the same classes.
BOARD_TITLE: dict[type[errors.SwitchboardError], str] = {
    errors.Invalid: "Please check the form",
    errors.Unauthorized: "Please sign in",
    errors.Forbidden: "Not allowed",
    errors.NotFound: "Not found",
    errors.Conflict: "Not possible right now",
    errors.Deferred: "Held back by the queue's budget",
    errors.AdmissionUnavailable: "Admission unavailable",
}
BOARD_PREFIX = "/board"


def board_title(error: errors.SwitchboardError) -> str:
    """The board's heading for a domain error."""
    for cls in type(error).__mro__:
        if cls in BOARD_TITLE:
            return BOARD_TITLE[cls]
    return "Something went wrong"


def html_error(status: int, title: str, message: str) -> tuple[str, int]:
    """A friendly board error page: a title, one sentence, a way back; never a trace."""
    return render_template("board/error.html", status=status, title=title, message=message), status


def _is_board() -> bool:
    return request.path == BOARD_PREFIX or request.path.startswith(BOARD_PREFIX + "/")


def _http(error: HTTPException) -> tuple[Response, int] | tuple[str, int]:
    if _is_board():
        return html_error(error.code or 500, error.name, error.description or error.name)
    code = (error.name or "error").lower().replace(" ", "_")
    response = jsonify(error_body(code, error.description or error.name))
    # Keep the exception's own headers (405's Allow, RFC 9110), but not its HTML content type.
    for name, value in error.get_headers():
        if name.lower() != "content-type":
            response.headers[name] = value
    return response, error.code or 500


def _unavailable(error: psycopg.OperationalError) -> tuple[Response, int] | tuple[str, int]:
    # The database is down, restarting, or broke a pooled connection (which the pool then
    # discards); deadlocks and serialization failures are OperationalErrors too. Either way
    # the client should retry, as the MCP endpoint tells its callers (R-FAULT).
    log.warning("request failed: database unavailable: %s", error)
    if _is_board():
        return html_error(503, "Try again in a moment", "The database could not serve the page.")
    body = error_body("unavailable", "the database could not serve the request; retry later")
    response = jsonify(body)
    response.headers["Retry-After"] = "5"
    return response, 503


def _unexpected(error: Exception) -> tuple[Response, int] | tuple[str, int]:
    log.exception("unhandled error", exc_info=error)
    if _is_board():
        return html_error(500, "Something went wrong", "The error was logged. Please try again.")
    return jsonify(error_body("internal", "internal server error")), 500


def init_app(app: Flask) -> None:
    """Answer every error as JSON, never with a trace."""
    app.register_error_handler(errors.SwitchboardError, _domain)
    app.register_error_handler(HTTPException, _http)
    app.register_error_handler(psycopg.OperationalError, _unavailable)
    app.register_error_handler(Exception, _unexpected)
