"""JSON-RPC 2.0 messages: parsing, validation and the error codes MCP uses.

A message is a request when it has an ``id`` key, a notification when it has none (SPEC §5);
ids are echoed exactly (``0`` and strings included).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# 2026-07-28 (modern) codes.
HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
UNSUPPORTED_PROTOCOL_VERSION = -32022

# The HTTP status of a JSON-RPC error where the revision ties one to it (2026-07-28 always,
# legacy for envelope errors); other codes ride on 200.
ERROR_HTTP_STATUS: dict[int, int] = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    MISSING_REQUIRED_CLIENT_CAPABILITY: 400,
    UNSUPPORTED_PROTOCOL_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}

RequestId = int | float | str


class RpcError(Exception):
    """A JSON-RPC error to answer with; ``status`` overrides the HTTP status when set."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        data: Any = None,
        status: int | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data
        self.status = status
        self.headers = dict(headers or {})
        self.id: RequestId | None = None  # the request's id, once known

    def answering(self, id: RequestId | None) -> RpcError:
        """This error, as the answer to the request ``id``."""
        self.id = id
        return self

    def body(self) -> dict[str, Any]:
        """The error response object (``id`` null when the request's is unknown)."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return {"jsonrpc": "2.0", "id": self.id, "error": error}


@dataclass(frozen=True)
class Request:
    """A request (``is_notification`` False) or a notification: method, params and id."""

    method: str
    params: dict[str, Any]
    id: RequestId | None
    is_notification: bool

    def result(self, result: dict[str, Any]) -> dict[str, Any]:
        """The success response to this request."""
        return {"jsonrpc": "2.0", "id": self.id, "result": result}


@dataclass(frozen=True)
class ClientResponse:
    """A response the client posted (to a server request); accepted and ignored."""


def decode(body: bytes) -> Any:
    """The JSON value of a UTF-8 request body; raises RpcError PARSE_ERROR, also for a string
    with a lone surrogate, escaped or encoded (no Unicode text: nothing could store or echo it).
    The body is decoded strictly first: ``json.loads`` on bytes would let surrogates encoded in
    the bytes themselves through (it decodes with ``surrogatepass``)."""
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # bad UTF-8 and huge int literals are ValueErrors too
        raise RpcError(PARSE_ERROR, "Parse error: the body is not valid JSON") from None
    if _SURROGATE_ESCAPE.search(body) and not _unicode(value):
        raise RpcError(PARSE_ERROR, "Parse error: a string holds a lone surrogate")
    return value


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _unicode(value: Any) -> bool:
    """Whether every string in the JSON value encodes as UTF-8 (no lone surrogates)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return True


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def request_id(message: Any) -> RequestId | None:
    """The message's id if it is a usable one, for echoing in an error; else None."""
    if isinstance(message, dict):
        value = message.get("id")
        if _valid_id(value):
            return value
    return None


def parse(message: Any) -> Request | ClientResponse:
    """One JSON-RPC message; raises RpcError INVALID_REQUEST or INVALID_PARAMS."""
    if not isinstance(message, dict):
        raise RpcError(INVALID_REQUEST, "Invalid Request: a message is a JSON object")
    if message.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "jsonrpc" must be "2.0"')
    has_id = "id" in message
    if has_id and not _valid_id(message["id"]):
        raise RpcError(INVALID_REQUEST, "Invalid Request: id must be a string or a number")
    if "method" not in message:
        if has_id and ("result" in message or "error" in message):
            return ClientResponse()
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "method" is missing')
    method = message["method"]
    if not isinstance(method, str) or not method:
        raise RpcError(INVALID_REQUEST, 'Invalid Request: "method" must be a non-empty string')
    params = message.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "Invalid params: params must be an object")
    return Request(method, params, message.get("id"), not has_id)


def _valid_id(value: Any) -> bool:
    # MCP forbids null ids; booleans are not numbers here even though Python says so.
    return isinstance(value, int | float | str) and not isinstance(value, bool)
