"""Other people's MCP clients against Switchboard under gunicorn: the MCP Inspector CLI and the
MCP conformance suite (pinned npm packages, Node 22; installed into .cache/npm-tools).

The suite sends no Authorization header, so it tests the app behind a loopback-only wrapper
that adds an agent's (``conformance_server``); what fails by design is listed, with reasons, in
tests/conformance-expected-failures.txt.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.mcp_fixtures import Agent, NpmTools, Served

EXPECTED_FAILURES = Path(__file__).with_name("conformance-expected-failures.txt")
# Each run: the suite's own choice of revision per scenario (legacy ones at 2025-11-25, the
# 2026-07-28 ones at theirs), then every shared scenario at the other served revisions.
RUNS = {
    "default": [],
    "2026-07-28": ["--spec-version", "2026-07-28"],
    "2025-06-18": ["--spec-version", "2025-06-18"],
    "2025-03-26": ["--spec-version", "2025-03-26"],
}
# Generic scenarios: no fixtures needed, so every check must pass wherever they run.
MUST_PASS = {
    "server-initialize",
    "server-session-lifecycle",
    "ping",
    "tools-list",
    "dns-rebinding-protection",
    "server-sse-multiple-streams",
    "http-header-validation",
}
_RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[0-9-]+Z$")


# --- the Inspector CLI --------------------------------------------------------------------


def inspector(npm_tools: NpmTools, url: str, agent: Agent, *args: str) -> tuple[int, Any, str]:
    """Run ``inspector --cli`` over HTTP with the agent's bearer header: (exit code, JSON
    printed on stdout or None, stderr)."""
    result = npm_tools.run(
        "inspector",
        "--cli",
        url,
        "--transport",
        "http",
        "--header",
        f"Authorization: Bearer {agent.token}",
        *args,
        timeout=60,
    )
    output = json.loads(result.stdout) if result.stdout.strip() else None
    return result.returncode, output, result.stderr


def test_inspector_cli_lists_and_calls_tools(
    npm_tools: NpmTools, mcp_server: Served, agent: Agent, agent_factory: Callable[..., Agent]
) -> None:
    code, listed, stderr = inspector(npm_tools, mcp_server.url, agent, "--method", "tools/list")
    assert code == 0, stderr
    assert [t["name"] for t in listed["tools"]] == agent.verbs
    assert all(t["inputSchema"]["type"] == "object" and t["outputSchema"] for t in listed["tools"])

    call = ["--method", "tools/call", "--tool-name"]
    code, made, stderr = inspector(
        npm_tools, mcp_server.url, agent, *call, "create_todo", "--tool-arg", "queue=q", "title=x"
    )
    assert code == 0, stderr
    assert made["structuredContent"]["todo"]["state"] == "pending"
    code, claimed, stderr = inspector(npm_tools, mcp_server.url, agent, *call, "claim_next")
    assert code == 0, stderr
    assert claimed["structuredContent"]["todo"]["id"] == made["structuredContent"]["todo"]["id"]

    basic = agent_factory(verbs=["whoami"])
    code, _, stderr = inspector(npm_tools, mcp_server.url, basic, *call, "claim_next")
    assert code == 5, stderr  # the Inspector's tool error: it never saw claim_next listed
    assert json.loads(stderr)["error"]["code"] == "tool_not_found"


# --- the conformance suite ------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    scenario: str
    check: str | None
    reason: str

    def covers(self, scenario: str, check: str) -> bool:
        return self.scenario == scenario and self.check in (None, check)

    def __str__(self) -> str:
        return self.scenario + (f":{self.check}" if self.check else "")


def expected_failures() -> list[Expected]:
    entries = []
    for number, line in enumerate(EXPECTED_FAILURES.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        entry, _, reason = line.strip().partition(" ")
        assert reason.strip(), f"{EXPECTED_FAILURES.name}:{number}: give a reason for {entry}"
        scenario, _, check = entry.partition(":")
        entries.append(Expected(scenario, check or None, reason.strip()))
    return entries


Results = dict[str, dict[str, list[dict[str, Any]]]]  # run -> scenario -> checks


@pytest.fixture(scope="module")
def conformance(
    npm_tools: NpmTools, conformance_server: Served, tmp_path_factory: pytest.TempPathFactory
) -> Results:
    """Every server scenario of the suite (``--suite all``), once per run of RUNS."""
    results: Results = {}
    for run, args in RUNS.items():
        out = tmp_path_factory.mktemp(f"conformance-{run}")
        done = npm_tools.run(
            "conformance",
            "server",
            "--url",
            conformance_server.url,
            "--suite",
            "all",
            "-o",
            str(out),
            *args,
            timeout=300,
        )
        scenarios: dict[str, list[dict[str, Any]]] = {}
        for directory in sorted(out.iterdir()):
            match = _RESULT_DIR.match(directory.name)
            assert match, directory.name
            scenarios[match["scenario"]] = json.loads((directory / "checks.json").read_text())
        assert scenarios, f"conformance run {run} produced nothing:\n{done.stdout}\n{done.stderr}"
        results[run] = scenarios
    return results


def failures(results: Results) -> list[tuple[str, str, str, str]]:
    """(run, scenario, check id, message) of every failed check."""
    return [
        (run, scenario, check["id"], check.get("errorMessage") or "")
        for run, scenarios in results.items()
        for scenario, checks in scenarios.items()
        for check in checks
        if check["status"] == "FAILURE"
    ]


def test_conformance_generic_scenarios_pass(conformance: Results) -> None:
    seen: set[str] = set()
    for run, scenarios in conformance.items():
        for scenario in MUST_PASS & scenarios.keys():
            seen.add(scenario)
            checks = scenarios[scenario]
            bad = [c for c in checks if c["status"] == "FAILURE"]
            assert not bad, (run, scenario, bad)
            assert any(c["status"] == "SUCCESS" for c in checks) or scenario in (
                "server-sse-multiple-streams"  # JSON answers make its stream check INFO
            ), (run, scenario, checks)
    assert seen == MUST_PASS
    # The 2026-07-28 stateless scenario ran, and only its fixture-tool checks failed.
    stateless = conformance["default"]["server-stateless"]
    passed = {c["id"] for c in stateless if c["status"] == "SUCCESS"}
    assert {
        "sep-2575-server-implements-discover",
        "sep-2575-http-server-header-mismatch-400",
        "sep-2575-http-server-unsupported-version-400",
        "sep-2575-server-sends-subscription-ack",
        "sep-2575-server-tags-subscription-id",
    } <= passed


def test_conformance_failures_are_exactly_the_expected_ones(conformance: Results) -> None:
    expected = expected_failures()
    failed = failures(conformance)
    unexpected = [f for f in failed if not any(e.covers(f[1], f[2]) for e in expected)]
    assert not unexpected, "conformance checks failed that are not expected:\n" + "\n".join(
        f"  [{run}] {scenario}:{check}: {message}" for run, scenario, check, message in unexpected
    )
    stale = [e for e in expected if not any(e.covers(f[1], f[2]) for f in failed)]
    assert not stale, (
        f"these now pass (or no longer run): delete them from {EXPECTED_FAILURES.name}:\n"
        + "\n".join(f"  {e}" for e in stale)
    )
