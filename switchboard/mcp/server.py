"""The MCP dispatcher behind ``/mcp``: one HTTP request in, one reply out (JSON, 202, 204 or an
SSE stream). Framework-free: the Flask view turns requests and replies into its own types.

Every request passes the Origin/Host check, then carries a bearer grant token; the legacy
revisions add a session, the 2026-07-28 revision a per-request envelope. POST answers are JSON.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg

from switchboard import errors
from switchboard.db import Database
from switchboard.mcp import auth, jsonrpc, protocol, registry, resources, sessions
from switchboard.mcp import tools as _tools  # noqa: F401  (registers the tools)
from switchboard.mcp.auth import Agent
from switchboard.mcp.jsonrpc import (
    ERROR_HTTP_STATUS,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    ClientResponse,
    Request,
    RpcError,
)
from switchboard.mcp.security import OriginPolicy
from switchboard.mcp.streams import Feed, Stream, Streams, Target
from switchboard.schemas import has_nul
from switchboard.services import accounts
from switchboard.services.todos import TodoDefaults
from switchboard.store import doorbells as doorbell_store
from switchboard.store import mcp_sessions
from switchboard.store.mcp_sessions import McpSession
from switchboard.views.errors import jsonrpc_code_of, status_of

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "Switchboard hands you work (todos) from your queues. Call claim_next to take the oldest "
    "todo under a lease; keep its `attempt` (the fencing token). Call heartbeat before "
    "lease_expires_at for long work, then complete, fail or release with that attempt. "
    "{empty: true} means nothing to do now; `deferred` says when a held-back queue reopens."
)
TOOLS_TTL_MS = 60_000  # a grant's tools never change while it lives
MAX_BATCH = 100  # messages in one 2025-03-26 batch
SSE_HEADERS = {"Cache-Control": "no-cache, no-transform", "X-Accel-Buffering": "no"}
RETRY_AFTER_SECONDS = "5"
CAPABILITIES = {
    "tools": {"listChanged": False},
    "resources": {"subscribe": True, "listChanged": False},
}
MAX_SUBSCRIPTIONS = 1000  # resource subscriptions per legacy session


@dataclass(frozen=True)
class HttpRequest:
    """What the dispatcher reads of an HTTP request; header lookup is case-insensitive."""

    method: str
    headers: protocol.Headers
    body: bytes = b""
    client_gone: Callable[[], bool] | None = None  # whether the client hung up (streams)


@dataclass(frozen=True)
class HttpReply:
    """What to answer: a JSON body (None: no body) or an SSE stream."""

    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    stream: Stream | None = None


class McpServer:
    """The MCP endpoint of one worker process."""

    def __init__(
        self,
        db: Database,
        *,
        policy: OriginPolicy,
        defaults: TodoDefaults,
        streams: Streams,
        version: str,
    ) -> None:
        self.db = db
        self.policy = policy
        self.defaults = defaults
        self.streams = streams
        self.server_info = {"name": "switchboard", "title": "Switchboard", "version": version}

    def handle(self, request: HttpRequest) -> HttpReply:
        """Answer one request; never raises for anything a client can send."""
        rejection = self.policy.check(
            host=request.headers.get("Host"), origin=request.headers.get("Origin")
        )
        try:
            if rejection is not None:
                raise RpcError(INVALID_REQUEST, rejection.message, status=rejection.status)
            if request.method == "POST":
                return self._post(request)
            if request.method == "GET":
                return self._get(request)
            if request.method == "DELETE":
                return self._delete(request)
            raise _not_allowed("POST, GET, DELETE")
        except RpcError as error:
            return error_reply(error)
        except errors.SwitchboardError as error:
            return error_reply(_rpc_error(error))
        except psycopg.OperationalError as exc:
            log.warning("MCP request failed: database unavailable: %s", exc)
            return error_reply(
                RpcError(
                    INTERNAL_ERROR,
                    "Service Unavailable: the database cannot be reached; retry later",
                    status=503,
                    headers={"Retry-After": RETRY_AFTER_SECONDS},
                )
            )

    # --- POST ---------------------------------------------------------------------------------

    def _post(self, request: HttpRequest) -> HttpReply:
        _require_json(request)
        if not _accepts(request, "application/json"):
            raise RpcError(
                INVALID_REQUEST, "Not Acceptable: answers are application/json", status=406
            )
        message = jsonrpc.decode(request.body)
        if protocol.era(request.headers.get(protocol.VERSION_HEADER)) == "modern":
            return self._modern_post(request, message)
        return self._legacy_post(request, message)

    def _legacy_post(self, request: HttpRequest, message: Any) -> HttpReply:
        header = request.headers.get(protocol.VERSION_HEADER)
        if isinstance(message, dict) and message.get("method") == "initialize":
            protocol.legacy_version(header)  # a header, if sent, must name a served revision
            return self._initialize(self._agent(request, message), _parse(message))
        agent, session = self._session(request, message)
        context = _Legacy(agent, session, protocol.legacy_version(header, session.protocol_version))
        if isinstance(message, list):
            return self._batch(context, message)
        reply = self._legacy_message(context, _parse(message))
        return HttpReply(202) if reply is None else HttpReply(200, reply)

    def _batch(self, context: _Legacy, messages: list[Any]) -> HttpReply:
        if context.version not in protocol.BATCH_VERSIONS:
            raise RpcError(
                INVALID_REQUEST,
                f"Invalid Request: revision {context.version} has no JSON-RPC batches",
                status=400,
            )
        if not 0 < len(messages) <= MAX_BATCH:
            raise RpcError(
                INVALID_REQUEST, f"Invalid Request: a batch holds 1 to {MAX_BATCH} messages"
            )
        replies = []
        for message in messages:
            try:
                reply = self._legacy_message(context, _parse(message))
            except RpcError as error:
                reply = error.body()
            if reply is not None:
                replies.append(reply)
        return HttpReply(200, replies) if replies else HttpReply(202)

    def _legacy_message(
        self, context: _Legacy, message: Request | ClientResponse
    ) -> dict[str, Any] | None:
        """A request's response (errors included); None for notifications and responses."""
        if isinstance(message, ClientResponse) or message.is_notification:
            return None  # notifications/initialized and friends need no answer
        try:
            return message.result(self._legacy_dispatch(context, message))
        except RpcError as error:
            return error.answering(message.id).body()

    def _legacy_dispatch(self, context: _Legacy, request: Request) -> dict[str, Any]:
        structured = protocol.structured(context.version)
        if request.method == "ping":
            return {}
        if request.method == "tools/list":
            return {"tools": self._tools(context.agent, structured=structured)}
        if request.method == "tools/call":
            return self._call_tool(context.agent, request.params, structured=structured)
        if request.method in ("resources/list", "resources/read", "resources/templates/list"):
            return self._resources(context.agent, request)
        if request.method in ("resources/subscribe", "resources/unsubscribe"):
            return self._subscribe(context, request)
        if request.method == "initialize":
            raise RpcError(INVALID_REQUEST, "Invalid Request: initialize is sent alone")
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {request.method}")

    def _initialize(self, agent: Agent, request: Request | ClientResponse) -> HttpReply:
        if isinstance(request, ClientResponse) or request.is_notification:
            raise RpcError(INVALID_REQUEST, "Invalid Request: initialize is a request (give an id)")
        params = request.params
        info, capabilities = params.get("clientInfo", {}), params.get("capabilities", {})
        if not isinstance(info, dict) or not isinstance(capabilities, dict):
            error = RpcError(
                INVALID_PARAMS, "Invalid params: clientInfo and capabilities are objects"
            )
            return HttpReply(200, error.answering(request.id).body())
        if has_nul(info) or has_nul(capabilities):
            error = RpcError(INVALID_PARAMS, "Invalid params: text holds NUL (U+0000)")
            return HttpReply(200, error.answering(request.id).body())
        version = protocol.negotiate(params.get("protocolVersion"))
        with self.db.transaction() as conn:
            session = sessions.start(
                conn,
                agent=agent,
                protocol_version=version,
                client_info=info,
                client_capabilities=capabilities,
            )
        server_info = dict(self.server_info)
        if not protocol.structured(version):
            del server_info["title"]  # Implementation.title arrived in 2025-06-18
        result = {
            "protocolVersion": version,
            "capabilities": CAPABILITIES,
            "serverInfo": server_info,
            "instructions": INSTRUCTIONS,
        }
        headers = {protocol.SESSION_HEADER: str(session.id)}
        return HttpReply(200, request.result(result), headers=headers)

    def _modern_post(self, request: HttpRequest, message: Any) -> HttpReply:
        if not isinstance(message, dict):
            raise RpcError(
                INVALID_REQUEST,
                "Invalid Request: the body must be one JSON-RPC request or notification object",
            )
        parsed = _parse(message)
        if isinstance(parsed, ClientResponse):
            raise RpcError(INVALID_REQUEST, "Invalid Request: a client posts no responses here")
        agent = self._agent(request, message)
        if parsed.is_notification:
            header = (request.headers.get(protocol.VERSION_HEADER) or "").strip()
            if header not in protocol.MODERN_VERSIONS:
                raise protocol.unsupported_version(header)
            return HttpReply(202)  # this revision defines no client notifications over HTTP
        try:
            protocol.check_modern(parsed, request.headers)
            return self._modern_dispatch(request, agent, parsed)
        except RpcError as error:
            raise error.answering(parsed.id) from None

    def _modern_dispatch(self, request: HttpRequest, agent: Agent, call: Request) -> HttpReply:
        method = call.method
        if method == "server/discover":
            result: dict[str, Any] = {
                "supportedVersions": list(protocol.MODERN_VERSIONS),
                "capabilities": CAPABILITIES,
                "instructions": INSTRUCTIONS,
                "ttlMs": 0,
                "cacheScope": "private",
            }
        elif method == "tools/list":
            result = {
                "tools": self._tools(agent, structured=True),
                "ttlMs": TOOLS_TTL_MS,
                "cacheScope": "private",  # the list depends on the grant
            }
        elif method == "tools/call":
            result = self._call_tool(agent, call.params, structured=True)
        elif method in ("resources/list", "resources/read", "resources/templates/list"):
            # A queue's status changes with every claim: nothing here may be cached.
            result = {**self._resources(agent, call), "ttlMs": 0, "cacheScope": "private"}
        elif method == "subscriptions/listen":
            return self._listen(request, agent, call)
        else:  # initialize, ping, logging/setLevel, resources/subscribe … are gone in 2026
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}", data=method)
        return HttpReply(200, call.result(self._modern_result(result)))

    def _modern_result(self, result: dict[str, Any]) -> dict[str, Any]:
        meta = {protocol.SERVER_INFO_KEY: {k: self.server_info[k] for k in ("name", "version")}}
        return {**result, "resultType": "complete", "_meta": meta}

    def _listen(self, request: HttpRequest, agent: Agent, call: Request) -> HttpReply:
        if not _accepts(request, "text/event-stream"):
            raise RpcError(
                INVALID_REQUEST, "Not Acceptable: subscriptions/listen is an SSE stream", status=406
            )
        wanted = call.params.get("notifications", {})
        if not isinstance(wanted, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: notifications must be an object")
        uris = wanted.get("resourceSubscriptions") or []
        if not isinstance(uris, list):
            raise RpcError(INVALID_PARAMS, "Invalid params: resourceSubscriptions is a list")
        # Honoured: this grant's queue resources (lists never change: those flags are dropped).
        honoured = resources.honoured(agent, uris[:MAX_SUBSCRIPTIONS])
        tag = {protocol.SUBSCRIPTION_ID_KEY: call.id}
        ack = {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {
                "_meta": tag,
                "notifications": {"resourceSubscriptions": honoured} if honoured else {},
            },
        }
        token = agent.token

        def live(conn: psycopg.Connection[Any]) -> bool:
            return accounts.authenticate_grant(conn, token=token) is not None

        grant = agent.grant
        stream = self.streams.open(
            Target(grant.id, grant.endpoint_id, subscription_id=call.id),
            live=live,
            head=[ack],
            tail=call.result({"resultType": "complete", "_meta": tag}),
            gone=request.client_gone,
            feed=self._attach(agent, None, "listen", lambda conn: honoured),
        )
        return HttpReply(200, headers=dict(SSE_HEADERS), stream=stream)

    # --- tools --------------------------------------------------------------------------------

    def _tools(self, agent: Agent, *, structured: bool) -> list[dict[str, Any]]:
        return [t.listing(structured=structured) for t in registry.granted_tools(agent)]

    def _call_tool(
        self, agent: Agent, params: dict[str, Any], *, structured: bool
    ) -> dict[str, Any]:
        name, arguments = params.get("name"), params.get("arguments")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "Invalid params: name must be a tool name")
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, "Invalid params: arguments must be an object")
        tool = registry.REGISTRY.get(name)
        if tool is None:
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}", data={"name": name})
        content, is_error = registry.run(
            tool, agent=agent, arguments=arguments, db=self.db, defaults=self.defaults
        )
        return registry.result_content(content, is_error=is_error, with_structure=structured)

    # --- resources and doorbells (R-BELL) ---------------------------------------------------------

    def _resources(self, agent: Agent, call: Request) -> dict[str, Any]:
        if call.method == "resources/templates/list":
            return {"resourceTemplates": []}
        with self.db.transaction() as conn:
            if call.method == "resources/list":
                return {"resources": resources.listing(conn, agent)}
            return resources.read(conn, agent, call.params.get("uri"))

    def _subscribe(self, context: _Legacy, call: Request) -> dict[str, Any]:
        uri = call.params.get("uri")
        resources.resolve(context.agent, uri)  # raises for a URI that is not the grant's
        assert isinstance(uri, str)
        with self.db.transaction() as conn:
            if call.method == "resources/unsubscribe":
                mcp_sessions.unsubscribe(conn, id=context.session.id, uri=uri)
            elif not mcp_sessions.subscribe(
                conn, id=context.session.id, uri=uri, cap=MAX_SUBSCRIPTIONS
            ):
                raise RpcError(
                    INVALID_PARAMS,
                    f"Invalid params: a session holds at most {MAX_SUBSCRIPTIONS} subscriptions",
                )
        return {}

    def _attach(
        self,
        agent: Agent,
        session_id: Any,
        era: str,
        subscribed: Callable[[psycopg.Connection[Any]], list[str]],
        *,
        client_name: str = "",
    ) -> Feed:
        """Record the stream's presence (the endpoint now has an agent attached)."""
        with self.db.transaction() as conn:
            presence_id, opened_at = doorbell_store.stream_open(
                conn,
                endpoint_id=agent.grant.endpoint_id,
                grant_id=agent.grant.id,
                session_id=session_id,
                era=era,
                client_name=client_name,
            )
        return Feed(
            endpoint_id=agent.grant.endpoint_id,
            presence_id=presence_id,
            opened_at=opened_at,
            subscribed=subscribed,
            touch_every=timedelta(seconds=self.streams.keepalive / 2),
        )

    # --- GET and DELETE (legacy) --------------------------------------------------------------

    def _get(self, request: HttpRequest) -> HttpReply:
        if protocol.era(request.headers.get(protocol.VERSION_HEADER)) == "modern":
            raise _not_allowed("POST")
        if not _accepts(request, "text/event-stream"):
            raise RpcError(
                INVALID_REQUEST, "Not Acceptable: the GET stream is text/event-stream", status=406
            )
        agent, session = self._session(request, None)
        protocol.legacy_version(request.headers.get(protocol.VERSION_HEADER))
        session_id = session.id

        def live(conn: psycopg.Connection[Any]) -> bool:
            return sessions.is_live(conn, id=session_id)

        def subscribed(conn: psycopg.Connection[Any]) -> list[str]:
            return mcp_sessions.subscriptions(conn, id=session_id)

        grant = agent.grant
        name = str(session.client_info.get("name", ""))[:200]
        stream = self.streams.open(
            Target(grant.id, grant.endpoint_id, session_id=session_id),
            live=live,
            gone=request.client_gone,
            feed=self._attach(agent, session_id, "legacy", subscribed, client_name=name),
        )
        return HttpReply(200, headers=dict(SSE_HEADERS), stream=stream)

    def _delete(self, request: HttpRequest) -> HttpReply:
        if protocol.era(request.headers.get(protocol.VERSION_HEADER)) == "modern":
            raise _not_allowed("POST")
        with self.db.transaction() as conn:
            agent = auth.authenticate(conn, authorization=request.headers.get("Authorization"))
            ended = sessions.end(
                conn, agent=agent, header=request.headers.get(protocol.SESSION_HEADER)
            )
        self.streams.wake(("session", ended))  # after commit: its streams see it ended
        return HttpReply(204)

    # --- the caller ---------------------------------------------------------------------------

    def _agent(self, request: HttpRequest, message: Any) -> Agent:
        """The caller; a refusal answers the message's id (raises RpcError)."""
        try:
            with self.db.statement() as conn:  # one read-only lookup: no BEGIN/COMMIT
                return auth.authenticate(conn, authorization=request.headers.get("Authorization"))
        except errors.SwitchboardError as error:
            raise _rpc_error(error).answering(jsonrpc.request_id(message)) from None

    def _session(self, request: HttpRequest, message: Any) -> tuple[Agent, McpSession]:
        """The caller and its session, in one transaction (raises RpcError like ``_agent``)."""
        try:
            with self.db.statement() as conn:  # two single-statement reads
                agent = auth.authenticate(conn, authorization=request.headers.get("Authorization"))
                header = request.headers.get(protocol.SESSION_HEADER)
                return agent, sessions.resume(conn, agent=agent, header=header)
        except errors.SwitchboardError as error:
            raise _rpc_error(error).answering(jsonrpc.request_id(message)) from None
        except RpcError as error:
            raise error.answering(jsonrpc.request_id(message)) from None


@dataclass(frozen=True)
class _Legacy:
    agent: Agent
    session: McpSession
    version: str


def error_reply(error: RpcError) -> HttpReply:
    """The HTTP reply for a JSON-RPC error: its status (or the revision table's), its body."""
    status = error.status or ERROR_HTTP_STATUS.get(error.code, 200)
    return HttpReply(status, error.body(), headers=error.headers)


def _rpc_error(error: errors.SwitchboardError) -> RpcError:
    """A domain error that ends a request outside any tool (authentication, the session)."""
    headers = {}
    if isinstance(error, errors.Unauthorized):
        challenge = 'Bearer realm="switchboard"'
        if error.details.get("token"):
            challenge += ', error="invalid_token"'
        headers["WWW-Authenticate"] = challenge
    return RpcError(jsonrpc_code_of(error), error.message, status=status_of(error), headers=headers)


def _parse(message: Any) -> Request | ClientResponse:
    try:
        return jsonrpc.parse(message)
    except RpcError as error:
        raise error.answering(jsonrpc.request_id(message)) from None


def _not_allowed(allow: str) -> RpcError:
    return RpcError(
        INVALID_REQUEST,
        f"Method Not Allowed: use {allow}",
        status=405,
        headers={"Allow": allow},
    )


def _require_json(request: HttpRequest) -> None:
    kind = (request.headers.get("Content-Type") or "").split(";")[0].strip().lower()
    if kind != "application/json":
        raise RpcError(
            INVALID_REQUEST,
            "Unsupported Media Type: POST a JSON-RPC message as application/json",
            status=415,
        )


def _accepts(request: HttpRequest, media: str) -> bool:
    """Whether the Accept header (absent: anything) admits ``media``."""
    header = request.headers.get("Accept")
    if header is None or not header.strip():
        return True
    kind = media.split("/")[0]
    ranges = {item.split(";")[0].strip().lower() for item in header.split(",")}
    return bool(ranges & {media, f"{kind}/*", "*/*"})
