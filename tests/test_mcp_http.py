"""Raw JSON-RPC over HTTP against ``switchboard serve`` (gunicorn, 2 workers): the protocol
envelope of every revision, auth, Origin/Host, sessions. R-MCP, R-SAFE (no input reaches a 500)."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
import requests

from tests.mcp_fixtures import ACCEPT, LEGACY, META, MODERN, Agent, Rpc, Served, revoke


def rpc_for(server: Served, agent: Agent | None) -> Rpc:
    return Rpc(server.url, agent)


def session_rpc(server: Served, agent: Agent, version: str = LEGACY) -> Rpc:
    rpc = rpc_for(server, agent)
    rpc.initialize(version)
    return rpc


def error_of(response: requests.Response) -> dict[str, Any]:
    body = response.json()
    assert body["jsonrpc"] == "2.0" and "result" not in body, body
    error: dict[str, Any] = body["error"]
    return error


# --- the envelope ---------------------------------------------------------------------------


@pytest.mark.parametrize("body", [b"{not json", b"", b'{"jsonrpc": "2.0", "id": NaN}', b"\xff"])
def test_malformed_json_is_a_parse_error_in_both_eras(
    mcp_server: Served, agent: Agent, body: bytes
) -> None:
    rpc = session_rpc(mcp_server, agent)
    for response in (rpc.legacy(body), rpc.post(body, {"MCP-Protocol-Version": MODERN})):
        assert response.status_code == 400
        assert response.json() == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": "Parse error: the body is not valid JSON"},
        }


@pytest.mark.parametrize(
    ("message", "echo"),
    [
        ({"id": 5, "method": "ping"}, 5),
        ({"jsonrpc": "1.0", "id": "x", "method": "ping"}, "x"),
        ({"jsonrpc": "2.0", "id": True, "method": "ping"}, None),
        ({"jsonrpc": "2.0", "id": None, "method": "ping"}, None),
        ({"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"}, None),
        ({"jsonrpc": "2.0", "id": 3, "method": 7}, 3),
        ({"jsonrpc": "2.0", "id": 4}, 4),
        ("ping", None),
        (42, None),
    ],
)
def test_not_jsonrpc_2_is_an_invalid_request(
    mcp_server: Served, agent: Agent, message: Any, echo: Any
) -> None:
    rpc = session_rpc(mcp_server, agent)
    response = rpc.legacy(message)
    assert response.status_code == 400
    assert response.json()["id"] == echo
    assert error_of(response)["code"] == -32600
    modern = rpc.post(message, {"MCP-Protocol-Version": MODERN, "Mcp-Method": "ping"})
    assert modern.status_code == 400 and error_of(modern)["code"] == -32600


def test_unknown_method_is_method_not_found(mcp_server: Served, agent: Agent) -> None:
    rpc = session_rpc(mcp_server, agent)
    legacy = rpc.request("prompts/list")  # no prompts here
    assert legacy.status_code == 200  # legacy: an answer in the session, not a transport error
    assert error_of(legacy)["code"] == -32601
    modern = rpc.modern("frobnicate/now", id="m")
    assert (modern.status_code, modern.json()["id"]) == (404, "m")
    assert error_of(modern)["code"] == -32601


def test_wrong_param_types_split_between_jsonrpc_and_tool_errors(
    mcp_server: Served, agent: Agent
) -> None:
    rpc = session_rpc(mcp_server, agent)
    as_list = rpc.legacy({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]})
    assert error_of(as_list)["code"] == -32602
    for params in ({"name": 5}, {"name": "whoami", "arguments": "x"}, {"arguments": {}}):
        response = rpc.request("tools/call", params)
        assert response.status_code == 200 and error_of(response)["code"] == -32602
    unknown = rpc.request("tools/call", {"name": "nope"})
    assert error_of(unknown) == {
        "code": -32602,
        "message": "Unknown tool: nope",
        "data": {"name": "nope"},
    }
    # Arguments the tool's inputSchema refuses are a tool error the model can read and fix.
    result = rpc.call("claim", {"id": 7, "lease_seconds": "long", "extra": True})
    assert result["isError"] is True
    error = result["structuredContent"]["error"]
    assert error["code"] == "invalid_params"
    assert set(error["details"]["fields"]) == {"id", "lease_seconds", "extra"}
    modern = rpc.modern("tools/call", {"name": "whoami", "arguments": [1]})
    assert modern.status_code == 400 and error_of(modern)["code"] == -32602


@pytest.mark.parametrize("request_id", [0, "0", "", "abc", -1, 1.5, 2**53])
def test_ids_are_echoed_exactly(mcp_server: Served, agent: Agent, request_id: Any) -> None:
    rpc = session_rpc(mcp_server, agent)
    legacy = rpc.legacy({"jsonrpc": "2.0", "id": request_id, "method": "ping"})
    assert legacy.json() == {"jsonrpc": "2.0", "id": request_id, "result": {}}
    modern = rpc.modern("tools/list", id=request_id)
    assert modern.status_code == 200 and modern.json()["id"] == request_id
    failed = rpc.modern("nope", id=request_id)
    assert failed.json()["id"] == request_id


def test_oversized_body_is_413_json(mcp_server: Served, agent: Agent) -> None:
    rpc = session_rpc(mcp_server, agent)
    huge = (
        b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"x": "'
        + b"a" * (2 * 1024 * 1024)
        + b'"}}'
    )
    response = rpc.legacy(huge)
    assert response.status_code == 413
    assert error_of(response)["code"] == -32600


def test_batches_only_where_the_revision_has_them(mcp_server: Served, agent: Agent) -> None:
    batch = [
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9}},
        {"jsonrpc": "2.0", "id": "w", "method": "tools/call", "params": {"name": "whoami"}},
        {"jsonrpc": "2.0", "id": 3, "method": "nope"},
        {"jsonrpc": "1.0", "id": 4, "method": "ping"},
    ]
    newer = session_rpc(mcp_server, agent)
    refused = newer.legacy(batch)
    assert refused.status_code == 400 and error_of(refused)["code"] == -32600
    modern = newer.post(batch, {"MCP-Protocol-Version": MODERN, "Mcp-Method": "ping"})
    assert modern.status_code == 400 and error_of(modern)["code"] == -32600

    old = session_rpc(mcp_server, agent, "2025-03-26")
    assert old.version == "2025-03-26"
    replies = old.legacy(batch).json()
    assert [r["id"] for r in replies] == [1, "w", 3, 4]
    assert replies[0]["result"] == {}
    assert replies[1]["result"]["content"][0]["type"] == "text"
    assert [r.get("error", {}).get("code") for r in replies[2:]] == [-32601, -32600]
    only_notes = old.legacy([{"jsonrpc": "2.0", "method": "notifications/initialized"}])
    assert only_notes.status_code == 202 and only_notes.content == b""
    assert old.legacy([]).status_code == 400


def test_initialize_negotiates_and_2025_03_26_has_no_structured_output(
    mcp_server: Served, agent: Agent
) -> None:
    unknown = rpc_for(mcp_server, agent)
    assert unknown.initialize("1999-01-01").json()["result"]["protocolVersion"] == LEGACY
    result = unknown.initialize(LEGACY).json()["result"]
    assert result["capabilities"] == {
        "tools": {"listChanged": False},
        "resources": {"subscribe": True, "listChanged": False},
    }
    assert result["serverInfo"]["name"] == "switchboard" and result["serverInfo"]["version"]
    old = session_rpc(mcp_server, agent, "2025-03-26")
    tools = old.request("tools/list").json()["result"]["tools"]
    assert tools and all("outputSchema" not in t and "title" not in t for t in tools)
    called = old.call("whoami")
    assert "structuredContent" not in called and called["content"][0]["type"] == "text"
    unserved = rpc_for(mcp_server, agent).post(
        {"jsonrpc": "2.0", "id": 1, "method": "ping"},
        {"MCP-Protocol-Version": "2024-11-05", "Mcp-Session-Id": old.session_id or ""},
    )
    assert unserved.status_code == 400 and error_of(unserved)["data"]["requested"] == "2024-11-05"


def test_http_details_content_type_accept_and_methods(mcp_server: Served, agent: Agent) -> None:
    rpc = session_rpc(mcp_server, agent)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    assert rpc.legacy(ping, **{"Content-Type": "text/plain"}).status_code == 415
    assert rpc.legacy(ping, Accept="text/html").status_code == 406
    assert rpc.legacy(ping, Accept="*/*").status_code == 200
    stream = requests.get(
        rpc.url, headers={**agent.headers, **rpc.session_headers(), "Accept": "application/json"}
    )
    assert stream.status_code == 406
    put = requests.put(rpc.url, headers=agent.headers)
    assert put.status_code == 405
    for method in ("GET", "DELETE"):
        modern = requests.request(
            method, rpc.url, headers={**agent.headers, "MCP-Protocol-Version": MODERN}
        )
        assert modern.status_code == 405 and modern.headers["Allow"] == "POST"


# --- 2026-07-28 -----------------------------------------------------------------------------


def test_modern_envelope_and_routing_headers(mcp_server: Served, agent: Agent) -> None:
    rpc = rpc_for(mcp_server, agent)
    discover = rpc.modern("server/discover").json()["result"]
    assert discover["supportedVersions"] == [MODERN]
    assert discover["resultType"] == "complete" and discover["cacheScope"] == "private"
    assert discover["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "switchboard"
    listed = rpc.modern("tools/list").json()["result"]
    assert listed["ttlMs"] >= 0 and listed["tools"][0]["name"] == "whoami"

    def status(response: requests.Response) -> tuple[int, int]:
        return response.status_code, error_of(response)["code"]

    bare = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    routing = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}
    assert status(rpc.post(bare, routing)) == (400, -32602)
    no_caps = {**bare, "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}}}
    assert status(rpc.post(no_caps, routing)) == (400, -32602)
    assert status(rpc.modern("tools/list", **{"Mcp-Method": "prompts/list"})) == (400, -32020)
    assert status(rpc.modern("tools/list", **{"Mcp-Method": "TOOLS/LIST"})) == (400, -32020)
    wrong_name = rpc.modern("tools/call", {"name": "whoami"}, **{"Mcp-Name": "claim"})
    assert status(wrong_name) == (400, -32020)
    body = {
        "jsonrpc": "2.0",
        "id": 2,
        "method": "tools/call",
        "params": {"name": "whoami", "_meta": META},
    }
    headers = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call"}
    assert status(rpc.post(body, headers)) == (400, -32020)  # Mcp-Name missing
    spaced = rpc.post(body, {**headers, "Mcp-Name": "whoami  ", "mcp-method": "tools/call\t"})
    assert spaced.status_code == 200 and not spaced.json()["result"]["isError"]
    encoded = "=?base64?" + base64.b64encode(b"whoami").decode() + "?="
    assert rpc.post(body, {**headers, "Mcp-Name": encoded}).status_code == 200
    v999 = {**body, "params": {**body["params"], "_meta": {**META, META_VERSION: "v999"}}}
    unsupported = rpc.post(v999, {**headers, "Mcp-Name": "whoami", "MCP-Protocol-Version": "v999"})
    assert status(unsupported) == (400, -32022)
    assert error_of(unsupported)["data"] == {"supported": [MODERN], "requested": "v999"}
    assert status(rpc.post(v999, {**headers, "Mcp-Name": "whoami"})) == (400, -32020)
    for removed in ("initialize", "ping", "logging/setLevel", "resources/subscribe"):
        assert status(rpc.modern(removed)) == (404, -32601)
    note = rpc.post(
        {"jsonrpc": "2.0", "method": "notifications/cancelled"}, {"MCP-Protocol-Version": MODERN}
    )
    assert note.status_code == 202


META_VERSION = "io.modelcontextprotocol/protocolVersion"


# --- auth, origin, host -------------------------------------------------------------------


def test_every_request_needs_a_live_grant_token(
    mcp_server: Served, agent_factory: Callable[..., Agent], mcp_db: str
) -> None:
    agent = agent_factory()
    rpc = session_rpc(mcp_server, agent)
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    for authorization, challenge in (
        (None, 'Bearer realm="switchboard"'),
        ("Bearer sba_nope", 'Bearer realm="switchboard", error="invalid_token"'),
        ("Bearer sbo_human-token", 'Bearer realm="switchboard", error="invalid_token"'),
        ("Basic dXNlcjpwYXNz", 'Bearer realm="switchboard"'),
    ):
        headers = {"Content-Type": "application/json", **rpc.session_headers()}
        if authorization:
            headers["Authorization"] = authorization
        response = requests.post(rpc.url, json=ping, headers=headers)
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"] == challenge
        assert response.json()["id"] == 1
    assert rpc.legacy(ping).status_code == 200
    revoke(mcp_db, agent)
    assert rpc.legacy(ping).status_code == 401  # the session does not authenticate
    assert rpc.modern("tools/list").status_code == 401


def test_a_session_belongs_to_the_grant_that_made_it(
    mcp_server: Served, agent: Agent, agent_factory: Callable[..., Agent]
) -> None:
    rpc = session_rpc(mcp_server, agent)
    sibling = agent_factory(endpoint=agent)  # same endpoint, another grant
    stranger = agent_factory()
    for other in (sibling, stranger):
        borrowed = rpc_for(mcp_server, other)
        response = borrowed.post(
            {"jsonrpc": "2.0", "id": 1, "method": "ping"}, rpc.session_headers()
        )
        assert response.status_code == 404
        ended = requests.delete(rpc.url, headers={**other.headers, **rpc.session_headers()})
        assert ended.status_code == 404
    assert rpc.request("ping").status_code == 200
    missing = rpc.post({"jsonrpc": "2.0", "id": 2, "method": "ping"})
    assert (missing.status_code, missing.json()["id"]) == (400, 2)
    junk = rpc.post({"jsonrpc": "2.0", "id": 3, "method": "ping"}, {"Mcp-Session-Id": "x y"})
    assert junk.status_code == 404
    assert requests.get(rpc.url, headers={**agent.headers, "Accept": ACCEPT}).status_code == 400


def test_origin_and_host_are_checked(mcp_server: Served, agent: Agent) -> None:
    rpc = session_rpc(mcp_server, agent)
    port = mcp_server.base.rsplit(":", 1)[1]
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    allowed = [
        {"Origin": mcp_server.base},
        {"Origin": "https://agents.example.com"},
        {"Origin": "https://AGENTS.example.com:443"},
        {"Host": f"localhost:{port}"},
        {"Host": "[::1]"},
    ]
    for headers in allowed:
        assert rpc.legacy(ping, **headers).status_code == 200, headers
    refused = [
        ({"Origin": "http://evil.example.com"}, 403),
        ({"Origin": f"https://127.0.0.1:{port}"}, 403),  # another scheme is another origin
        ({"Origin": "null"}, 403),
        ({"Host": "evil.example.com", "Origin": "http://evil.example.com"}, 403),
        ({"Host": f"evil.example.com:{port}"}, 421),
    ]
    for headers, code in refused:
        response = rpc.legacy(ping, **headers)
        assert response.status_code == code, headers
        assert error_of(response)["code"] == -32600


# --- outputs --------------------------------------------------------------------------------


def test_every_result_matches_its_output_schema(mcp_server: Served, agent: Agent) -> None:
    rpc = session_rpc(mcp_server, agent)
    schemas = {
        t["name"]: t["outputSchema"] for t in rpc.request("tools/list").json()["result"]["tools"]
    }
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER

    def check(name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        result = rpc.call(name, arguments)
        assert not result["isError"], result
        jsonschema.validate(result["structuredContent"], schemas[name], format_checker=checker)
        return dict(result["structuredContent"])

    check("whoami")
    made = check("create_todo", {"queue": "q", "title": "t", "payload": {"k": [1]}})["todo"]
    check("get_todo", {"id": made["id"]})
    page = check("list_todos", {"limit": 1})
    assert page["next"] is not None
    assert check("list_todos", {"limit": 1, "after": page["next"]})["next"] is None
    claimed = check("claim_next")["todo"]
    check("heartbeat", {"id": claimed["id"], "attempt": claimed["attempt"], "lease_seconds": 60})
    check("release", {"id": claimed["id"], "attempt": claimed["attempt"]})
    again = check("claim", {"id": made["id"]})["todo"]
    check("fail", {"id": made["id"], "attempt": again["attempt"], "error": "e", "retry": False})
    assert check("claim_next") == {"empty": True}
    other = check("create_todo", {"queue": "q", "title": "u"})["todo"]
    claim = check("claim", {"id": other["id"]})["todo"]
    check("complete", {"id": other["id"], "attempt": claim["attempt"], "result": [1, "two"]})
    bad_cursor = rpc.call("list_todos", {"after": "not-a-cursor"})
    assert bad_cursor["structuredContent"]["error"]["details"]["fields"] == {
        "after": ["not a cursor returned by list_todos"]
    }


# --- R-SAFE ---------------------------------------------------------------------------------


def test_no_input_reaches_a_500(mcp_server: Served, agent: Agent) -> None:
    rpc = session_rpc(mcp_server, agent)
    bodies: list[Any] = [
        None,
        [],
        [[]],
        {},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": None},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "x" * 10000}},
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "get_todo", "arguments": {"id": "\u0000"}},
        },
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "create_todo",
                "arguments": {"queue": "q", "title": "\u0000", "payload": {"\u0000": 1}},
            },
        },
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "list_todos", "arguments": {"limit": 10**30}},
        },
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "claim_next", "arguments": {"queues": [None, 1]}},
        },
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {
                "name": "complete",
                "arguments": {"id": "00000000-0000-0000-0000-000000000000", "attempt": 2**40},
            },
        },
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"clientInfo": 5}},
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": []},
        {"jsonrpc": "2.0", "method": "initialize"},
    ]
    raw = [
        b"[" * 100000,
        b"1" * 5000,
        '{"a": "\ud800"}'.encode("utf-8", "surrogatepass"),
        b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "create_todo",'
        b' "arguments": {"queue": "q", "title": "\\ud800"}}}',
        b'{"jsonrpc": "2.0", "id": "\\udfff", "method": "x\\ud800"}',
        b'{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion":'
        b' "2025-11-25", "capabilities": {}, "clientInfo": {"name": "\\u0000"}}}',
    ]
    for body in bodies + raw:
        for headers in ({}, {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call"}):
            response = rpc.legacy(body, **headers)
            assert response.status_code < 500, (body, response.text)
            assert response.headers["Content-Type"].startswith("application/json") or (
                response.status_code == 202
            )
