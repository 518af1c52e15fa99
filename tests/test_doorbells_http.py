"""Doorbells end to end (SPEC §7 R-BELL, R-GATE, R-REOPEN; R-SCHED): ``switchboard serve``
(gunicorn, 2 workers), agents attached with the official MCP SDK client in both eras, notify
hooks served by a local HTTP server, and two serving processes sharing one database. Windows
roll by passing a later ``now`` to the reopen check, never by sleeping."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import math
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx2
import psycopg
import pytest
import requests
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPDeprecationWarning

from switchboard import doorbells
from switchboard.admission import windows
from switchboard.admission.windows import Window
from switchboard.scheduler import LEADER_LOCK
from tests.mcp_fixtures import MODERN, Agent, Rpc, Served, make_agent, start_switchboard

MODES = [pytest.param("auto", id="modern"), pytest.param("legacy", id="legacy")]
UTC_DAY = Window(period="day", tz="UTC", start="00:00", weekday=None)


# --- helpers -------------------------------------------------------------------------------------


def create(server: Served, agent: Agent, queue: str = "q", n: int = 1) -> None:
    with requests.Session() as http:
        rpc = Rpc(server.url, agent, http)
        for i in range(n):
            response = rpc.modern("tools/call", {"name": "create_todo", "arguments": {
                "queue": queue, "title": f"t{i}"}})  # fmt: skip
            assert response.status_code == 200 and not response.json()["result"].get("isError")


def tool(server: Served, agent: Agent, name: str, **arguments: Any) -> dict[str, Any]:
    with requests.Session() as http:
        response = Rpc(server.url, agent, http).modern(
            "tools/call", {"name": name, "arguments": arguments}
        )
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]["structuredContent"]
    return result


def set_policy(database_url: str, agent: Agent, **policy: Any) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO admission_policies (endpoint_id, queue, max_in_flight,"
            " max_claims_per_window, window_period, window_tz, window_start,"
            " created_by_human_id, updated_by_human_id)"
            " SELECT e.id, 'q', %(cap)s, %(limit)s, %(period)s, %(tz)s, %(start)s,"
            " e.owner_human_id, e.owner_human_id FROM endpoints e WHERE e.id = %(id)s",
            {
                "id": agent.endpoint_id,
                "cap": policy.get("max_in_flight"),
                "limit": policy.get("max_claims_per_window"),
                "period": "day" if "max_claims_per_window" in policy else None,
                "tz": "UTC" if "max_claims_per_window" in policy else None,
                "start": "00:00" if "max_claims_per_window" in policy else None,
            },
        )


def exhaust_today(database_url: str, agent: Agent) -> None:
    """A daily limit of 1 in UTC, already used in today's window."""
    set_policy(database_url, agent, max_claims_per_window=1)
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "INSERT INTO admission_windows (policy_id, window_start, used)"
            " SELECT id, %s, 1 FROM admission_policies WHERE endpoint_id = %s",
            (windows.window_start(UTC_DAY, datetime.now(UTC)), agent.endpoint_id),
        )


def roll_over(database_url: str, agent: Agent) -> None:
    """The reopen check as the first tick of tomorrow's window would run it."""
    tomorrow = windows.next_boundary(UTC_DAY, datetime.now(UTC)) + timedelta(seconds=1)
    with psycopg.connect(database_url) as conn:
        doorbells.reopen_queue(conn, endpoint_id=agent.endpoint_id, queue="q", now=tomorrow)


def with_hook(database_url: str, agent: Agent, url: str) -> str:
    """Point the endpoint's notify_url at ``url``; returns its signing secret."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "UPDATE endpoints SET notify_url = %s WHERE id = %s RETURNING notify_secret",
            (url, agent.endpoint_id),
        ).fetchone()
    assert row is not None
    return str(row[0])


def attached(database_url: str, agent: Agent) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM mcp_streams WHERE endpoint_id = %s", (agent.endpoint_id,)
        ).fetchone()
    return int(row[0]) if row else 0


def ring_count(database_url: str, agent: Agent) -> int:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM todo_ready_rings WHERE endpoint_id = %s", (agent.endpoint_id,)
        ).fetchone()
    return int(row[0]) if row else 0


@dataclass
class Heard:
    """Doorbells one attached SDK client heard: (seconds since the test began, uri)."""

    started: float = field(default_factory=time.monotonic)
    events: list[tuple[float, str]] = field(default_factory=list)

    def note(self, uri: str) -> None:
        self.events.append((time.monotonic() - self.started, uri))

    def since(self, moment: float) -> list[tuple[float, str]]:
        return [event for event in self.events if event[0] >= moment]

    def now(self) -> float:
        return time.monotonic() - self.started


Step = Callable[[Heard], None]


def attach_and_run(
    server: Served, database_url: str, agent: Agent, mode: str, uri: str, script: Step
) -> Heard:
    """Attach an SDK client subscribed to ``uri`` (legacy: resources/subscribe and the GET
    stream; modern: subscriptions/listen), wait until its presence is recorded, then run
    ``script`` in a thread while doorbells are collected."""
    heard = Heard()

    async def on_message(message: Any) -> None:
        if getattr(message, "method", None) == "notifications/resources/updated":
            heard.note(message.params.uri)

    async def until_attached() -> None:
        deadline = time.monotonic() + 10
        while await asyncio.to_thread(attached, database_url, agent) == 0:
            assert time.monotonic() < deadline, "the stream never attached"
            await asyncio.sleep(0.05)

    async def main() -> None:
        headers = {"Authorization": f"Bearer {agent.token}"}
        async with httpx2.AsyncClient(headers=headers, timeout=30) as http:
            transport = streamable_http_client(server.url, http_client=http)
            # Legacy doorbells reach the message handler; modern ones the listen iterator (the
            # SDK tees them to both, so only one of them is read).
            handler = on_message if mode == "legacy" else None
            client = Client(transport, mode=mode, message_handler=handler)  # type: ignore[arg-type]
            async with client:
                if mode == "legacy":
                    # Deprecated only from 2026-07-28 on; the legacy era is what is tested here.
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", MCPDeprecationWarning)
                        await client.subscribe_resource(uri)
                    await until_attached()
                    await asyncio.to_thread(script, heard)
                    return
                async with client.listen(resource_subscriptions=[uri]) as subscription:
                    assert subscription.honored.resource_subscriptions == [uri]

                    async def collect() -> None:
                        async for event in subscription:
                            heard.note(event.uri)  # type: ignore[union-attr]

                    collector = asyncio.create_task(collect())
                    await until_attached()
                    await asyncio.to_thread(script, heard)
                    collector.cancel()

    asyncio.run(main())
    return heard


def wait_for(heard: Heard, count: int, since: float, seconds: float) -> list[tuple[float, str]]:
    """The doorbells heard after ``since`` once ``count`` arrived or ``seconds`` passed."""
    deadline = time.monotonic() + seconds
    while len(heard.since(since)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return heard.since(since)


# --- agents hear their doorbell ---------------------------------------------------------------


def seconds_to_hear_a_create(server: Served, database_url: str, agent: Agent, mode: str) -> float:
    """Attach an SDK client to the agent's queue ``q``, create one todo, and return how long its
    todo_ready took to arrive (asserting exactly that doorbell arrives)."""
    uri = doorbells.queue_uri(agent.endpoint, "q")
    latency: list[float] = []

    def script(heard: Heard) -> None:
        before = heard.now()
        create(server, agent)
        (event,) = wait_for(heard, 1, before, 3)
        assert event[1] == uri
        latency.append(event[0] - before)

    attach_and_run(server, database_url, agent, mode, uri, script)
    return latency[0]


@pytest.mark.parametrize("mode", MODES)
def test_an_sdk_agent_hears_todo_ready_within_a_second(
    mcp_server: Served, mcp_db: str, agent: Agent, mode: str
) -> None:
    latency = seconds_to_hear_a_create(mcp_server, mcp_db, agent, mode)
    assert latency < 1.0, f"todo_ready took {latency:.3f} s"


@pytest.fixture
def closing() -> Iterator[requests.Session]:
    with requests.Session() as http:
        yield http


def test_resources_list_read_and_subscribe_are_the_grants_queues(
    mcp_server: Served, agent_factory: Callable[..., Agent], closing: requests.Session
) -> None:
    agent = agent_factory(queues=["a", "b"])
    create(mcp_server, agent, "a", 2)
    rpc = Rpc(mcp_server.url, agent, closing)
    rpc.initialize()
    listed = rpc.request("resources/list").json()["result"]["resources"]
    assert [r["uri"] for r in listed] == [
        doorbells.queue_uri(agent.endpoint),
        doorbells.queue_uri(agent.endpoint, "a"),
    ]
    read = rpc.request("resources/read", {"uri": doorbells.queue_uri(agent.endpoint, "a")})
    status = json.loads(read.json()["result"]["contents"][0]["text"])
    assert (status["pending"], status["claimable"], status["admission"]) == (2, 2, None)
    for uri in ("switchboard://queues/other/a", doorbells.queue_uri(agent.endpoint, "c"), 5):
        answer = rpc.request("resources/subscribe", {"uri": uri}).json()
        assert answer["error"]["code"] in (-32002, -32602), answer
    # A grant without drain verbs has no resources.
    reader = agent_factory(verbs=["whoami"])
    plain = Rpc(mcp_server.url, reader, closing)
    plain.initialize()
    assert plain.request("resources/list").json()["result"]["resources"] == []


# --- R-GATE and R-REOPEN over every path --------------------------------------------------------


class HookServer:
    """A local HTTP receiver for notify hooks: ``/ok`` answers 200, ``/fail`` 500, ``/hang``
    holds the request past the sender's timeout."""

    def __init__(self) -> None:
        self.received: list[tuple[float, str, bytes, dict[str, str]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.received.append((time.monotonic(), self.path, body, dict(self.headers)))
                if self.path == "/hang":
                    time.sleep(doorbells.HOOK_TIMEOUT_SECONDS + 2)
                self.send_response(500 if self.path == "/fail" else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def posts(self, path: str) -> list[tuple[float, str, bytes, dict[str, str]]]:
        return [r for r in self.received if r[1] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks() -> Iterator[HookServer]:
    server = HookServer()
    yield server
    server.close()


def verify(secret: str, body: bytes, headers: dict[str, str]) -> bool:
    """How a receiver checks a delivery (the README's recipe)."""
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, headers[doorbells.SIGNATURE_HEADER])


def test_an_exhausted_queue_is_silent_on_every_path_and_rolls_over_with_one_ring(
    mcp_server: Served, mcp_db: str, agent_factory: Callable[..., Agent], hooks: HookServer
) -> None:
    listener, unattended = agent_factory(), agent_factory()
    secret = with_hook(mcp_db, unattended, hooks.base + "/ok")
    for agent in (listener, unattended):
        exhaust_today(mcp_db, agent)
    uri = doorbells.queue_uri(listener.endpoint, "q")

    def script(heard: Heard) -> None:
        for agent in (listener, unattended):
            create(mcp_server, agent, n=10)
        time.sleep(1.5)  # real time for a ring that must not come (the window is not pinned)
        assert heard.events == [] and hooks.received == []
        assert ring_count(mcp_db, listener) == ring_count(mcp_db, unattended) == 0
        before = heard.now()
        for agent in (listener, unattended):
            roll_over(mcp_db, agent)
            roll_over(mcp_db, agent)  # a second tick of the same reopening rings nothing
        assert [e[1] for e in wait_for(heard, 1, before, 1.0)] == [uri]
        time.sleep(1.0)
        assert len(heard.since(before)) == 1
        (post,) = hooks.posts("/ok")
        assert verify(secret, post[2], post[3])
        assert json.loads(post[2])["cause"] == "reopen"

    attach_and_run(mcp_server, mcp_db, listener, "legacy", uri, script)


def test_a_slot_freed_by_complete_rings_exactly_once_at_once(
    mcp_server: Served, mcp_db: str, agent: Agent
) -> None:
    set_policy(mcp_db, agent, max_in_flight=1)
    uri = doorbells.queue_uri(agent.endpoint, "q")

    def script(heard: Heard) -> None:
        create(mcp_server, agent)
        assert len(wait_for(heard, 1, 0, 3)) == 1
        claimed = tool(mcp_server, agent, "claim_next")["todo"]
        mark = heard.now()
        create(mcp_server, agent, n=2)
        idle = tool(mcp_server, agent, "claim_next")
        assert idle["empty"] and idle["deferred"][0]["reason"] == "in_flight_full"
        time.sleep(1.0)
        assert heard.since(mark) == []  # deferred: no push for work that can't be claimed
        before = heard.now()
        tool(mcp_server, agent, "complete", id=claimed["id"], attempt=claimed["attempt"])
        (event,) = wait_for(heard, 1, before, 1.0)  # no tick (30 s) in between
        time.sleep(1.0)
        assert len(heard.since(before)) == 1 and event[1] == uri

    attach_and_run(mcp_server, mcp_db, agent, "auto", uri, script)


def test_a_burst_of_a_thousand_creates_rings_a_bounded_number_of_times(
    mcp_server: Served, mcp_db: str, agent: Agent
) -> None:
    uri = doorbells.queue_uri(agent.endpoint, "q")
    elapsed: list[float] = []

    def script(heard: Heard) -> None:
        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: create(mcp_server, agent, n=125), range(8)))
        elapsed.append(time.monotonic() - started)
        time.sleep(2 * doorbells.COALESCE.total_seconds() + 1)  # the last held ring is paid

    heard = attach_and_run(mcp_server, mcp_db, agent, "auto", uri, script)
    rings = ring_count(mcp_db, agent)
    # The documented bound: one ring per queue per coalescing interval, plus the first.
    bound = 1 + math.ceil(elapsed[0] / doorbells.COALESCE.total_seconds())
    assert 1 <= rings <= bound, (rings, elapsed)
    assert len(heard.events) == rings  # every ring reached the attached agent


def test_hooks_are_signed_and_a_dead_hook_delays_no_other_delivery(
    mcp_server: Served, mcp_db: str, agent_factory: Callable[..., Agent], hooks: HookServer
) -> None:
    hanging, healthy, failing = agent_factory(), agent_factory(), agent_factory()
    with_hook(mcp_db, hanging, hooks.base + "/hang")
    secret = with_hook(mcp_db, healthy, hooks.base + "/ok")
    with_hook(mcp_db, failing, hooks.base + "/fail")
    create(mcp_server, hanging)
    create(mcp_server, failing)
    time.sleep(0.2)  # the hanging POST is in flight
    started = time.monotonic()
    create(mcp_server, healthy, n=3)
    deadline = time.monotonic() + 3
    while not hooks.posts("/ok") and time.monotonic() < deadline:
        time.sleep(0.02)
    (post,) = hooks.posts("/ok")
    assert post[0] - started < 1.5, "a hanging hook delayed another endpoint's delivery"
    assert verify(secret, post[2], post[3])
    body = json.loads(post[2])
    assert (body["event"], body["endpoint"], body["queue"]) == ("todo_ready", healthy.endpoint, "q")
    assert body["resource"] == doorbells.queue_uri(healthy.endpoint, "q")
    # The failing and the hanging hooks wait for their retry, with the error kept.
    deadline = time.monotonic() + doorbells.HOOK_TIMEOUT_SECONDS + 3
    errors: dict[str, str] = {}
    while len(errors) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        with psycopg.connect(mcp_db) as conn:
            rows = conn.execute(
                "SELECT url, status, last_error FROM notify_deliveries"
                " WHERE endpoint_id = ANY(%s) AND last_error IS NOT NULL",
                ([hanging.endpoint_id, failing.endpoint_id],),
            ).fetchall()
        errors = {url.rsplit("/", 1)[1]: f"{status}: {error}" for url, status, error in rows}
    assert errors == {"fail": "pending: HTTP 500", "hang": "pending: timed out"}


# --- R-SCHED: one leader among serving processes -------------------------------------------------


def leader_pids(database_url: str) -> list[int]:
    """OS pids of the processes holding the scheduler lock (from their application_name)."""
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
            " WHERE l.locktype = 'advisory' AND l.granted"
            " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND (l.classid::bigint << 32 | l.objid::bigint) = %s",
            (LEADER_LOCK,),
        ).fetchall()
    return [int(str(r[0]).rsplit("-", 1)[1]) for r in rows]


def test_two_serving_processes_share_one_leader_and_a_killed_one_is_replaced(
    clone_db: str, tmp_path: Path
) -> None:
    extra = {"SWITCHBOARD_WORKERS": "1", "SWITCHBOARD_TICK_SECONDS": "1"}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = start_switchboard(clone_db, tmp_path / "a", **extra)
    second = start_switchboard(clone_db, tmp_path / "b", **extra)
    try:
        agent = make_agent(clone_db)
        with psycopg.connect(clone_db) as conn:
            conn.execute(
                "INSERT INTO queues (endpoint_id, name) VALUES (%s, 'q')", (agent.endpoint_id,)
            )
            conn.execute(
                "INSERT INTO todos (endpoint_id, queue, title, state, attempt, max_attempts,"
                " retry_at) SELECT %(e)s, 'q', 't' || i, 'retry_wait', 1, 3, now()"
                " FROM generate_series(1, 20) i",
                {"e": agent.endpoint_id},
            )
        deadline = time.monotonic() + 10
        while True:
            with psycopg.connect(clone_db) as conn:
                row = conn.execute(
                    "SELECT count(*) FILTER (WHERE state = 'pending'),"
                    " (SELECT count(*) FROM events WHERE kind = 'requeued')"
                    " FROM todos WHERE endpoint_id = %s",
                    (agent.endpoint_id,),
                ).fetchone()
            assert row is not None
            if row[0] == 20 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # Every retry requeued exactly once, by one leader; its doorbell rang once.
        holders = leader_pids(clone_db)
        assert (row[0], row[1]) == (20, 20) and len(holders) == 1
        assert ring_count(clone_db, agent) == 1
        (leader,) = holders
        os.kill(leader, signal.SIGKILL)
        killed_at = time.monotonic()
        while True:
            holders = leader_pids(clone_db)
            if holders and holders != [leader]:
                break
            assert time.monotonic() - killed_at < 1 + 3, "no new leader within a tick"
            time.sleep(0.05)
        assert len(holders) == 1 and holders[0] != leader
    finally:
        first.stop()
        second.stop()


def test_modern_listen_honours_only_the_grants_resources(
    mcp_server: Served, agent_factory: Callable[..., Agent], closing: requests.Session
) -> None:
    agent = agent_factory(queues=["a"])
    rpc = Rpc(mcp_server.url, agent, closing)
    mine, other = doorbells.queue_uri(agent.endpoint, "a"), doorbells.queue_uri(agent.endpoint, "b")
    response = rpc.http.post(
        mcp_server.url,
        json={
            "jsonrpc": "2.0",
            "id": "listen-1",
            "method": "subscriptions/listen",
            "params": {
                "notifications": {"resourceSubscriptions": [mine, other]},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": MODERN,
                    "io.modelcontextprotocol/clientCapabilities": {},
                    "io.modelcontextprotocol/clientInfo": {"name": "t", "version": "1"},
                },
            },
        },
        headers={
            **rpc.base_headers(),
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "subscriptions/listen",
        },
        stream=True,
        timeout=10,
    )
    try:
        assert response.status_code == 200
        line = next(raw for raw in response.iter_lines() if raw.startswith(b"data:"))
        ack = json.loads(line[5:])
        assert ack["params"]["notifications"] == {"resourceSubscriptions": [mine]}
    finally:
        response.close()


def test_presence_rows_come_and_go_with_streams(
    mcp_server: Served, mcp_db: str, agent: Agent
) -> None:
    uri = doorbells.queue_uri(agent.endpoint)

    def script(heard: Heard) -> None:
        assert attached(mcp_db, agent) == 1

    attach_and_run(mcp_server, mcp_db, agent, "legacy", uri, script)
    deadline = time.monotonic() + 5
    while attached(mcp_db, agent) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert attached(mcp_db, agent) == 0
