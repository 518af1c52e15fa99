"""/metrics (SPEC §9, R-CHARGE): the claim counters after a scripted workload served by
gunicorn with two workers, the scrape-time gauges against the database, a failing collector,
and the optional bearer token."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
import psycopg
import pytest
import requests
from flask import Flask
from prometheus_client.parser import text_string_to_metric_families

from switchboard import config
from switchboard.admission.windows import Window, next_boundary, window_start
from switchboard.models import TODO_STATES
from tests.api_support import Operator, running_app
from tests.mcp_fixtures import Agent, Rpc, Served, make_agent, start_switchboard
from tests.test_mcp_admission import put_policy

DAY = {"period": "day", "tz": "UTC", "start": "00:00"}
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of an exposition: (name, sorted labels) → value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value; 0 when absent (a counter nobody incremented yet)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def scrape(base: str, **headers: str) -> Samples:
    response = requests.get(base + "/metrics", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return parse(response.text)


def sql(url: str, query: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return list(cur.fetchall()) if cur.description else []


class Workload:
    """One agent's MCP calls, each on a new connection so both workers serve them."""

    def __init__(self, served: Served, agent: Agent) -> None:
        self.rpc = Rpc(served.url, agent)

    def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        response = self.rpc.modern(
            "tools/call", {"name": name, "arguments": arguments}, Connection="close"
        )
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()["result"]
        return result

    def ok(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = self.call(name, arguments)
        assert not result.get("isError"), result
        structured: dict[str, Any] = result["structuredContent"]
        return structured

    def create(self, queue: str, title: str) -> str:
        return str(self.ok("create_todo", {"queue": queue, "title": title})["todo"]["id"])

    def claim_next(self, queue: str) -> dict[str, Any]:
        return self.ok("claim_next", {"queues": [queue]})


@pytest.fixture(scope="module")
def served(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """``switchboard serve``: gunicorn, 2 workers, on this module's database."""
    data_dir = tmp_path_factory.mktemp("metrics-serve")
    server = start_switchboard(module_db, data_dir, SWITCHBOARD_SCHEDULER="off")
    yield server
    server.stop()


def worker_pids(served: Served) -> list[int]:
    return [child.pid for child in psutil.Process(served.process.pid).children()]


def test_counters_after_a_workload_on_two_workers_match_the_database(
    served: Served, module_db: str
) -> None:
    agent = make_agent(module_db)
    put_policy(module_db, agent, "metered", {"max_claims_per_window": 6, "window": DAY})
    put_policy(module_db, agent, "capped", {"max_in_flight": 1})
    put_policy(module_db, agent, "paused", {"max_in_flight": 0})
    before = scrape(served.base)
    work = Workload(served, agent)
    ids = [work.create("metered", f"m{i}") for i in range(6)]

    # Every attempt kind on one todo: first, reclaim (after a release), retry, takeover.
    first = work.claim_next("metered")["todo"]
    work.ok("release", {"id": first["id"], "attempt": first["attempt"]})
    reclaimed = work.claim_next("metered")["todo"]
    work.ok("fail", {"id": ids[0], "attempt": reclaimed["attempt"], "error": "flaky"})
    sql(module_db, "UPDATE todos SET retry_at = now() - interval '1 s' WHERE id = %s", (ids[0],))
    retried = work.claim_next("metered")["todo"]
    lapse = "UPDATE todos SET lease_expires_at = now() - interval '1 s' WHERE id = %s"
    sql(module_db, lapse, (ids[0],))
    taken_over = work.claim_next("metered")["todo"]
    assert [first["id"], reclaimed["id"], retried["id"], taken_over["id"]] == [ids[0]] * 4
    assert work.claim_next("metered")["todo"]["id"] == ids[1]
    assert work.claim_next("metered")["todo"]["id"] == ids[2]  # the sixth unit: spent

    # Refusals: two idle claim_next answers naming the queue, one claim of a held-back todo.
    for _ in range(2):
        idle = work.claim_next("metered")
        assert idle["deferred"][0]["reason"] == "window_exhausted"
    refused = work.call("claim", {"id": ids[3]})
    assert refused["isError"] and refused["structuredContent"]["error"]["code"] == "deferred"
    for queue in ("capped", "paused", "free"):
        work.create(queue, f"{queue} 1")
    work.create("capped", "capped 2")
    assert "todo" in work.claim_next("capped")
    assert work.claim_next("capped")["deferred"][0]["reason"] == "in_flight_full"
    assert work.claim_next("paused")["deferred"][0]["reason"] == "paused"
    assert "todo" in work.claim_next("free")

    after = scrape(served.base)
    ep = agent.endpoint

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    # R-CHARGE: claims counted = the window's counter = the attempt rows of the window.
    start = window_start(Window("day", "UTC", "00:00"), datetime.now(UTC))
    [(used,)] = sql(
        module_db,
        "SELECT w.used FROM admission_windows w JOIN admission_policies p ON p.id = w.policy_id"
        " WHERE p.endpoint_id = %s AND p.queue = 'metered' AND w.window_start = %s",
        (agent.endpoint_id, start),
    )
    [(rows,)] = sql(
        module_db,
        "SELECT count(*) FROM todo_attempts WHERE endpoint_id = %s AND queue = 'metered'"
        " AND claimed_at >= %s",
        (agent.endpoint_id, start),
    )
    assert delta("switchboard_todos_claimed_total", endpoint=ep, queue="metered") == used == rows
    assert used == 6
    assert delta("switchboard_admission_charged_total", endpoint=ep, queue="metered") == 6
    for queue in ("capped", "free"):  # claimed, and not charged: no window limit
        assert delta("switchboard_todos_claimed_total", endpoint=ep, queue=queue) == 1
        assert delta("switchboard_admission_charged_total", endpoint=ep, queue=queue) == 0

    kinds = sql(
        module_db,
        "SELECT queue, kind, count(*) FROM todo_attempts WHERE endpoint_id = %s"
        " GROUP BY queue, kind",
        (agent.endpoint_id,),
    )
    assert {(q, k) for q, k, _ in kinds} >= {("metered", k) for k in ("first", "reclaim")}
    assert {k for q, k, _ in kinds if q == "metered"} == {"first", "reclaim", "retry", "takeover"}
    for queue, kind, count in kinds:
        labels = {"endpoint": ep, "queue": queue, "kind": kind}
        assert delta("switchboard_todo_attempts_total", **labels) == count

    refusals = {
        ("metered", "window_exhausted"): 3,
        ("capped", "in_flight_full"): 1,
        ("paused", "paused"): 1,
    }
    for (queue, reason), count in refusals.items():
        labels = {"endpoint": ep, "queue": queue, "reason": reason}
        assert delta("switchboard_admission_refused_total", **labels) == count

    # Both workers served the workload, and their counters are summed in every scrape.
    directory = (
        served.log.parent / "prometheus" / served.base.removeprefix("http://").replace(":", "_")
    )
    assert len({path.name for path in directory.glob("counter_*.db")}) >= 2


def test_the_gauges_equal_the_database(served: Served, module_db: str) -> None:
    agent = make_agent(module_db)
    put_policy(
        module_db, agent, "metered", {"max_claims_per_window": 2, "max_in_flight": 5, "window": DAY}
    )
    work = Workload(served, agent)
    for title in ("a", "b", "c", "d"):
        work.create("metered", title)
    work.create("other", "x")
    claimed = work.claim_next("metered")["todo"]
    work.ok("complete", {"id": claimed["id"], "attempt": claimed["attempt"]})
    work.claim_next("metered")

    samples = scrape(served.base)
    ep, now = agent.endpoint, datetime.now(UTC)
    counts = dict(
        sql(
            module_db,
            "SELECT queue || '/' || state, count(*) FROM todos WHERE endpoint_id = %s"
            " GROUP BY queue, state",
            (agent.endpoint_id,),
        )
    )
    for queue in ("metered", "other"):
        for state in TODO_STATES:
            labels = {"endpoint": ep, "queue": queue, "state": state}
            assert value(samples, "switchboard_queue_todos", **labels) == counts.get(
                f"{queue}/{state}", 0
            )
    [(oldest,)] = sql(
        module_db,
        "SELECT extract(epoch FROM now() - min(created_at)) FROM todos"
        " WHERE endpoint_id = %s AND queue = 'metered' AND state = 'pending'",
        (agent.endpoint_id,),
    )
    age = value(
        samples, "switchboard_queue_oldest_pending_age_seconds", endpoint=ep, queue="metered"
    )
    assert 0 < age <= float(oldest) + 1

    gauge = {
        name: value(samples, f"switchboard_admission_{name}", endpoint=ep, queue="metered")
        for name in ("limit", "used", "remaining", "in_flight", "in_flight_cap")
    }
    assert gauge == {"limit": 2, "used": 2, "remaining": 0, "in_flight": 1, "in_flight_cap": 5}
    resets = value(
        samples, "switchboard_admission_window_resets_at_seconds", endpoint=ep, queue="metered"
    )
    assert resets == next_boundary(Window("day", "UTC", "00:00"), now).timestamp()
    held_back = value(
        samples, "switchboard_admission_deferred_pending", endpoint=ep, queue="metered"
    )
    assert held_back == counts["metered/pending"] == 2
    # A queue without a policy has no admission gauges.
    assert ("switchboard_admission_used", (("endpoint", ep), ("queue", "other"))) not in samples


def test_a_failing_admission_read_is_counted_and_the_scrape_still_answers(
    served: Served, module_db: str
) -> None:
    agent = make_agent(module_db)
    put_policy(module_db, agent, "metered", {"max_claims_per_window": 2, "window": DAY})
    Workload(served, agent).create("metered", "a")
    errors = ("switchboard_collection_errors_total", (("collector", "admission"),))
    used = ("switchboard_admission_used", (("endpoint", agent.endpoint), ("queue", "metered")))
    before = scrape(served.base)
    assert before[errors] == 0 and used in before
    sql(module_db, "ALTER TABLE admission_windows RENAME TO admission_windows_away")
    try:
        during = scrape(served.base)
    finally:
        sql(module_db, "ALTER TABLE admission_windows_away RENAME TO admission_windows")
    assert during[errors] == 1
    assert used not in during  # no stale or made-up admission values
    queue = (("endpoint", agent.endpoint), ("queue", "metered"), ("state", "pending"))
    assert during[("switchboard_queue_todos", queue)] == 1  # the other collector still reads
    after = scrape(served.base)
    assert after[errors] == 1 and after[used] == 0


def test_a_killed_worker_keeps_its_counts(served: Served, module_db: str) -> None:
    agent = make_agent(module_db)
    work = Workload(served, agent)
    for title in ("a", "b", "c", "d"):
        work.create("q", title)
    for _ in range(4):
        work.claim_next("q")
    claimed = ("switchboard_todos_claimed_total", (("endpoint", agent.endpoint), ("queue", "q")))
    assert scrape(served.base)[claimed] == 4
    old = worker_pids(served)
    for pid in old:
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while len(set(worker_pids(served)) - set(old)) < 2:
        assert time.monotonic() < deadline, "gunicorn did not replace its workers"
        time.sleep(0.1)
    while requests.get(served.base + "/readyz", timeout=5).status_code != 200:
        time.sleep(0.1)
    assert scrape(served.base)[claimed] == 4


def test_metrics_needs_its_bearer_token_when_one_is_set(module_db: str, tmp_path: Path) -> None:
    settings = config.load(
        {
            "DATABASE_URL": module_db,
            "SWITCHBOARD_DATA_DIR": str(tmp_path),
            "SWITCHBOARD_SCHEDULER": "off",
            "SWITCHBOARD_METRICS_TOKEN": "scrape-me-please-0123",
        }
    )
    with running_app(module_db, tmp_path) as open_app:
        assert open_app.test_client().get("/metrics").status_code == 200
    from app import create_app
    from switchboard import extensions

    app = create_app({"config": settings, "TESTING": True})
    try:
        client = app.test_client()
        for headers in ({}, {"Authorization": "Bearer wrong-token-0123456789"}):
            response = client.get("/metrics", headers=headers)
            assert response.status_code == 401
            assert response.headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
            assert json.loads(response.data)["error"]["code"] == "unauthorized"
        good = client.get("/metrics", headers={"Authorization": "Bearer scrape-me-please-0123"})
        assert good.status_code == 200
        assert "switchboard_collection_errors_total" in good.data.decode()
    finally:
        extensions.database(app).close()


def test_a_short_metrics_token_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError, match="SWITCHBOARD_METRICS_TOKEN"):
        config.load({"SWITCHBOARD_DATA_DIR": str(tmp_path), "SWITCHBOARD_METRICS_TOKEN": "short"})


def test_the_boards_claims_and_refusals_are_counted_under_the_endpoint_slug(
    app: Flask, alice: Operator, slug: str
) -> None:
    """The operator-owned claim names only the todo: its refusals find the endpoint."""
    client = app.test_client()
    before = parse(client.get("/metrics").get_data(as_text=True))
    alice.ok("PUT", f"/admission/endpoint:{slug}/q", {"max_claims_per_window": 1, "window": DAY})
    first, second = alice.todo(slug), alice.todo(slug)
    assert alice.post(f"/todos/{first['id']}/claim").status_code == 200
    assert alice.post(f"/todos/{second['id']}/claim").status_code == 429
    after = parse(client.get("/metrics").get_data(as_text=True))

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("switchboard_todos_claimed_total", endpoint=slug, queue="q") == 1
    assert delta("switchboard_todo_attempts_total", endpoint=slug, queue="q", kind="first") == 1
    assert delta("switchboard_admission_charged_total", endpoint=slug, queue="q") == 1
    labels = {"endpoint": slug, "queue": "q", "reason": "window_exhausted"}
    assert delta("switchboard_admission_refused_total", **labels) == 1


def test_a_scrape_reads_the_database_in_a_fixed_number_of_statements(
    app: Flask, alice: Operator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two gauge reads and one label read, however many queues and policies there are."""
    sent: list[str] = []
    original = psycopg.Cursor.execute

    def recording(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append(str(query))
        return original(cursor, query, *args, **kwargs)

    def statements() -> int:
        sent.clear()
        with monkeypatch.context() as patch:
            patch.setattr(psycopg.Cursor, "execute", recording)
            assert app.test_client().get("/metrics").status_code == 200
        return len(sent)

    def budgeted_queues(slug: str, count: int) -> None:
        for n in range(count):
            alice.todo(slug, f"q{n}")
            alice.ok("PUT", f"/admission/endpoint:{slug}/q{n}", {"max_in_flight": 3})
            todo = alice.todo(slug, f"q{n}")
            alice.ok("POST", f"/todos/{todo['id']}/claim")  # a counter labelled by this endpoint

    budgeted_queues(alice.endpoint()["slug"], 1)
    few = statements()
    budgeted_queues(alice.endpoint()["slug"], 12)
    assert statements() == few == 3
