"""Hostile input on /mcp (SPEC §10 R-SAFE): hypothesis-driven JSON-RPC — random methods, params,
types, sizes, unicode (NUL, lone surrogates), deep nesting, batches and odd headers — through
the WSGI app. Zero 5xx, zero hangs (every request runs under a deadline), and every answer that
is not 202/204 or a stream is JSON.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import pytest
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchboard.mcp import protocol, registry
from switchboard.verbs import ALL_VERBS
from tests.mcp_fixtures import META, MODERN, make_agent

REQUEST_SECONDS = 10.0  # a request still running after this is a hang
TOOLS = sorted(registry.REGISTRY)
ARGUMENT_NAMES = [
    "id", "attempt", "queue", "queues", "title", "body", "payload", "endpoint", "max_attempts",
    "lease_seconds", "limit", "after", "state", "error", "retry", "result", "policy",
]  # fmt: skip
METHODS = [
    "initialize", "ping", "tools/list", "tools/call", "server/discover", "subscriptions/listen",
    "notifications/initialized", "notifications/cancelled", "resources/list", "resources/read",
    "resources/subscribe", "prompts/list", "logging/setLevel", "completion/complete", "",
]  # fmt: skip
VERSIONS = [*protocol.LEGACY_VERSIONS, MODERN, "2024-11-05", "2099-01-01", "", " ", "latest"]
ODD_TEXT = ["\x00", "\ud800", "\udfff", "a\udc00b", "\u2028", "\ufeff", "\U0010ffff", "\U0001d518"]


@dataclass(frozen=True)
class Target:
    app: Flask
    token: str
    other_token: str
    scoped_token: str  # a grant on the same endpoint limited to queue "q"
    session: str  # the fuzzer may end it (DELETE): tests that need one live open their own
    todo_ids: list[str]


def initialize(app: Flask, token: str) -> str:
    """A new legacy session (2025-03-26, the revision with batches); returns its id."""
    init = app.test_client().post(
        "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {"protocolVersion": "2025-03-26", "capabilities": {}, "clientInfo": {}},
        },
        headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
    )
    assert init.status_code == 200, init.get_data(as_text=True)
    return init.headers["Mcp-Session-Id"]


@pytest.fixture(scope="module")
def target(app: Flask, module_db: str) -> Iterator[Target]:
    agent = make_agent(module_db, verbs=ALL_VERBS)
    other = make_agent(module_db)
    scoped = make_agent(module_db, verbs=ALL_VERBS, queues=["q"], endpoint=agent)
    todo_ids = []
    for queue in ("q", "q", "q", "q", "elsewhere"):  # the last is outside the scoped grant
        made = call_tool(app, agent.token, "create_todo", {"queue": queue, "title": "t"})
        todo_ids.append(json.loads(made[2])["result"]["structuredContent"]["todo"]["id"])
    session = initialize(app, agent.token)
    yield Target(app, agent.token, other.token, scoped.token, session, todo_ids)


# --- strategies -----------------------------------------------------------------------------

text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(ODD_TEXT),
    st.tuples(st.text(max_size=8), st.sampled_from(ODD_TEXT)).map("".join),
    st.integers(0, 70_000).map(lambda n: "x" * n),  # sizes up to past the 64 KiB body field
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**31), 2**31),
    st.integers(-(2**80), 2**80),
    st.floats(allow_nan=False, allow_infinity=False),
    text,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(text | st.sampled_from(ARGUMENT_NAMES), inner, max_size=4),
    ),
    max_leaves=12,
)


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


deep = st.integers(1, 600).map(nested)  # json.dumps in this test recurses too; raw bytes go deeper


def arguments(target: Target) -> st.SearchStrategy[Any]:
    ids = st.sampled_from([*target.todo_ids, str(uuid.uuid4()), "not-a-uuid"])
    plausible = st.fixed_dictionaries(
        {},
        optional={
            "id": ids,
            "attempt": st.integers(-2, 5) | st.integers(-(2**70), 2**70),
            "queue": st.sampled_from(["q", "q2", "", "-bad", "q" * 129]) | text,
            "queues": st.lists(st.sampled_from(["q", "q2"]) | text, max_size=3) | values,
            "title": text,
            "body": text,
            "payload": values | deep,
            "lease_seconds": st.integers(-5, 100_000) | values,
            "limit": st.integers(-5, 10**12) | values,
            "after": text,
            "error": text,
            "retry": values,
            "result": values | deep,
            "state": st.sampled_from(["pending", "claimed", "done", "nope"]) | text,
            "policy": st.fixed_dictionaries(
                {},
                optional={
                    "max_in_flight": values,
                    "max_claims_per_window": values,
                    "window": st.fixed_dictionaries(
                        {},
                        optional={
                            "period": st.sampled_from(["hour", "day", "week", "year"]) | text,
                            "tz": st.sampled_from(["UTC", "Mars/Olympus", "Europe/Paris"]) | text,
                            "start": st.sampled_from(["00:00", "24:00", "9:5"]) | text,
                            "weekday": st.sampled_from(["Mon", "Funday"]) | values,
                        },
                    )
                    | values,
                },
            )
            | values,
        },
    )
    return st.one_of(plausible, st.dictionaries(text, values, max_size=4), values)


def params(target: Target) -> st.SearchStrategy[Any]:
    meta = st.one_of(st.just(META), st.dictionaries(text, values, max_size=3), values)
    tool_call = st.fixed_dictionaries(
        {"name": st.sampled_from(TOOLS) | text},
        optional={"arguments": arguments(target), "_meta": meta},
    )
    initialize = st.fixed_dictionaries(
        {},
        optional={
            "protocolVersion": st.sampled_from(VERSIONS) | values,
            "capabilities": values,
            "clientInfo": values,
        },
    )
    listen = st.fixed_dictionaries({"_meta": meta}, optional={"notifications": values})
    return st.one_of(tool_call, initialize, listen, st.dictionaries(text, values), values)


def messages(target: Target) -> st.SearchStrategy[Any]:
    ids = st.one_of(
        st.integers(-(2**70), 2**70),
        text,
        st.none(),
        st.booleans(),
        st.floats(allow_nan=False),
        values,
    )
    message = st.fixed_dictionaries(
        {"method": st.sampled_from(METHODS) | text},
        optional={"jsonrpc": st.just("2.0") | values, "id": ids, "params": params(target)},
    ).map(lambda m: {"jsonrpc": "2.0", **m} if len(m) % 3 else m)  # usually well-versioned
    response = st.fixed_dictionaries({"jsonrpc": st.just("2.0"), "id": ids, "result": values})
    return st.one_of(message, message, response, st.lists(message | response, max_size=5), values)


def bodies(target: Target) -> st.SearchStrategy[bytes]:
    """A JSON body (escaped: lone surrogates arrive as \\udXXX), raw UTF-8 (surrogates as
    invalid bytes), or arbitrary bytes, deep nesting, truncated JSON."""
    encoded = messages(target).map(lambda m: json.dumps(m).encode())
    raw = messages(target).map(
        lambda m: json.dumps(m, ensure_ascii=False).encode("utf-8", "surrogatepass")
    )
    deep_raw = st.integers(1, 200_000).map(lambda n: b"[" * n + b"]" * n)
    truncated = encoded.flatmap(lambda b: st.integers(0, len(b)).map(lambda n: b[:n]))
    return st.one_of(encoded, encoded, raw, deep_raw, truncated, st.binary(max_size=64))


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=40).filter(
    lambda s: "\x7f" not in s
)


def headers(target: Target) -> st.SearchStrategy[dict[str, str]]:
    valid = f"Bearer {target.token}"
    return st.fixed_dictionaries(
        {
            "Authorization": st.sampled_from(
                [
                    valid,
                    valid,
                    valid,
                    f"Bearer {target.other_token}",
                    "Bearer sba_nope",
                    "Basic eA==",
                ]
            )
            | header_text.map("Bearer {}".format),
        },
        optional={
            "Content-Type": st.sampled_from(
                [
                    "application/json",
                    "application/json; charset=utf-8",
                    "text/plain",
                    "APPLICATION/JSON",
                    "",
                ]
            )
            | header_text,
            "Accept": st.sampled_from(
                ["application/json", "application/json, text/event-stream", "text/html", "*/*", ""]
            )
            | header_text,
            "Mcp-Session-Id": st.sampled_from([target.session, str(uuid.uuid4()), "nope", ""])
            | header_text,
            "MCP-Protocol-Version": st.sampled_from(VERSIONS) | header_text,
            "Mcp-Method": st.sampled_from(METHODS) | header_text,
            "Mcp-Name": st.sampled_from([*TOOLS, "=?base64?Y2xhaW0=?=", "=?base64?!!?="])
            | header_text,
            "Origin": st.sampled_from(
                ["http://localhost", "http://127.0.0.1:8080", "https://evil.example", "null", ""]
            )
            | header_text,
        },
    )


# --- sending --------------------------------------------------------------------------------

_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fuzz")


def send(app: Flask, method: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
    """One request under a deadline; an SSE stream is closed unread (it would never end)."""

    def request() -> tuple[int, str, bytes]:
        response = app.test_client().open(
            "/mcp", method=method, data=body, headers=headers, buffered=False
        )
        try:
            if response.mimetype == "text/event-stream":
                return response.status_code, response.mimetype, b""
            return response.status_code, response.mimetype, response.get_data()
        finally:
            response.close()

    future = _pool.submit(request)
    try:
        return future.result(timeout=REQUEST_SECONDS)
    except FutureTimeout:
        raise AssertionError(f"hang: no answer within {REQUEST_SECONDS} s") from None


def check(answer: tuple[int, str, bytes], context: Any) -> None:
    status, mimetype, data = answer
    assert status < 500, (status, data[:500], context)
    if status in (202, 204) or mimetype == "text/event-stream":
        return
    assert mimetype == "application/json", (status, mimetype, data[:200], context)
    decoded = json.loads(data)
    if status == 200:
        replies = decoded if isinstance(decoded, list) else [decoded]
        assert all(r.get("jsonrpc") == "2.0" for r in replies), (decoded, context)


FUZZ = settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


@FUZZ
@given(data=st.data())
def test_any_request_is_answered_below_500(target: Target, data: st.DataObject) -> None:
    method = data.draw(st.sampled_from(["POST"] * 8 + ["GET", "DELETE", "PUT", "PATCH"]))
    body = data.draw(bodies(target))
    sent = data.draw(headers(target))
    check(send(target.app, method, body, sent), (method, body[:300], sent))


def test_a_surrogate_encoded_in_the_bytes_is_a_parse_error(target: Target) -> None:
    """Found by the fuzzer above: a request id holding a surrogate as raw (CESU-8) bytes was
    echoed into an error body that could not be encoded (a 500)."""
    body = b'{"":"","id":"\xed\xa0\x80","":null}'
    headers = {"Authorization": f"Bearer {target.token}", "Content-Type": "application/json"}
    status, _, answer = send(target.app, "POST", body, headers)
    assert status == 400 and json.loads(answer)["error"]["code"] == -32700


@FUZZ
@given(data=st.data())
def test_tool_calls_with_hostile_arguments_are_answered_below_500(
    target: Target, data: st.DataObject
) -> None:
    """Well-formed envelopes (both eras), so the arguments reach every tool's validation and
    service code."""
    token = data.draw(st.sampled_from([target.token, target.scoped_token]))
    name = data.draw(st.sampled_from(TOOLS))
    args = data.draw(arguments(target))
    modern = data.draw(st.booleans())
    params = {"name": name, "arguments": args}
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    if modern:
        params["_meta"] = META
        headers.update(
            {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": name}
        )
    else:
        headers["Mcp-Session-Id"] = live_session(target.app, token)
    body = {
        "jsonrpc": "2.0",
        "id": data.draw(st.integers(0, 10**6)),
        "method": "tools/call",
        "params": params,
    }
    encoded = json.dumps(body).encode()
    answer = send(target.app, "POST", encoded, headers)
    check(answer, (name, encoded[:500]))
    # A tool's refusal is an isError result (200); arguments that are no object, -32602 (400).
    assert answer[0] in (200, 400), answer


@pytest.mark.parametrize("depth", [10, 500, 800, 900, 950, 975, 990, 1000, 5000, 100_000])
@pytest.mark.parametrize("where", ["payload", "result"])
def test_deep_nesting_is_refused_or_stored_never_500(
    target: Target, depth: int, where: str
) -> None:
    """As deep as the JSON parser takes (or deeper): refused, or stored and read back."""
    name, arguments = "create_todo", {"queue": "deep", "title": "t"}
    if where == "result":
        claimed = call(target, "claim_next", {"queues": ["deep"]})
        todo = json.loads(claimed[2])["result"]["structuredContent"].get("todo")
        if todo is None:
            call(target, "create_todo", {"queue": "deep", "title": "t"})
            claimed = call(target, "claim_next", {"queues": ["deep"]})
            todo = json.loads(claimed[2])["result"]["structuredContent"]["todo"]
        name, arguments = "complete", {"id": todo["id"], "attempt": todo["attempt"]}
    params = {"_meta": META, "name": name, "arguments": arguments}  # arguments last
    opened = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params})
    # The nested value is spliced in as text: json.dumps here would hit this test's recursion.
    value = '{"k": ' + "[" * depth + "1" + "]" * depth + "}"  # payload and result are objects
    body = opened[: -len("}}}")] + f', "{where}": {value}' + "}}}"
    answer = send(target.app, "POST", body.encode(), modern_headers(target.token, name))
    check(answer, (where, depth))
    stored = json.loads(answer[2]).get("result", {}).get("structuredContent", {}).get("todo")
    if stored is not None:
        check(call(target, "get_todo", {"id": stored["id"]}), ("get_todo", depth))
        check(call(target, "list_todos", {"queue": "deep"}), ("list_todos", depth))


def modern_headers(token: str, tool: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }


def call(target: Target, tool: str, arguments: dict[str, Any]) -> tuple[int, str, bytes]:
    return call_tool(target.app, target.token, tool, arguments)


def call_tool(
    app: Flask, token: str, tool: str, arguments: dict[str, Any]
) -> tuple[int, str, bytes]:
    """A stateless (2026-07-28) tools/call under the deadline."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": META},
    }
    return send(app, "POST", json.dumps(body).encode(), modern_headers(token, tool))


_sessions: dict[str, str] = {}


def live_session(app: Flask, token: str) -> str:
    """A session of the grant behind ``token`` that the fuzzer never names (so never ends)."""
    if token not in _sessions:
        _sessions[token] = initialize(app, token)
    return _sessions[token]
