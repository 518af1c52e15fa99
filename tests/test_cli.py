"""The operator CLI (R-CLI) against the real app served over HTTP on loopback: endpoint, grant,
todo and exactly the design's ``queue budget show|set|clear``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from werkzeug.serving import make_server

from switchboard.cli import main
from tests.api_support import Operator, new_token, running_app, unique


@dataclass
class Served:
    url: str
    token: str
    api: Operator  # the same server's API through the Flask test client, for set-up

    def run(self, *args: str, token: str | None = None, **env: str) -> Result:
        environment = {"SWITCHBOARD_URL": self.url, "SWITCHBOARD_TOKEN": token or self.token}
        return CliRunner().invoke(main, list(args), env=environment | env)

    def ok(self, *args: str, **env: str) -> str:
        result = self.run(*args, **env)
        assert result.exit_code == 0, (result.stdout, result.stderr)
        assert result.stderr == ""
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))

    def fails(self, *args: str, code: int = 1, **env: str) -> str:
        """The one stderr line of a command that must fail."""
        result = self.run(*args, **env)
        assert result.exit_code == code, (result.stdout, result.stderr)
        assert result.stderr.startswith("switchboard: ") and result.stderr.count("\n") == 1
        return result.stderr


@pytest.fixture(scope="module")
def served(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with running_app(module_db, tmp_path_factory.mktemp("cli")) as app:
        server = make_server("127.0.0.1", 0, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            token = new_token(app)
            yield Served(
                f"http://127.0.0.1:{server.server_port}", token, Operator(app.test_client(), token)
            )
        finally:
            server.shutdown()
            thread.join(timeout=10)


@pytest.fixture
def slug(served: Served) -> str:
    name = unique("cli")
    served.ok("endpoint", "create", name)
    return name


def test_queue_budget_set_show_and_clear(served: Served, slug: str) -> None:
    served.ok("todo", "add", slug, "mail", "first")
    set_out = served.ok(
        "queue", "budget", "set", slug, "mail",
        "--per-day", "5", "--tz", "America/Los_Angeles", "--max-in-flight", "2",
    )  # fmt: skip
    assert "used/limit     0/5" in set_out and "in-flight/cap  0/2" in set_out
    assert "day from 00:00 America/Los_Angeles" in set_out
    assert "(local)" in set_out and ("PST" in set_out or "PDT" in set_out)

    todo = served.api.ok("GET", f"/todos?endpoint={slug}")["items"][0]
    served.api.ok("POST", f"/todos/{todo['id']}/claim")

    listed = served.ok("queue", "budget", "show")
    header, row = listed.splitlines()
    assert header.split() == [
        "ENDPOINT", "QUEUE", "STATUS", "USED/LIMIT", "IN-FLIGHT/CAP", "PENDING",
        "RESETS", "AT", "(POLICY", "ZONE)", "RESETS", "AT", "(LOCAL)",
    ]  # fmt: skip
    assert row.split()[:6] == [slug, "mail", "open", "1/5", "1/2", "0"]
    assert served.ok("queue", "budget", "show", slug) == listed

    detail = served.ok("queue", "budget", "show", slug, "mail")
    assert "used/limit     1/5" in detail and "recent windows" in detail
    assert "audit" in detail and "create" in detail

    as_json = served.json("queue", "budget", "show", slug, "mail")
    assert as_json["used"] == 1 and as_json["policy"]["max_claims_per_window"] == 5
    assert as_json == served.api.ok("GET", f"/admission/endpoint:{slug}/mail")

    assert (
        served.ok("queue", "budget", "clear", slug, "mail")
        == f"cleared the budget of {slug}/mail\n"
    )
    line = served.fails("queue", "budget", "show", slug, "mail")
    assert line == "switchboard: no admission policy on queue 'mail'\n"
    assert served.ok("queue", "budget", "show", slug) == "(none)\n"


def test_budget_set_defaults_and_a_weekly_window(served: Served, slug: str) -> None:
    weekly = json.loads(
        served.ok(
            "queue", "budget", "set", slug, "w", "--per-week", "10", "--json", TZ="Asia/Kathmandu"
        )
    )
    assert weekly["policy"] == {
        "max_in_flight": None,
        "max_claims_per_window": 10,
        "window": {"period": "week", "tz": "Asia/Kathmandu", "start": "00:00", "weekday": "Mon"},
    }
    hourly = json.loads(
        served.ok(
            "queue", "budget", "set", slug, "w", "--per-hour", "0", "--start", "00:15", "--json",
            TZ="Asia/Kathmandu",
        )
    )  # fmt: skip
    assert hourly["id"] == weekly["id"]  # a full replace keeps the policy
    assert hourly["policy"]["window"] == {
        "period": "hour",
        "tz": "Asia/Kathmandu",
        "start": "00:15",
        "weekday": None,
    }
    assert hourly["status"] == "deferred" and hourly["reason"] == "paused"
    capped = served.json("queue", "budget", "set", slug, "w", "--max-in-flight", "3")
    assert capped["policy"] == {"max_in_flight": 3, "max_claims_per_window": None, "window": None}


def test_window_flags_are_mutually_exclusive(served: Served, slug: str) -> None:
    line = served.fails(
        "queue", "budget", "set", slug, "q", "--per-day", "1", "--per-hour", "2", code=2
    )
    assert "mutually exclusive" in line and "--per-hour and --per-day" in line
    assert served.api.get(f"/admission/endpoint:{slug}/q").status_code == 404  # nothing written


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "--max-in-flight"),
        (["--tz", "UTC", "--max-in-flight", "1"], "--tz, --start and --weekday need"),
        (["--per-day", "1", "--weekday", "Tue"], "--weekday goes with --per-week only"),
    ],
)
def test_budget_set_flags_that_do_not_go_together(
    served: Served, slug: str, args: list[str], message: str
) -> None:
    assert message in served.fails("queue", "budget", "set", slug, "q", *args, code=2)


def test_the_servers_validation_errors_pass_through(served: Served, slug: str) -> None:
    line = served.fails(
        "queue", "budget", "set", slug, "q", "--per-day", "3", "--tz", "Mars/Olympus"
    )
    assert line == ("switchboard: invalid window: window.tz: unknown IANA zone (embedded tzdata)\n")
    line = served.fails(
        "queue", "budget", "set", slug, "q", "--per-week", "1", "--weekday", "Funday"
    )
    assert "window.weekday" in line
    assert "not found" in served.fails(
        "queue", "budget", "set", unique("nope"), "q", "--per-day", "1"
    )


def test_endpoints_grants_and_todos(served: Served, slug: str) -> None:
    listed = served.json("endpoint", "list", "--limit", "200")
    assert slug in {item["slug"] for item in listed["items"]}
    assert slug in served.ok("endpoint", "list")
    shown = served.json("endpoint", "show", slug)
    assert shown["slug"] == slug and shown["grants"] == []

    grant = served.json("grant", "create", slug, "--verb", "claim", "--queue", "inbox")
    assert grant["token"].startswith("sba_") and grant["verbs"] == ["claim"]
    assert "(shown once)" in served.ok("grant", "create", slug)
    assert grant["id"] in served.ok("endpoint", "show", slug)
    assert served.ok("grant", "revoke", grant["id"]) == f"revoked grant {grant['id']}\n"

    added = served.json("todo", "add", slug, "inbox", "Write it", "--payload", '{"n": 1}')
    assert added["payload"] == {"n": 1} and added["state"] == "pending"
    assert added["id"] in served.ok("todo", "list", "--endpoint", slug)
    assert "Write it" in served.ok("todo", "show", added["id"])
    page = served.json("todo", "list", "--endpoint", slug, "--state", "pending", "--limit", "1")
    assert [item["id"] for item in page["items"]] == [added["id"]] and page["next"] is None
    assert served.json("todo", "cancel", added["id"])["state"] == "cancelled"
    assert "is already cancelled" in served.fails("todo", "cancel", added["id"])
    assert "not JSON" in served.fails("todo", "add", slug, "q", "t", "--payload", "{", code=2)


def test_queue_list(served: Served, slug: str) -> None:
    served.ok("todo", "add", slug, "a", "one")
    out = served.ok("queue", "list", slug)
    assert out.splitlines()[1].split()[:2] == [f"{slug}/a", "1"]
    assert served.json("queue", "list", slug)[0]["counts"]["pending"] == 1


def test_missing_bad_token_and_unreachable_server(served: Served) -> None:
    line = served.fails("endpoint", "list", SWITCHBOARD_TOKEN="")
    assert "SWITCHBOARD_TOKEN is not set" in line
    assert served.fails("endpoint", "list", token="sbo_nope") == (
        "switchboard: the token is unknown or revoked\n"
    )
    assert "cannot reach" in served.fails("endpoint", "list", SWITCHBOARD_URL="http://127.0.0.1:9")


def test_the_console_script_over_a_real_process(served: Served) -> None:
    script = Path(sys.executable).parent / "switchboard"
    env = {**os.environ, "SWITCHBOARD_URL": served.url, "SWITCHBOARD_TOKEN": served.token}
    done = subprocess.run(
        [str(script), "queue", "budget", "show", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert isinstance(json.loads(done.stdout), list)
