"""End to end through real nginx (deploy/nginx.conf) in front of ``switchboard serve`` on
loopback: an MCP session with the official SDK, an unbuffered event stream, ``/metrics``, a
page, the body limit, and the forwarded headers (SPEC §9 deployment, R-SAFE).

nginx is the Debian package: installed with apt-get when missing (the tests run as root);
when that is impossible the tests skip, saying why. New end-to-end checks take the
``proxied`` fixture: its ``base`` is the proxy's URL (its ``url`` the proxied ``/mcp``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
from flask import Flask, request
from mcp import Client

from app import MAX_CONTENT_LENGTH
from switchboard import config, extensions
from tests.mcp_fixtures import (
    ROOT,
    Agent,
    Served,
    free_port,
    make_agent,
    start_switchboard,
)
from tests.test_doorbells_http import seconds_to_hear_a_create
from tests.test_mcp_sdk import MODES, ok, with_client
from tests.test_mcp_streams import open_listen_stream
from tests.test_metrics import parse, value

CONF = ROOT / "deploy" / "nginx.conf"
LISTEN = "    listen 80;\n"
UPSTREAM = "    server 127.0.0.1:8080 max_fails=0;\n"


def nginx_binary() -> str:
    """nginx, installed from the Debian package if missing; skips when it cannot be."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found:
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        pytest.skip("nginx is missing and cannot be installed here (needs apt-get as root)")
    install = [apt, "install", "-y", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=300"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run([*install, "nginx"], capture_output=True, text=True, env=env)
    if result.returncode != 0:  # stale package lists: refresh once
        subprocess.run([apt, "update"], capture_output=True, text=True, env=env, timeout=600)
        result = subprocess.run([*install, "nginx"], capture_output=True, text=True, env=env)
    found = shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if result.returncode != 0 or found is None:
        pytest.skip(f"apt-get could not install nginx:\n{result.stderr[-2000:]}")
    return found


def site(listen_port: int, upstream_port: int) -> str:
    """deploy/nginx.conf with its listen and upstream addresses moved to loopback ports."""
    text = CONF.read_text()
    assert LISTEN in text and UPSTREAM in text, "deploy/nginx.conf changed its addresses"
    text = text.replace(LISTEN, f"    listen 127.0.0.1:{listen_port};\n")
    return text.replace(UPSTREAM, f"    server 127.0.0.1:{upstream_port} max_fails=0;\n")


def main_conf(directory: Path, included: Path) -> str:
    """A minimal nginx.conf running unprivileged files in ``directory`` around the site."""
    temp = {name: directory / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir()
    # Workers of a root master run as nobody, who cannot enter pytest's private directories.
    user = "user root;" if os.geteuid() == 0 else ""
    return f"""
daemon off;
{user}
worker_processes 1;
pid {directory}/nginx.pid;
error_log {directory}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {directory}/access.log;
    client_body_temp_path {temp["body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
    gzip on;  # as Debian's default nginx.conf has it
    include {included};
}}
"""


@dataclass
class Proxied:
    """nginx (``base``) in front of a Switchboard server (``upstream``)."""

    base: str
    nginx: subprocess.Popen[str]
    upstream: Served
    directory: Path

    @property
    def url(self) -> str:
        return self.base + "/mcp"

    @property
    def served(self) -> Served:
        """The proxy as a Served, for helpers that take one (its ``url`` is the proxied /mcp)."""
        return Served(self.base, self.nginx, self.directory / "error.log")


@pytest.fixture(scope="module")
def proxied(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    """nginx with deploy/nginx.conf on a loopback port, proxying to ``switchboard serve``
    (2 workers, 1 s stream keep-alives) whose public URL is the proxy's."""
    binary = nginx_binary()
    directory = tmp_path_factory.mktemp("nginx")
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    upstream = start_switchboard(
        module_db, tmp_path_factory.mktemp("upstream"), SWITCHBOARD_PUBLIC_URL=base
    )
    upstream_port = int(upstream.base.rsplit(":", 1)[1])
    (directory / "switchboard.conf").write_text(site(port, upstream_port))
    (directory / "nginx.conf").write_text(main_conf(directory, directory / "switchboard.conf"))
    command = [binary, "-p", str(directory), "-c", str(directory / "nginx.conf")]
    checked = subprocess.run([*command, "-t"], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    nginx = subprocess.Popen(command, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert nginx.poll() is None, (directory / "error.log").read_text()
            try:
                if requests.get(base + "/readyz", timeout=5).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, "nginx did not proxy /readyz"
            time.sleep(0.1)
        yield Proxied(base, nginx, upstream, directory)
    finally:
        nginx.terminate()
        nginx.wait(10)
        upstream.stop()


@pytest.fixture
def proxied_agent(module_db: str) -> Agent:
    return make_agent(module_db)


@pytest.mark.parametrize("mode", MODES)
def test_an_mcp_session_through_nginx_with_the_official_sdk(
    proxied: Proxied, proxied_agent: Agent, mode: str
) -> None:
    async def body(client: Client) -> Any:
        created = await ok(client, "create_todo", {"queue": "work", "title": "through nginx"})
        claimed = await ok(client, "claim_next", {"queues": ["work"]})
        assert claimed["todo"]["id"] == created["todo"]["id"]
        todo = claimed["todo"]
        done = await ok(client, "complete", {"id": todo["id"], "attempt": todo["attempt"]})
        return done["todo"]["state"]

    assert with_client(proxied.served, proxied_agent.headers, mode, body) == "done"


def test_event_streams_pass_nginx_unbuffered(proxied: Proxied, proxied_agent: Agent) -> None:
    """Keep-alive comments (a few bytes each, one a second) arrive as they are sent. (Both the
    location's ``proxy_buffering off`` and the app's ``X-Accel-Buffering: no`` see to it.)"""
    with open_listen_stream(proxied.url, proxied_agent, "nginx-listen") as stream:
        assert stream.status_code == 200
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        started = time.monotonic()
        chunks = stream.iter_content(chunk_size=None)
        received = [next(chunks) for _ in range(3)]  # the opening event and two keep-alives
        assert time.monotonic() - started < 4
        assert received[1:] == [b": keep-alive\n\n"] * 2


def test_metrics_and_a_page_through_nginx(proxied: Proxied, proxied_agent: Agent) -> None:
    metrics = requests.get(proxied.base + "/metrics", timeout=30)
    assert metrics.status_code == 200
    samples = parse(metrics.text)
    errors = value(samples, "switchboard_collection_errors_total", collector="admission")
    assert errors == 0
    assert any(name == "flask_http_request_total" for name, _ in samples)
    page = requests.get(proxied.base + "/api/v1/openapi.json", timeout=30)
    assert page.status_code == 200 and page.json()["openapi"].startswith("3.1")
    assert requests.get(proxied.base + "/healthz", timeout=30).json() == {"status": "ok"}


def test_nginx_refuses_bodies_the_app_would_refuse(proxied: Proxied) -> None:
    limit = re.search(r"client_max_body_size (\d+)m;", CONF.read_text())
    assert limit is not None and int(limit.group(1)) * 1024 * 1024 == MAX_CONTENT_LENGTH
    headers = {"Content-Type": "application/json"}
    too_big = requests.post(
        proxied.base + "/api/v1/todos", data=b"x" * (MAX_CONTENT_LENGTH + 1), headers=headers
    )
    assert too_big.status_code == 413
    just_fits = requests.post(
        proxied.base + "/api/v1/todos", data=b"x" * MAX_CONTENT_LENGTH, headers=headers
    )
    assert just_fits.status_code == 401  # reached the app, which asks for a token


def test_the_app_takes_client_scheme_host_and_address_from_one_proxy_hop(
    clone_db: str, tmp_path: Path
) -> None:
    """ProxyFix: with SWITCHBOARD_PROXY_HOPS=1 (the default) the forwarded values are the
    request's; with 0 they are ignored (clients connect directly)."""
    forwarded = {
        "X-Forwarded-For": "203.0.113.7",
        "X-Forwarded-Proto": "https",
        "X-Forwarded-Host": "switchboard.example.com",
        "X-Forwarded-Port": "443",
    }
    seen = {}
    for hops in ("1", "0"):
        settings = {
            "DATABASE_URL": clone_db,
            "SWITCHBOARD_DATA_DIR": str(tmp_path),
            "SWITCHBOARD_SCHEDULER": "off",
            "SWITCHBOARD_PROXY_HOPS": hops,
        }
        from app import create_app

        app: Flask = create_app({"config": config.load(settings), "TESTING": True})
        app.add_url_rule("/_echo", "echo", lambda: [request.remote_addr, request.url])
        try:
            seen[hops] = app.test_client().get("/_echo", headers=forwarded).json
        finally:
            extensions.database(app).close()
    assert seen["1"] == ["203.0.113.7", "https://switchboard.example.com/_echo"]
    assert seen["0"] == ["127.0.0.1", "http://localhost/_echo"]


@pytest.mark.parametrize("mode", MODES)
def test_a_doorbell_arrives_through_nginx_within_a_second(
    proxied: Proxied, module_db: str, proxied_agent: Agent, mode: str
) -> None:
    """R-BELL behind the proxy: a create rings the attached SDK agent's stream at once."""
    latency = seconds_to_hear_a_create(proxied.served, module_db, proxied_agent, mode)
    assert latency < 1.0, f"todo_ready took {latency:.3f} s through nginx"
