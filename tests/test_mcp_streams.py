"""MCP streams (the legacy GET stream and 2026-07-28 ``subscriptions/listen``) and sessions
across containers: real SSE with keep-alives, ended by DELETE or revocation, bounded per worker
without holding a database connection; any worker of any container serves any session."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.mcp_fixtures import (
    ACCEPT,
    LEGACY,
    META,
    MODERN,
    Agent,
    Rpc,
    Served,
    revoke,
    start_switchboard,
)

KEEPALIVE = b": keep-alive\n\n"


def open_get_stream(rpc: Rpc, *, patience: float = 5.0) -> requests.Response:
    """The session's GET stream. A worker whose stream slots are all taken answers 503 with
    Retry-After (streams of earlier clients free their slot about a second after hang-up on
    this shared server), so retry like a client would, for at most ``patience`` seconds."""
    assert rpc.agent is not None
    deadline = time.monotonic() + patience
    while True:
        response = requests.get(
            rpc.url,
            headers={**rpc.agent.headers, **rpc.session_headers(), "Accept": "text/event-stream"},
            stream=True,
            timeout=(5, 5),
        )
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        response.close()
        time.sleep(0.2)


def open_listen_stream(url: str, agent: Agent, listen_id: Any) -> requests.Response:
    body = {
        "jsonrpc": "2.0",
        "id": listen_id,
        "method": "subscriptions/listen",
        "params": {"_meta": META, "notifications": {"toolsListChanged": True}},
    }
    headers = {
        **agent.headers,
        "Content-Type": "application/json",
        "Accept": ACCEPT,
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "subscriptions/listen",
    }
    return requests.post(url, json=body, headers=headers, stream=True, timeout=(5, 5))


def chunks(response: requests.Response) -> Iterator[bytes]:
    return response.iter_content(chunk_size=None)


def event(chunk: bytes) -> dict[str, Any]:
    """The JSON-RPC message of one SSE event."""
    lines = chunk.decode().strip().split("\n")
    assert lines[0] == "event: message", chunk
    message: dict[str, Any] = json.loads(lines[1].removeprefix("data: "))
    return message


def test_get_stream_keeps_alive_and_ends_when_the_session_is_deleted(
    mcp_server: Served, agent: Agent
) -> None:
    rpc = Rpc(mcp_server.url, agent)
    rpc.initialize()
    with open_get_stream(rpc) as stream:
        assert stream.status_code == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        assert stream.headers["Cache-Control"] == "no-cache, no-transform"
        received = chunks(stream)
        assert next(received) == b": stream open\n\n"
        assert next(received) == KEEPALIVE  # a second later, nothing else to say
        assert rpc.call("whoami")["isError"] is False  # the session works meanwhile
        ended = requests.delete(rpc.url, headers={**agent.headers, **rpc.session_headers()})
        assert ended.status_code == 204
        started = time.monotonic()
        rest = list(received)  # the stream ends (this worker at once, another within 1 s)
        assert time.monotonic() - started < 3
        assert all(chunk == KEEPALIVE for chunk in rest)


def test_listen_stream_acknowledges_keeps_alive_and_ends_on_revocation(
    mcp_server: Served, agent_factory: Callable[..., Agent], mcp_db: str
) -> None:
    agent = agent_factory()
    with open_listen_stream(mcp_server.url, agent, "listen-1") as stream:
        assert stream.status_code == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        received = chunks(stream)
        ack = event(next(received))
        assert ack == {
            "jsonrpc": "2.0",
            "method": "notifications/subscriptions/acknowledged",
            "params": {
                "_meta": {"io.modelcontextprotocol/subscriptionId": "listen-1"},
                "notifications": {},  # nothing is subscribable before doorbells (R-BELL)
            },
        }
        assert next(received) == KEEPALIVE
        revoke(mcp_db, agent)
        rest = list(received)
        assert event(rest[-1]) == {
            "jsonrpc": "2.0",
            "id": "listen-1",
            "result": {
                "resultType": "complete",
                "_meta": {"io.modelcontextprotocol/subscriptionId": "listen-1"},
            },
        }
        assert set(rest[:-1]) <= {KEEPALIVE}


def test_listen_needs_an_event_stream_accept(mcp_server: Served, agent: Agent) -> None:
    rpc = Rpc(mcp_server.url, agent)
    response = rpc.modern("subscriptions/listen", {"notifications": {}}, Accept="application/json")
    assert response.status_code == 406
    bad = rpc.modern("subscriptions/listen", {"notifications": []})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == -32602


@pytest.fixture(scope="module")
def narrow_server(mcp_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One worker, one stream slot, ONE pooled database connection, a minute between
    keep-alives."""
    served = start_switchboard(
        mcp_db,
        tmp_path_factory.mktemp("mcp-narrow"),
        SWITCHBOARD_WORKERS="1",
        SWITCHBOARD_MCP_STREAMS="1",
        SWITCHBOARD_POOL_MAX="1",
        SWITCHBOARD_MCP_KEEPALIVE_SECONDS="60",  # no write will reveal a hang-up in time
    )
    yield served
    served.stop()


def test_streams_are_bounded_and_hold_no_connection_while_idle(
    narrow_server: Served, agent: Agent
) -> None:
    rpc = Rpc(narrow_server.url, agent)
    rpc.initialize()
    with open_get_stream(rpc) as first:
        assert first.status_code == 200
        received = chunks(first)
        next(received)
        over = open_get_stream(rpc, patience=0)
        assert over.status_code == 503
        assert over.headers["Retry-After"] == "5"
        assert over.json()["error"]["code"] == -32603
        listen = open_listen_stream(narrow_server.url, agent, 9)
        assert listen.status_code == 503 and listen.json()["id"] == 9
        # The open stream holds a thread but not the worker's only database connection.
        for _ in range(5):
            started = time.monotonic()
            assert rpc.call("create_todo", {"queue": "q", "title": "t"})["isError"] is False
            assert time.monotonic() - started < 2
    # The client hung up: the idle stream notices within a second and frees its slot.
    deadline = time.monotonic() + 3
    while True:
        again = open_get_stream(rpc, patience=0)
        if again.status_code == 200:
            again.close()
            break
        assert time.monotonic() < deadline, "the stream slot was never released"
        time.sleep(0.3)


def test_any_worker_of_any_container_serves_any_session(
    mcp_server: Served, mcp_db: str, agent: Agent, tmp_path: Path
) -> None:
    """Two `switchboard serve` instances (two containers of 2 workers each) on one database."""
    other = start_switchboard(mcp_db, tmp_path)
    try:
        here = Rpc(mcp_server.url, agent)
        here.initialize()
        there = Rpc(other.url, agent)
        there.session_id, there.version = here.session_id, here.version
        made = there.call("create_todo", {"queue": "q", "title": "across"})
        todo_id = made["structuredContent"]["todo"]["id"]
        for index in range(8):  # new connections, alternating containers
            rpc = (here, there)[index % 2]
            response = rpc.request(
                "tools/call", {"name": "get_todo", "arguments": {"id": todo_id}}, Connection="close"
            )
            assert response.status_code == 200 and not response.json()["result"]["isError"]
        with open_get_stream(here) as stream:
            received = chunks(stream)
            next(received)
            ended = requests.delete(other.url, headers={**agent.headers, **there.session_headers()})
            assert ended.status_code == 204
            started = time.monotonic()
            list(received)  # the stream on the other container notices within a keep-alive
            assert time.monotonic() - started < 3
        for rpc in (here, there):
            assert rpc.request("ping").status_code == 404
    finally:
        other.stop()


def test_the_version_header_of_a_session_request_is_checked(
    mcp_server: Served, agent: Agent
) -> None:
    rpc = Rpc(mcp_server.url, agent)
    rpc.initialize()
    assert rpc.request("ping", **{"MCP-Protocol-Version": LEGACY}).status_code == 200
    assert rpc.request("ping", **{"MCP-Protocol-Version": "2025-06-18"}).status_code == 200
    stale = rpc.request("ping", **{"MCP-Protocol-Version": "2024-11-05"})
    assert stale.status_code == 400
