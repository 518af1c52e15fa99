"""MCP revisions: which era a request belongs to, and the 2026-07-28 envelope and header checks.

Era selection copies the official SDK server: a request whose ``MCP-Protocol-Version`` header
is absent or names a handshake-era revision takes the legacy (session) path; any other value
takes the modern (stateless) path, which answers an unknown revision with -32022.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from switchboard.mcp.jsonrpc import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    UNSUPPORTED_PROTOCOL_VERSION,
    Request,
    RpcError,
)

LEGACY_VERSIONS = ("2025-03-26", "2025-06-18", "2025-11-25")
LATEST_LEGACY = LEGACY_VERSIONS[-1]
# No header and no session to tell: the transport spec says assume the first HTTP revision.
ASSUMED_LEGACY = "2025-03-26"
MODERN_VERSIONS = ("2026-07-28",)
# Headers that keep a request on the session path (the SDK's list), served or not.
HANDSHAKE_VERSIONS = frozenset({"2024-11-05", *LEGACY_VERSIONS})
# structuredContent, outputSchema and tool titles arrived in 2025-06-18.
STRUCTURED_SINCE = "2025-06-18"
# The revisions whose POST body may be a JSON-RPC batch.
BATCH_VERSIONS = frozenset({"2025-03-26"})

VERSION_HEADER = "MCP-Protocol-Version"
SESSION_HEADER = "Mcp-Session-Id"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
CLIENT_INFO_KEY = "io.modelcontextprotocol/clientInfo"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"
SUBSCRIPTION_ID_KEY = "io.modelcontextprotocol/subscriptionId"

# Methods whose name or uri the client mirrors in Mcp-Name.
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

Era = Literal["legacy", "modern"]


class Headers(Protocol):
    """Case-insensitive HTTP header lookup (werkzeug's Headers, or a test double)."""

    def get(self, key: str) -> str | None: ...


def era(version_header: str | None) -> Era:
    """The path a request takes, from its ``MCP-Protocol-Version`` header."""
    value = (version_header or "").strip()
    return "legacy" if not value or value in HANDSHAKE_VERSIONS else "modern"


def legacy_version(version_header: str | None, negotiated: str | None = None) -> str:
    """The legacy revision of a request: its header, else the session's, else 2025-03-26.

    Raises RpcError (HTTP 400) for a handshake-era revision Switchboard does not serve.
    """
    value = (version_header or "").strip()
    if not value:
        return negotiated or ASSUMED_LEGACY
    if value not in LEGACY_VERSIONS:
        raise RpcError(
            INVALID_REQUEST,
            f"Bad Request: unsupported MCP-Protocol-Version {value!r}",
            data={"supported": [*LEGACY_VERSIONS, *MODERN_VERSIONS], "requested": value},
            status=400,
        )
    return value


def negotiate(requested: Any) -> str:
    """The revision an ``initialize`` answers with: the client's if served, else the newest."""
    return requested if requested in LEGACY_VERSIONS else LATEST_LEGACY


def structured(version: str) -> bool:
    """Whether the revision has ``structuredContent`` and ``outputSchema``."""
    return version >= STRUCTURED_SINCE  # revisions are ISO dates: they sort as strings


@dataclass(frozen=True)
class Envelope:
    """The per-request protocol fields of a 2026-07-28 request (its ``_meta``)."""

    version: str
    client_capabilities: Any
    client_info: Any


def check_modern(request: Request, headers: Headers) -> Envelope:
    """Validate a 2026-07-28 request's ``_meta`` and routing headers, in the SDK's order:
    ``_meta`` shape (-32602), headers against the body (-32020), then the revision (-32022).

    Raises RpcError with HTTP 400 at the first failure.
    """
    meta = request.params.get("_meta")
    if not isinstance(meta, dict):
        raise RpcError(
            INVALID_PARAMS,
            f"Invalid params: params._meta must be an object carrying "
            f"{PROTOCOL_VERSION_KEY!r} and {CLIENT_CAPABILITIES_KEY!r}",
        )
    missing = [key for key in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if key not in meta]
    if missing:
        raise RpcError(
            INVALID_PARAMS,
            f"Invalid params: params._meta is missing {', '.join(missing)}",
        )
    version = meta[PROTOCOL_VERSION_KEY]
    _check_headers(request, headers, version)
    if not isinstance(version, str):
        raise RpcError(INVALID_PARAMS, "Invalid params: the protocol version must be a string")
    if version not in MODERN_VERSIONS:
        raise unsupported_version(version)
    return Envelope(version, meta[CLIENT_CAPABILITIES_KEY], meta.get(CLIENT_INFO_KEY))


def unsupported_version(requested: str) -> RpcError:
    """The -32022 error naming the revisions the stateless path serves."""
    return RpcError(
        UNSUPPORTED_PROTOCOL_VERSION,
        "Unsupported protocol version",
        data={"supported": list(MODERN_VERSIONS), "requested": requested},
    )


def _check_headers(request: Request, headers: Headers, version: Any) -> None:
    def header(name: str) -> str | None:
        value = headers.get(name)
        return None if value is None else value.strip()

    if header(VERSION_HEADER) != version:
        raise _mismatch(f"{VERSION_HEADER} header does not match params._meta's protocol version")
    if header(METHOD_HEADER) != request.method:
        raise _mismatch(f"{METHOD_HEADER} header does not match the request body's method")
    key = NAME_BEARING.get(request.method)
    if key is not None:
        body_value = request.params.get(key)
        if body_value is not None and decode_header_value(header(NAME_HEADER)) != body_value:
            raise _mismatch(f"{NAME_HEADER} header does not match the request body's {key!r}")


def _mismatch(message: str) -> RpcError:
    return RpcError(HEADER_MISMATCH, f"Header mismatch: {message}")


_SENTINEL = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")


def decode_header_value(value: str | None) -> str | None:
    """A header value, unwrapping the ``=?base64?…?=`` sentinel; None when it is malformed."""
    if value is None:
        return None
    match = _SENTINEL.fullmatch(value)
    if match is None:
        return value
    payload = match.group("payload")
    try:
        decoded = base64.b64decode(payload, validate=True)
        if base64.b64encode(decoded).decode("ascii") != payload:
            return None  # not canonical: the encoder never sends that
        return decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
