"""The MCP building blocks on their own: the marshmallow→JSON Schema converter, JSON-RPC parsing,
era selection and the 2026-07-28 checks, the Origin/Host policy, the tool registry, the session
store and the stream machinery (with the app in-process)."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import jsonschema
import pytest
from marshmallow import Schema, fields, validate
from psycopg import Connection

from switchboard import config as configmod
from switchboard.errors import Deferred, NotFound
from switchboard.mcp import jsonrpc, protocol, registry, tools
from switchboard.mcp.jsonrpc import Request, RpcError
from switchboard.mcp.jsonschema import schema_to_jsonschema
from switchboard.mcp.security import OriginPolicy, host_name, origin_of
from switchboard.mcp.streams import KEEP_ALIVE, OPENED, Streams, Target, frame
from switchboard.models import Endpoint, Human
from switchboard.schemas import QUEUE_PATTERN, FullMatch, NewTodoSchema, has_nul
from switchboard.services import accounts as account_service
from switchboard.store import mcp_sessions
from switchboard.verbs import ALL_VERBS
from switchboard.views.errors import tool_error
from switchboard.views.schemas import TodoSchema, rfc3339

# --- marshmallow → JSON Schema ------------------------------------------------------------------


class Inner(Schema):
    n = fields.Integer(required=True)


class Everything(Schema):
    text = fields.String(
        required=True, validate=validate.Length(min=1, max=5), metadata={"description": "d"}
    )
    exact = fields.String(validate=validate.Length(equal=3))
    queue = fields.String(validate=FullMatch(QUEUE_PATTERN))
    code = fields.String(validate=validate.Regexp(r"^[A-Z]+$"))
    kind = fields.String(validate=validate.OneOf(["a", "b"]), allow_none=True)
    count = fields.Integer(
        strict=True, validate=validate.Range(min=1, max=10, max_inclusive=False), load_default=3
    )
    ratio = fields.Float(validate=validate.Range(min=0, min_inclusive=False))
    flag = fields.Boolean(load_default=True)
    at = fields.DateTime()
    ident = fields.UUID()
    mail = fields.Email()
    link = fields.Url()
    day = fields.Date()
    blob = fields.Dict()
    scores = fields.Dict(values=fields.Integer())
    names = fields.List(fields.String(), validate=validate.Length(min=1))
    anything = fields.Raw(allow_none=True)
    one = fields.Nested(Inner, allow_none=True)
    many = fields.Nested(Inner, many=True)
    secret = fields.String(load_only=True)
    computed = fields.String(dump_only=True)
    renamed = fields.String(data_key="renamedKey")


def test_converter_maps_fields_validators_and_nullability() -> None:
    schema = schema_to_jsonschema(Everything, mode="load")
    jsonschema.Draft202012Validator.check_schema(schema)
    props = schema["properties"]
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["required"] == ["text"]
    assert props["text"] == {"type": "string", "minLength": 1, "maxLength": 5, "description": "d"}
    assert props["exact"] == {"type": "string", "minLength": 3, "maxLength": 3}
    assert props["queue"] == {"type": "string", "pattern": QUEUE_PATTERN}
    assert props["code"] == {"type": "string", "pattern": "^[A-Z]+$"}
    assert props["kind"] == {"anyOf": [{"type": "string", "enum": ["a", "b"]}, {"type": "null"}]}
    assert props["count"] == {
        "type": "integer",
        "minimum": 1,
        "exclusiveMaximum": 10,
        "default": 3,
    }
    assert props["ratio"] == {"type": "number", "exclusiveMinimum": 0}
    assert props["flag"] == {"type": "boolean", "default": True}
    assert props["at"] == {"type": "string", "format": "date-time"}
    assert props["ident"] == {"type": "string", "format": "uuid"}
    assert props["mail"] == {"type": "string", "format": "email"}
    assert props["link"] == {"type": "string", "format": "uri"}
    assert props["day"] == {"type": "string", "format": "date"}
    assert props["blob"] == {"type": "object"}
    assert props["scores"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["names"] == {"type": "array", "items": {"type": "string"}, "minItems": 1}
    assert props["anything"] == {}
    inner = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert props["one"] == {"anyOf": [{**inner, "additionalProperties": False}, {"type": "null"}]}
    assert props["many"] == {"type": "array", "items": {**inner, "additionalProperties": False}}
    assert "secret" in props and "computed" not in props
    assert "renamedKey" in props and "renamed" not in props

    dumped = schema_to_jsonschema(Everything, mode="dump")
    assert "secret" not in dumped["properties"] and "computed" in dumped["properties"]
    assert "additionalProperties" not in dumped  # outputs may grow fields
    assert "default" not in dumped["properties"]["count"]


def test_converter_agrees_with_marshmallow_on_sample_inputs() -> None:
    schema = schema_to_jsonschema(NewTodoSchema, mode="load")
    validator = jsonschema.Draft202012Validator(schema)
    samples: list[dict[str, Any]] = [
        {"queue": "q", "title": "t"},
        {"queue": "q.a:b-c", "title": "t", "payload": {"a": 1}, "max_attempts": None},
        {"queue": "q", "title": ""},
        {"queue": "bad queue", "title": "t"},
        {"queue": "q", "title": "t", "lease_seconds": 0},
        {"queue": "q", "title": "t", "surprise": 1},
        {"title": "t"},
    ]
    for sample in samples:
        marshmallow_ok = not NewTodoSchema().validate(sample)
        assert validator.is_valid(sample) == marshmallow_ok, sample


def test_converter_refuses_a_field_it_cannot_express() -> None:
    class Odd(Schema):
        when = fields.TimeDelta()

    with pytest.raises(TypeError, match="TimeDelta"):
        schema_to_jsonschema(Odd, mode="load")


def test_todo_wire_schema_and_times() -> None:
    schema = schema_to_jsonschema(TodoSchema, mode="dump")
    assert "admission" not in schema["required"] and "lease_expires_at" in schema["required"]
    assert rfc3339(datetime(2026, 3, 8, 7, tzinfo=UTC)) == "2026-03-08T07:00:00Z"
    eastern = datetime(2026, 3, 8, 3, 0, 0, 5, tzinfo=UTC) + timedelta(hours=4)
    assert rfc3339(eastern) == "2026-03-08T07:00:00.000005Z"
    with pytest.raises(ValueError):
        rfc3339(datetime(2026, 1, 1))


def test_deferred_tool_errors_carry_the_deferred_item() -> None:
    at = datetime(2026, 3, 8, 7, tzinfo=UTC)
    error = Deferred(
        "queue 'q' is deferred",
        details={
            "queue": "q",
            "reason": "window_exhausted",
            "pending": 2,
            "next_eligible_at": at,
            "exact": True,
        },
    )
    assert tool_error(error) == {
        "error": {
            "code": "deferred",
            "message": "queue 'q' is deferred",
            "details": {
                "queue": "q",
                "reason": "window_exhausted",
                "pending": 2,
                "next_eligible_at": "2026-03-08T07:00:00Z",
                "exact": True,
            },
        }
    }
    assert tool_error(NotFound("gone")) == {"error": {"code": "not_found", "message": "gone"}}


# --- JSON-RPC and revisions ---------------------------------------------------------------------


def test_jsonrpc_parse() -> None:
    request = jsonrpc.parse({"jsonrpc": "2.0", "id": 0, "method": "ping"})
    assert request == Request("ping", {}, 0, False)
    note = jsonrpc.parse({"jsonrpc": "2.0", "method": "n", "params": None})
    assert isinstance(note, Request) and note.is_notification
    assert isinstance(
        jsonrpc.parse({"jsonrpc": "2.0", "id": 1, "result": {}}), jsonrpc.ClientResponse
    )
    for bad, code in [
        ({"jsonrpc": "2.0", "id": False, "method": "m"}, -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": ""}, -32600),
        ({"jsonrpc": "2.0", "id": 1, "method": "m", "params": [1]}, -32602),
    ]:
        with pytest.raises(RpcError) as caught:
            jsonrpc.parse(bad)
        assert caught.value.code == code
    for text in (b"Infinity", b'{"a": NaN}', b"\xff", b"[" * 10000):
        with pytest.raises(RpcError):
            jsonrpc.decode(text)


def test_era_follows_the_version_header_like_the_sdk_server() -> None:
    assert protocol.era(None) == protocol.era("") == "legacy"
    assert protocol.era("2024-11-05") == protocol.era(" 2025-06-18 ") == "legacy"
    assert protocol.era("2026-07-28") == protocol.era("v999") == "modern"
    assert protocol.legacy_version(None) == "2025-03-26"
    assert protocol.legacy_version(None, "2025-11-25") == "2025-11-25"
    with pytest.raises(RpcError) as caught:
        protocol.legacy_version("2024-11-05")
    assert caught.value.status == 400
    assert protocol.negotiate("2025-06-18") == "2025-06-18"
    assert protocol.negotiate("2026-07-28") == protocol.negotiate(None) == "2025-11-25"
    assert not protocol.structured("2025-03-26") and protocol.structured("2026-07-28")


def test_modern_checks_in_the_sdk_order() -> None:
    meta = {
        protocol.PROTOCOL_VERSION_KEY: "2026-07-28",
        protocol.CLIENT_CAPABILITIES_KEY: {},
    }
    call = Request("tools/call", {"name": "whoami", "_meta": meta}, 1, False)
    good = {"MCP-Protocol-Version": "2026-07-28", "Mcp-Method": "tools/call", "Mcp-Name": "whoami"}
    assert protocol.check_modern(call, good).version == "2026-07-28"

    def code(request: Request, headers: dict[str, str]) -> int:
        with pytest.raises(RpcError) as caught:
            protocol.check_modern(request, headers)
        return caught.value.code

    no_meta = Request("tools/call", {"name": "whoami"}, 1, False)
    assert code(no_meta, {}) == -32602  # _meta first, even with no headers at all
    assert code(call, {**good, "Mcp-Name": "other"}) == -32020
    other = {**meta, protocol.PROTOCOL_VERSION_KEY: "2099-01-01"}
    future = Request("tools/call", {"name": "whoami", "_meta": other}, 1, False)
    assert code(future, good) == -32020  # header and body disagree: told so first
    assert code(future, {**good, "MCP-Protocol-Version": "2099-01-01"}) == -32022


@pytest.mark.parametrize(
    ("header", "decoded"),
    [
        ("plain", "plain"),
        ("=?base64?d2hvYW1p?=", "whoami"),
        ("=?base64?SGVsbG8?=", None),  # bad padding
        ("=?base64?SGVs!!!bG8=?=", None),
        ("=?base64?d2hvYW1p", "=?base64?d2hvYW1p"),  # no suffix: a literal
        (None, None),
    ],
)
def test_header_sentinel_decoding(header: str | None, decoded: str | None) -> None:
    assert protocol.decode_header_value(header) == decoded


# --- Origin and Host ----------------------------------------------------------------------------


def test_origin_policy() -> None:
    policy = OriginPolicy("https://sb.example.com", ["http://tools.example.com:8080"], "0.0.0.0:80")
    assert policy.check(host="sb.example.com", origin="https://sb.example.com:443") is None
    assert policy.check(host="SB.example.com:8443", origin=None) is None  # port: proxies vary
    assert policy.check(host="tools.example.com", origin="http://tools.example.com:8080") is None
    assert policy.check(host=None, origin=None) is None
    assert policy.check(host="localhost", origin=None).status == 421  # type: ignore[union-attr]
    rejected = policy.check(host="sb.example.com", origin="http://sb.example.com")
    assert rejected is not None and rejected.status == 403
    loopback = OriginPolicy("http://127.0.0.1:8080", [], "127.0.0.1:8080")
    for host in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080"):
        assert loopback.check(host=host, origin=f"http://{host}") is None
    for origin in ("http://localhost:3000", "https://localhost:8080", "http://127.0.0.1"):
        assert loopback.check(host="localhost:8080", origin=origin) is not None
    assert origin_of("http://[::1]:80/x") == "http://[::1]:80"
    assert origin_of("ftp://x") is None and origin_of("http://x:99999") is None
    assert host_name("[::1]:8080") == "::1" and host_name("Example.COM:1") == "example.com"


def test_public_url_and_allowed_origins_config(tmp_path: Any) -> None:
    base = {"SWITCHBOARD_DATA_DIR": str(tmp_path)}
    assert configmod.load(base).public_url == "http://127.0.0.1:8080"
    wildcard = configmod.load({**base, "SWITCHBOARD_BIND": "0.0.0.0:9000"})
    assert wildcard.public_url == "http://localhost:9000"
    configured = configmod.load(
        {
            **base,
            "SWITCHBOARD_PUBLIC_URL": "https://sb.example.com/",
            "SWITCHBOARD_ALLOWED_ORIGINS": " https://A.example.com , http://b.example.com:81,",
        }
    )
    assert configured.public_url == "https://sb.example.com"
    assert configured.allowed_origins == ("https://a.example.com", "http://b.example.com:81")
    assert configured.mcp_max_streams == 4 and configured.mcp_keepalive_seconds == 15
    for name, value in [
        ("SWITCHBOARD_PUBLIC_URL", "sb.example.com"),
        ("SWITCHBOARD_PUBLIC_URL", "https://sb.example.com/prefix"),
        ("SWITCHBOARD_ALLOWED_ORIGINS", "https://a.example.com/path"),
        ("SWITCHBOARD_ALLOWED_ORIGINS", "javascript:alert(1)"),
        ("SWITCHBOARD_MCP_KEEPALIVE_SECONDS", "0"),
    ]:
        with pytest.raises(configmod.ConfigError, match=name):
            configmod.load({**base, name: value})


# --- the registry -------------------------------------------------------------------------------


def test_registry_lists_each_tool_once_with_schemas_and_hints() -> None:
    assert tools.whoami is registry.REGISTRY["whoami"].function
    names = list(registry.REGISTRY)
    assert names[:10] == [
        "whoami",
        "create_todo",
        "get_todo",
        "list_todos",
        "claim",
        "claim_next",
        "heartbeat",
        "complete",
        "fail",
        "release",
    ]
    assert set(names) <= set(ALL_VERBS)
    for tool in registry.REGISTRY.values():
        entry = tool.listing(structured=True)
        jsonschema.Draft202012Validator.check_schema(entry["inputSchema"])
        jsonschema.Draft202012Validator.check_schema(entry["outputSchema"])
        assert entry["description"] and entry["annotations"]["openWorldHint"] is False
        assert "outputSchema" not in tool.listing(structured=False)
    with pytest.raises(ValueError, match="twice"):
        registry.tool("whoami", title="t", description="d", input=Schema, output=Schema)(
            lambda call: {}
        )


# --- sessions and streams -----------------------------------------------------------------------


def test_session_store_liveness_ownership_and_prune(
    conn: Connection[Any], endpoint: Endpoint, owner: Human
) -> None:
    grant = account_service.create_grant(conn, endpoint=endpoint, granted_by=owner).grant
    other = account_service.create_grant(conn, endpoint=endpoint, granted_by=owner).grant
    session = mcp_sessions.create(
        conn,
        grant_id=grant.id,
        protocol_version="2025-11-25",
        client_info={},
        client_capabilities={},
    )
    day = 86400
    assert mcp_sessions.get_live(conn, id=session.id, grant_id=grant.id, idle_seconds=day)
    assert mcp_sessions.get_live(conn, id=session.id, grant_id=other.id, idle_seconds=day) is None
    later = datetime.now(UTC) + timedelta(days=2)
    assert (
        mcp_sessions.get_live(conn, id=session.id, grant_id=grant.id, idle_seconds=day, now=later)
        is None
    )
    assert mcp_sessions.is_live(conn, id=session.id, idle_seconds=day)
    assert mcp_sessions.end(conn, id=session.id, grant_id=other.id) is None
    assert mcp_sessions.end(conn, id=session.id, grant_id=grant.id) is not None
    assert not mcp_sessions.is_live(conn, id=session.id, idle_seconds=day)
    assert mcp_sessions.end(conn, id=session.id, grant_id=grant.id) is None
    assert mcp_sessions.prune(conn, before=datetime.now(UTC) - timedelta(days=1)) == 0
    assert mcp_sessions.prune(conn, before=later) == 1
    assert not mcp_sessions.is_live(conn, id=uuid.uuid4(), idle_seconds=day)


class FakeDb:
    """Streams only borrow connections; a stand-in that counts the borrowing."""

    def __init__(self) -> None:
        self.borrowed = 0

    def transaction(self) -> Any:
        from contextlib import contextmanager

        @contextmanager
        def borrow() -> Any:
            self.borrowed += 1
            yield None

        return borrow()


def test_stream_frames_slots_and_wake_ups() -> None:
    db = FakeDb()
    streams = Streams(db, keepalive=30, limit=1)  # type: ignore[arg-type]
    alive = {"yes": True}
    target = Target(uuid.uuid4(), uuid.uuid4(), session_id=uuid.uuid4())
    stream = streams.open(target, live=lambda conn: alive["yes"])
    body = iter(stream.body)
    assert next(body) == OPENED
    with pytest.raises(RpcError) as full:
        streams.open(target, live=lambda conn: True)
    assert full.value.status == 503 and full.value.headers == {"Retry-After": "5"}
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(next(body)))
    reader.start()
    streams.wake(("session", target.session_id))  # checked at once, not in 30 s
    reader.join(5)
    assert received == [KEEP_ALIVE] and db.borrowed == 1
    alive["yes"] = False
    streams.wake(("endpoint", target.endpoint_id))
    assert list(body) == []  # ended: the session is gone
    stream.on_close()  # idempotent with the generator's own release
    again = streams.open(target, live=lambda conn: True, head=[{"jsonrpc": "2.0", "method": "m"}])
    assert next(iter(again.body)) == frame({"jsonrpc": "2.0", "method": "m"})
    again.on_close()
    assert streams.open(target, live=lambda conn: True).on_close() is None


def test_closing_the_worker_ends_every_stream_with_its_tail() -> None:
    streams = Streams(FakeDb(), keepalive=30, limit=2)  # type: ignore[arg-type]
    target = Target(uuid.uuid4(), uuid.uuid4(), subscription_id="listen-1")
    tail = {"jsonrpc": "2.0", "id": "listen-1", "result": {"resultType": "complete"}}
    stream = streams.open(target, live=lambda conn: True, tail=tail)
    body = iter(stream.body)
    assert next(body) == OPENED
    rest: list[bytes] = []
    reader = threading.Thread(target=lambda: rest.extend(body))
    reader.start()
    streams.close()  # what the interpreter-exit hook does in a gunicorn worker
    reader.join(5)
    assert rest == [frame(tail)]
    with pytest.raises(RpcError) as refused:
        streams.open(target, live=lambda conn: True)
    assert refused.value.status == 503


def test_lone_surrogates_are_parse_errors_and_pairs_are_text() -> None:
    assert jsonrpc.decode(b'{"a": "\\ud83d\\ude00"}') == {"a": "\U0001f600"}
    assert jsonrpc.decode(b'{"a": "\\\\ud800"}') == {"a": "\\ud800"}  # an escaped backslash
    for body in (b'{"a": "\\ud800"}', b'["\\uDFFF"]', b'{"\\ud800": 1}'):
        with pytest.raises(RpcError) as caught:
            jsonrpc.decode(body)
        assert caught.value.code == -32700
    assert has_nul({"k": ["a\x00"]}) and has_nul({"\x00": 1})
    assert not has_nul({"k": ["a", 1, None]})
