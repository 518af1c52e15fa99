"""``/mcp``: the MCP endpoint for agents (SPEC §5 R-MCP), Flask glue around ``McpServer``."""

from __future__ import annotations

import json
import select
import socket
from collections.abc import Callable
from importlib import metadata

from flask import Blueprint, Flask, Response, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from switchboard import extensions
from switchboard.mcp import server as mcp
from switchboard.mcp.jsonrpc import INVALID_REQUEST, RpcError
from switchboard.mcp.security import OriginPolicy
from switchboard.mcp.streams import Streams

bp = Blueprint("mcp", __name__)
_KEY = "switchboard.mcp"
_TOO_LARGE = "Content Too Large: the request body exceeds the size limit"


def init_app(app: Flask) -> None:
    """Build this process's MCP server from the app's configuration and database."""
    state = extensions.state(app)
    config = state.config
    try:
        version = metadata.version("switchboard")
    except metadata.PackageNotFoundError:
        version = "0.0.0"
    app.extensions[_KEY] = mcp.McpServer(
        state.db,
        policy=OriginPolicy(config.public_url, config.allowed_origins, config.bind),
        defaults=state.todo_defaults,
        streams=Streams(
            state.db, keepalive=config.mcp_keepalive_seconds, limit=config.mcp_max_streams
        ),
        version=version,
    )


def streams_of(app: Flask) -> Streams:
    """This process's MCP streams (the doorbell wakes them)."""
    server: mcp.McpServer = app.extensions[_KEY]
    return server.streams


@bp.route("/mcp", methods=["POST", "GET", "DELETE"])
def endpoint() -> Response:
    """Every MCP request: JSON-RPC over POST, the session stream on GET, DELETE ends it."""
    server: mcp.McpServer = current_app.extensions[_KEY]
    try:
        body = request.get_data(cache=False) if request.method == "POST" else b""
    except RequestEntityTooLarge:
        return _response(mcp.error_reply(RpcError(INVALID_REQUEST, _TOO_LARGE, status=413)))
    gone = _hangup_probe(request.environ.get("gunicorn.socket"))
    return _response(server.handle(mcp.HttpRequest(request.method, request.headers, body, gone)))


def _hangup_probe(sock: socket.socket | None) -> Callable[[], bool] | None:
    """Under gunicorn: whether the client closed its connection (readable at end of file),
    looked at without blocking and without consuming a byte."""
    if sock is None:
        return None

    def gone() -> bool:
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True  # reset or closed
        except ValueError:
            return False  # e.g. a TLS socket: rely on the next failed write instead

    return gone


def _response(reply: mcp.HttpReply) -> Response:
    if reply.stream is not None:
        response = Response(reply.stream.body, reply.status, reply.headers, "text/event-stream")
        response.call_on_close(reply.stream.on_close)
        return response
    if reply.body is None:
        return Response(status=reply.status, headers=reply.headers)
    text = json.dumps(reply.body, ensure_ascii=False, separators=(",", ":"))
    return Response(text, reply.status, reply.headers, "application/json")
