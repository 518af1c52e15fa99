"""The official MCP Python SDK (``mcp`` 2.x) against ``switchboard serve`` (gunicorn, 2 workers),
in both client modes: ``auto`` (probes ``server/discover``, so it speaks 2026-07-28) and
``legacy`` (``initialize`` and a session). R-MCP, Appendix A."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx2
import jsonschema
import pytest
import requests
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.mcp_fixtures import LEGACY, MODERN, Agent, Served

MODES = [pytest.param("auto", id="auto"), pytest.param("legacy", id="legacy")]
EXPECTED_VERSION = {"auto": MODERN, "legacy": LEGACY}

Body = Callable[[Client], Awaitable[Any]]


@dataclass
class Exchange:
    """One HTTP exchange the SDK client made: method, status and the session header."""

    method: str
    status: int
    session: str | None


def with_client(
    server: Served,
    headers: dict[str, str],
    mode: str,
    body: Body,
    *,
    seen: list[Exchange] | None = None,
) -> Any:
    """Run ``body(client)`` inside a connected SDK client (bearer header on the HTTP client),
    recording its HTTP exchanges in ``seen``."""

    async def record(response: httpx2.Response) -> None:
        if seen is not None:
            session = response.headers.get("Mcp-Session-Id") or response.request.headers.get(
                "Mcp-Session-Id"
            )
            seen.append(Exchange(response.request.method, response.status_code, session))

    async def main() -> Any:
        hooks = {"response": [record]}
        async with httpx2.AsyncClient(headers=headers, timeout=30, event_hooks=hooks) as http:
            transport = streamable_http_client(server.url, http_client=http)
            async with Client(transport, mode=mode) as client:  # type: ignore[arg-type]
                assert client.protocol_version == EXPECTED_VERSION[mode]
                return await body(client)

    return asyncio.run(main())


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in leaves(inner)]
    return [error]


async def call(client: Client, name: str, arguments: dict[str, Any] | None = None) -> Any:
    result = await client.call_tool(name, arguments or {})
    return result


async def ok(client: Client, name: str, arguments: dict[str, Any] | None = None) -> Any:
    """A successful call's structured content (also the JSON in its text content)."""
    result = await call(client, name, arguments)
    assert not result.is_error, result
    assert json.loads(result.content[0].text) == result.structured_content
    return result.structured_content


async def refused(client: Client, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool error's ``error`` object."""
    result = await call(client, name, arguments)
    assert result.is_error, result
    error: dict[str, Any] = result.structured_content["error"]
    return error


@pytest.mark.parametrize("mode", MODES)
def test_tools_list_shows_granted_tools_with_schemas(
    mcp_server: Served, agent: Agent, mode: str
) -> None:
    async def body(client: Client) -> Any:
        return (await client.list_tools()).tools

    tools = with_client(mcp_server, agent.headers, mode, body)
    assert [t.name for t in tools] == agent.verbs
    for t in tools:
        assert t.description and t.title
        assert t.input_schema["type"] == "object"
        assert t.output_schema is not None and t.output_schema["type"] == "object"
        jsonschema.Draft202012Validator.check_schema(t.input_schema)
        jsonschema.Draft202012Validator.check_schema(t.output_schema)
        assert t.annotations is not None
    hints = {t.name: t.annotations for t in tools}
    assert hints["get_todo"].read_only_hint is True
    assert hints["heartbeat"].idempotent_hint is True
    assert hints["create_todo"].destructive_hint is False
    assert hints["complete"].destructive_hint is True


@pytest.mark.parametrize("mode", MODES)
def test_claim_heartbeat_complete(mcp_server: Served, agent: Agent, mode: str) -> None:
    async def body(client: Client) -> None:
        me = await ok(client, "whoami")
        assert me == {"endpoint": agent.endpoint, "verbs": agent.verbs, "queues": None}
        created = (await ok(client, "create_todo", {"queue": "build", "title": "compile"}))["todo"]
        assert created["state"] == "pending" and created["endpoint"] == agent.endpoint
        assert created["created_at"].endswith("Z")
        claimed = await ok(client, "claim_next", {"queues": ["build"], "lease_seconds": 30})
        todo = claimed["todo"]
        assert "admission" not in claimed  # no policy on this queue
        assert (todo["id"], todo["state"], todo["attempt"]) == (created["id"], "claimed", 1)
        beat = (await ok(client, "heartbeat", {"id": todo["id"], "attempt": 1}))["todo"]
        assert beat["lease_expires_at"] >= todo["lease_expires_at"]
        done = await ok(client, "complete", {"id": todo["id"], "attempt": 1, "result": {"ok": 1}})
        assert (done["todo"]["state"], done["todo"]["result"]) == ("done", {"ok": 1})
        assert (await ok(client, "get_todo", {"id": todo["id"]}))["todo"]["state"] == "done"
        assert await ok(client, "claim_next") == {"empty": True}

    with_client(mcp_server, agent.headers, mode, body)


@pytest.mark.parametrize("mode", MODES)
def test_fail_retries_release_and_stale_attempt(
    mcp_server: Served, agent: Agent, mode: str
) -> None:
    async def body(client: Client) -> None:
        made = (await ok(client, "create_todo", {"queue": "q", "title": "flaky"}))["todo"]
        first = (await ok(client, "claim", {"id": made["id"]}))["todo"]
        failed = (await ok(client, "fail", {"id": made["id"], "attempt": 1, "error": "boom"}))[
            "todo"
        ]
        assert (failed["state"], failed["last_error"]) == ("retry_wait", "boom")
        assert failed["retry_at"] > first["claimed_at"]
        # Not due yet: nothing to claim, and claiming it by id is a conflict.
        assert await ok(client, "claim_next") == {"empty": True}
        conflict = await refused(client, "claim", {"id": made["id"]})
        assert conflict["code"] == "conflict"

        other = (await ok(client, "create_todo", {"queue": "q", "title": "handed back"}))["todo"]
        claim = (await ok(client, "claim_next"))["todo"]
        assert claim["id"] == other["id"]
        released = await ok(client, "release", {"id": other["id"], "attempt": 1})
        assert released["todo"]["state"] == "pending"
        stale = await refused(client, "complete", {"id": other["id"], "attempt": 1})
        assert stale["code"] == "conflict"
        assert stale["details"] == {"state": "pending", "attempt": 1}
        again = (await ok(client, "claim_next"))["todo"]
        assert (again["id"], again["attempt"]) == (other["id"], 2)
        old = await refused(client, "heartbeat", {"id": other["id"], "attempt": 1})
        assert old["code"] == "conflict"
        missing = await refused(client, "get_todo", {"id": "00000000-0000-0000-0000-000000000000"})
        assert missing["code"] == "not_found"
        bad = await refused(client, "fail", {"id": other["id"], "attempt": "two", "error": ""})
        assert bad["code"] == "invalid_params"
        assert set(bad["details"]["fields"]) == {"attempt", "error"}

    with_client(mcp_server, agent.headers, mode, body)


@pytest.mark.parametrize("mode", MODES)
def test_ungranted_verbs_are_absent_and_forbidden(
    mcp_server: Served, agent_factory: Callable[..., Agent], mode: str
) -> None:
    basic = agent_factory(verbs=["whoami", "create_todo", "get_todo", "list_todos"])

    async def body(client: Client) -> Any:
        names = [t.name for t in (await client.list_tools()).tools]
        error = await refused(client, "claim_next", {})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("no_such_tool", {})
        return names, error, unknown.value.error.code

    names, error, code = with_client(mcp_server, basic.headers, mode, body)
    assert names == ["whoami", "create_todo", "get_todo", "list_todos"]
    assert error["code"] == "forbidden"
    assert code == -32602


@pytest.mark.parametrize("mode", MODES)
def test_queues_outside_the_grant_are_invisible(
    mcp_server: Served, agent: Agent, agent_factory: Callable[..., Agent], mode: str
) -> None:
    narrow = agent_factory(queues=["mine"], endpoint=agent)
    stranger = agent_factory()

    async def make(client: Client) -> list[str]:
        return [
            (await ok(client, "create_todo", {"queue": q, "title": q}))["todo"]["id"]
            for q in ("mine", "theirs")
        ]

    mine, theirs = with_client(mcp_server, agent.headers, mode, make)

    async def narrow_view(client: Client) -> None:
        assert (await refused(client, "get_todo", {"id": theirs}))["code"] == "not_found"
        assert (await ok(client, "get_todo", {"id": mine}))["todo"]["queue"] == "mine"
        listed = await ok(client, "list_todos", {})
        assert [t["id"] for t in listed["todos"]] == [mine]
        denied = await refused(client, "create_todo", {"queue": "theirs", "title": "x"})
        assert denied["code"] == "forbidden"
        assert (await ok(client, "claim_next", {"queues": ["theirs"]})) == {"empty": True}
        assert (await ok(client, "claim_next"))["todo"]["id"] == mine

    with_client(mcp_server, narrow.headers, mode, narrow_view)

    async def stranger_view(client: Client) -> None:
        assert (await refused(client, "get_todo", {"id": theirs}))["code"] == "not_found"
        assert (await refused(client, "claim", {"id": theirs}))["code"] == "not_found"
        other = await refused(
            client, "create_todo", {"queue": "q", "title": "t", "endpoint": agent.endpoint}
        )
        assert other["code"] == "not_found"

    with_client(mcp_server, stranger.headers, mode, stranger_view)


@pytest.mark.parametrize("mode", MODES)
def test_no_token_is_401(mcp_server: Served, mode: str) -> None:
    seen: list[Exchange] = []

    async def body(client: Client) -> None:
        raise AssertionError("connected without a token")

    with pytest.raises(BaseException) as caught:
        with_client(mcp_server, {}, mode, body, seen=seen)
    [error] = leaves(caught.value)  # the SDK wraps it in task-group exception groups
    assert isinstance(error, MCPError) and "token" in error.error.message
    assert seen and {e.status for e in seen} == {401}
    raw = requests.post(mcp_server.url, json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert raw.status_code == 401
    assert raw.headers["WWW-Authenticate"] == 'Bearer realm="switchboard"'
    assert raw.json()["error"]["code"] == -32600 and raw.json()["id"] == 1


def test_delete_ends_the_session_for_every_worker(mcp_server: Served, agent: Agent) -> None:
    seen: list[Exchange] = []

    async def body(client: Client) -> None:
        await ok(client, "whoami")

    with_client(mcp_server, agent.headers, "legacy", body, seen=seen)
    [session] = {e.session for e in seen if e.session}
    assert [e.status for e in seen if e.method == "DELETE"] == [204]
    headers = {**agent.headers, "Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY}
    for _ in range(4):  # a new connection each time: both workers answer
        gone = requests.post(
            mcp_server.url, json={"jsonrpc": "2.0", "id": 7, "method": "ping"}, headers=headers
        )
        assert (gone.status_code, gone.json()["id"]) == (404, 7)


def test_unknown_session_is_404_and_the_client_sees_it(mcp_server: Served, agent: Agent) -> None:
    seen: list[Exchange] = []

    async def body(client: Client) -> int:
        await ok(client, "whoami")
        [session] = {e.session for e in seen if e.session}
        # End the session from elsewhere (another connection, maybe another worker).
        ended = requests.delete(
            mcp_server.url,
            headers={**agent.headers, "Mcp-Session-Id": session, "MCP-Protocol-Version": LEGACY},
        )
        assert ended.status_code == 204
        with pytest.raises(MCPError) as caught:
            await client.call_tool("whoami", {})
        return caught.value.error.code

    code = with_client(mcp_server, agent.headers, "legacy", body, seen=seen)
    assert code is not None
    assert 404 in [e.status for e in seen if e.method == "POST"]
    unknown = {
        **agent.headers,
        "Mcp-Session-Id": "5d6b8f64-6a61-4b6d-8f5e-9c1d2f3a4b5c",
        "MCP-Protocol-Version": LEGACY,
    }
    response = requests.post(
        mcp_server.url, json={"jsonrpc": "2.0", "id": 8, "method": "ping"}, headers=unknown
    )
    assert response.status_code == 404
