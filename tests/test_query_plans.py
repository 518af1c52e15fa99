"""The claim path is index driven (SPEC §10): no sort or scan over a whole queue, and a live
claim is never on the path of the next claim."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from switchboard.store import todos
from tests.conftest import make_endpoint, make_human

CLAIM_INDEXES = {
    "idx_todos_pending",
    "idx_todos_claimed_endpoint_queue",
    "idx_todos_retry_due",
    "todos_pkey",
    "todo_attempts_todo_id_attempt_key",
}


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


@pytest.fixture
def seeded(clone_db: str) -> Iterator[tuple[psycopg.Connection[Any], Any]]:
    with psycopg.connect(clone_db) as conn:
        endpoint = make_endpoint(conn, make_human(conn))
        conn.execute(
            "INSERT INTO queues (endpoint_id, name) SELECT %s, 'q' || i"
            " FROM generate_series(0, 19) i",
            (endpoint.id,),
        )
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title, created_at)"
            " SELECT %s, 'q' || (i %% 20), 't', now() - make_interval(secs => 100000 - i)"
            " FROM generate_series(1, 60000) i",
            (endpoint.id,),
        )
        # The oldest 5,000 are claimed with live leases: they must not be on the claim path.
        conn.execute(
            "UPDATE todos SET state = 'claimed', attempt = 1, claimed_at = now(),"
            " lease_expires_at = now() + interval '1 hour'"
            " WHERE id IN (SELECT id FROM todos ORDER BY created_at LIMIT 5000)"
        )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
        conn.autocommit = False
        yield conn, endpoint


def explain(conn: psycopg.Connection[Any], endpoint: Any, queues: list[str] | None) -> Any:
    params = {
        "endpoint_id": endpoint.id,
        "queues": queues,
        "excluded": [],
        "lease_seconds": None,
        "claimant_endpoint_id": endpoint.id,
        "claimant_human_id": None,
        "actor": "x",
        "now": None,
    }
    query = b"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + todos._CLAIM_NEXT.encode()
    row = conn.execute(query, params).fetchone()
    conn.rollback()
    assert row is not None
    return row[0][0]


@pytest.mark.parametrize("queues", [["q3"], None], ids=["one-queue", "all-20-queues"])
def test_claim_next_reads_a_handful_of_index_entries(seeded: Any, queues: Any) -> None:
    conn, endpoint = seeded
    plan = explain(conn, endpoint, queues)
    todo_scans = [
        n
        for n in nodes(plan["Plan"])
        if n.get("Relation Name") == "todos" and n["Node Type"] != "ModifyTable"
    ]
    assert todo_scans
    for scan in todo_scans:
        if scan["Node Type"] == "Bitmap Heap Scan":  # ids fetched by primary key (= ANY)
            [probe] = scan["Plans"]
            assert probe["Node Type"] == "Bitmap Index Scan", probe
            assert probe["Index Name"] == "todos_pkey", probe
        else:
            assert scan["Node Type"] in ("Index Scan", "Index Only Scan"), scan["Node Type"]
            assert scan["Index Name"] in CLAIM_INDEXES, scan["Index Name"]
        # A probe returns at most one row per queue: nothing walks the 3,000 rows per queue.
        assert scan["Actual Rows"] <= 1, scan
    for sort in (n for n in nodes(plan["Plan"]) if n["Node Type"] == "Sort"):
        assert sort["Actual Rows"] <= 20, sort
    # Shared buffers touched for the whole claim stay small and independent of queue depth.
    assert plan["Plan"]["Shared Hit Blocks"] + plan["Plan"].get("Shared Read Blocks", 0) < 400
