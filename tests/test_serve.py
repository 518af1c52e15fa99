"""`switchboard serve`, `migrate` and `bootstrap` as a user runs them: real processes, real HTTP."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

SWITCHBOARD = str(Path(sys.executable).parent / "switchboard")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "DATABASE_URL" and not k.startswith("SWITCHBOARD_")
    }
    env.update(extra)
    return env


def get_json(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def wait_ready(base: str, proc: subprocess.Popen[str], seconds: float = 90) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            return get_json(base + "/readyz")
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.2)
    raise AssertionError("serve did not become ready")


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] == "postgres" and str(data_dir) in cmdline:
            found.append(proc)
    return found


def serve(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [SWITCHBOARD, "serve"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    return output


def test_embedded_serve_is_ready_persists_and_leaves_no_postgres(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(
        SWITCHBOARD_DATA_DIR=str(tmp_path),
        SWITCHBOARD_BIND=f"127.0.0.1:{port}",
        SWITCHBOARD_WORKERS="2",
        SWITCHBOARD_THREADS="2",
    )
    token = subprocess.run(
        [SWITCHBOARD, "bootstrap", "--email", "root@example.com"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert token.returncode == 0, token.stderr
    assert token.stdout.strip().startswith("sbo_") and token.stdout.count("\n") == 1

    proc = serve(env)
    try:
        assert wait_ready(f"http://127.0.0.1:{port}", proc) == (200, {"status": "ready"})
        assert get_json(f"http://127.0.0.1:{port}/healthz") == (200, {"status": "ok"})
        assert postgres_processes(tmp_path)
    finally:
        output = stop(proc)
    assert f"Switchboard serving on http://127.0.0.1:{port}" in output
    assert proc.returncode == 0
    assert postgres_processes(tmp_path) == []

    # The data survived the restart: the admin exists, so a second bootstrap refuses.
    again = subprocess.run(
        [SWITCHBOARD, "bootstrap", "--email", "root@example.com"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode != 0 and again.stdout == ""
    assert "already exists" in again.stderr and again.stderr.count("\n") == 1
    assert postgres_processes(tmp_path) == []


def test_serve_with_database_url_starts_no_postgres(tmp_path: Path, clone_db: str) -> None:
    port = free_port()
    env = clean_env(
        DATABASE_URL=clone_db,
        SWITCHBOARD_DATA_DIR=str(tmp_path),
        SWITCHBOARD_BIND=f"127.0.0.1:{port}",
        SWITCHBOARD_WORKERS="1",
    )
    proc = serve(env)
    try:
        assert wait_ready(f"http://127.0.0.1:{port}", proc)[0] == 200
        assert not (tmp_path / "pg").exists()
        assert postgres_processes(tmp_path) == []
    finally:
        stop(proc)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("SWITCHBOARD_BIND", "nonsense", "SWITCHBOARD_BIND must be HOST:PORT"),
        ("SWITCHBOARD_WORKERS", "zero", "SWITCHBOARD_WORKERS must be a whole number"),
        ("SWITCHBOARD_LEASE_SECONDS", "0", "SWITCHBOARD_LEASE_SECONDS must be between"),
        ("DATABASE_URL", "mysql://x", "DATABASE_URL must be a postgresql:// URL"),
        ("SWITCHBOARD_SECRET_KEY", "short", "at least 16 characters"),
    ],
)
def test_bad_configuration_fails_at_start_with_one_line(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    env = clean_env(SWITCHBOARD_DATA_DIR=str(tmp_path), **{variable: value})
    result = subprocess.run(
        [SWITCHBOARD, "serve"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and message in result.stderr
    assert postgres_processes(tmp_path) == []


def test_readyz_is_503_while_migrations_are_pending(tmp_path: Path, pg_server_url: str) -> None:
    import uuid

    from tests.conftest import create_database, drop_database

    name = f"sb_unmigrated_{uuid.uuid4().hex[:8]}"
    url = create_database(pg_server_url, name)
    try:
        from app import create_app
        from switchboard import config
        from switchboard.db import migration_files

        app = create_app(
            {
                "config": config.load(
                    {
                        "DATABASE_URL": url,
                        "SWITCHBOARD_DATA_DIR": str(tmp_path),
                        "SWITCHBOARD_SCHEDULER": "off",
                    }
                )
            }
        )
        client = app.test_client()
        response = client.get("/readyz")
        assert response.status_code == 503
        versions = [m.version for m in migration_files()]
        assert response.json == {
            "status": "unavailable",
            "reason": "migrations pending",
            "pending": versions,
        }
        from switchboard.extensions import database

        database(app).close()
    finally:
        drop_database(pg_server_url, name)
