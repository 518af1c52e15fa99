"""How Switchboard runs in production: graceful shutdown on SIGTERM, the metrics directory that
``switchboard serve`` manages, and ``gunicorn -c gunicorn.conf.py`` with the same settings."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import requests

from tests.mcp_fixtures import (
    BIN,
    ROOT,
    Rpc,
    free_port,
    make_agent,
    serve,
    server_env,
    start_switchboard,
)
from tests.test_mcp_streams import open_listen_stream
from tests.test_metrics import parse, value


def wait_for_lock_waiter(url: str, seconds: float = 10) -> None:
    """Until a backend waits on a row lock (the claim request is in flight)."""
    deadline = time.monotonic() + seconds
    with psycopg.connect(url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.05)
    raise AssertionError("the claim never waited on the row lock")


def test_sigterm_finishes_requests_in_flight_and_ends_streams_at_once(
    clone_db: str, tmp_path: Path
) -> None:
    # Keep-alives every 60 s: a stream that ends now ends because of SIGTERM.
    served = start_switchboard(clone_db, tmp_path, SWITCHBOARD_MCP_KEEPALIVE_SECONDS="60")
    try:
        agent = make_agent(clone_db)
        rpc = Rpc(served.url, agent)
        todo = rpc.modern(
            "tools/call", {"name": "create_todo", "arguments": {"queue": "q", "title": "slow"}}
        ).json()["result"]["structuredContent"]["todo"]
        stream = open_listen_stream(served.url, agent, "listen-1")
        assert stream.status_code == 200
        chunks = stream.iter_content(chunk_size=None)
        assert next(chunks)  # the stream is open

        answer: dict[str, Any] = {}

        def claim() -> None:  # blocks on the row lock the test holds
            response = Rpc(served.url, agent).modern(
                "tools/call", {"name": "claim", "arguments": {"id": todo["id"]}}, Connection="close"
            )
            answer["status"] = response.status_code
            answer["result"] = response.json()["result"]

        with psycopg.connect(clone_db) as locker:
            locker.execute("SELECT 1 FROM todos WHERE id = %s FOR UPDATE", (todo["id"],))
            claimer = threading.Thread(target=claim)
            claimer.start()
            wait_for_lock_waiter(clone_db)
            stopped_at = time.monotonic()
            served.process.send_signal(signal.SIGTERM)
            rest = list(chunks)  # ends without waiting for the 20 s graceful timeout
            stream_ended = time.monotonic() - stopped_at
            time.sleep(0.5)
            assert claimer.is_alive() and served.process.poll() is None  # still finishing
            locker.rollback()  # the claim may proceed
        claimer.join(15)
        served.process.wait(15)
    finally:
        served.stop()
    assert stream_ended < 3, rest
    assert answer["status"] == 200 and not answer["result"]["isError"], answer
    assert answer["result"]["structuredContent"]["todo"]["state"] == "claimed"
    assert served.process.returncode == 0
    assert time.monotonic() - stopped_at < 10


def stale_counter(directory: Path) -> None:
    """A counter file a previous run of the server left behind (ghost claims)."""
    code = (
        "from prometheus_client import Counter;"
        "Counter('switchboard_todos_claimed', 'x', ['endpoint', 'queue'])"
        ".labels('ghost', 'q').inc(7)"
    )
    directory.mkdir(parents=True)
    env = {"PROMETHEUS_MULTIPROC_DIR": str(directory), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)
    assert list(directory.glob("counter_*.db"))


def test_serve_starts_with_a_clean_metrics_directory(clone_db: str, tmp_path: Path) -> None:
    port = free_port()
    directory = tmp_path / "prometheus" / f"127.0.0.1_{port}"
    stale_counter(directory)
    env = server_env(clone_db, port, tmp_path)
    served = serve([str(BIN / "switchboard"), "serve"], env, port, tmp_path / "serve.log")
    try:
        samples = parse(requests.get(served.base + "/metrics", timeout=30).text)
    finally:
        served.stop()
    assert value(samples, "switchboard_todos_claimed_total", endpoint="ghost", queue="q") == 0
    assert ("switchboard_collection_errors_total", (("collector", "queues"),)) in samples


def test_gunicorn_conf_py_serves_with_the_same_settings(clone_db: str, tmp_path: Path) -> None:
    port = free_port()
    env = server_env(clone_db, port, tmp_path, SWITCHBOARD_WORKERS="2")
    command = [str(BIN / "gunicorn"), "-c", str(ROOT / "gunicorn.conf.py"), "wsgi:app"]
    served = serve(command, env, port, tmp_path / "gunicorn.log")
    try:
        agent = make_agent(clone_db)
        rpc = Rpc(served.url, agent)
        for _ in range(4):
            arguments = {"queue": "q", "title": f"t-{uuid.uuid4().hex[:6]}"}
            rpc.modern("tools/call", {"name": "create_todo", "arguments": arguments})
            rpc.modern("tools/call", {"name": "claim_next", "arguments": {}}, Connection="close")
        samples = parse(requests.get(served.base + "/metrics", timeout=30).text)
        workers = len(
            [line for line in Path(served.log).read_text().splitlines() if "Booting worker" in line]
        )
    finally:
        served.stop()
    claimed = value(samples, "switchboard_todos_claimed_total", endpoint=agent.endpoint, queue="q")
    assert claimed == 4
    assert workers == 2
    assert list((tmp_path / "prometheus" / f"127.0.0.1_{port}").glob("counter_*.db"))
