"""Admission control through the official MCP SDK client, both eras (SPEC §4-5: R-DEFER,
R-HEADROOM, R-DERIVED, R-AUDIT; the admission tools)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from mcp import Client

from switchboard.admission import service as admission
from switchboard.admission.windows import Window, next_boundary
from switchboard.store import accounts
from switchboard.verbs import ADMISSION_VERBS, BASIC_VERBS, DRAIN_VERBS
from tests.mcp_fixtures import Agent, Served
from tests.test_mcp_sdk import MODES, ok, refused, with_client

DAY = {"period": "day", "tz": "UTC", "start": "00:00"}


def boundaries() -> set[str]:
    """The next UTC midnight as the wire shows it (two candidates if the test spans one)."""
    window = Window("day", "UTC", "00:00")
    now = datetime.now(UTC)
    return {
        next_boundary(window, now).isoformat().replace("+00:00", "Z"),
        next_boundary(window, now.replace(hour=23, minute=59, second=59))
        .isoformat()
        .replace("+00:00", "Z"),
    }


def put_policy(database_url: str, agent: Agent, queue: str, policy: dict[str, Any]) -> None:
    """The owner sets a budget (as the REST API and board do, through the same service)."""
    with psycopg.connect(database_url) as conn:
        endpoint = accounts.get_endpoint(conn, key=str(agent.endpoint_id))
        admission.put_policy(
            conn,
            endpoint=endpoint,
            queue=queue,
            data=policy,
            actor_human_id=endpoint.owner_human_id,
        )


@pytest.mark.parametrize("mode", MODES)
def test_a_budgeted_queue_defers_on_every_claim_path_and_read(
    mcp_server: Served, mcp_db: str, agent: Agent, mode: str
) -> None:
    put_policy(mcp_db, agent, "metered", {"max_claims_per_window": 1, "window": DAY})
    expected_reset = boundaries()

    async def body(client: Client) -> None:
        first = (await ok(client, "create_todo", {"queue": "metered", "title": "a"}))["todo"]
        second = (await ok(client, "create_todo", {"queue": "metered", "title": "b"}))["todo"]
        assert second["admission"] == {"deferred": False}  # budgeted, still open
        claimed = await ok(client, "claim_next", {"queues": ["metered"]})
        assert claimed["todo"]["id"] == first["id"]
        headroom = claimed["admission"]
        assert (headroom["max_claims_per_window"], headroom["used"], headroom["remaining"]) == (
            1,
            1,
            0,
        )
        assert headroom["window_resets_at"] in expected_reset
        idle = await ok(client, "claim_next")
        assert idle["empty"] is True
        [item] = idle["deferred"]
        assert (item["queue"], item["reason"], item["pending"], item["exact"]) == (
            "metered",
            "window_exhausted",
            1,
            True,
        )
        assert item["next_eligible_at"] in expected_reset
        error = await refused(client, "claim", {"id": second["id"]})
        assert error["code"] == "deferred"
        assert error["details"] == item | {"pending": 1}
        read = (await ok(client, "get_todo", {"id": second["id"]}))["todo"]
        assert read["admission"] == {
            "deferred": True,
            "reason": "window_exhausted",
            "next_eligible_at": item["next_eligible_at"],
            "exact": True,
        }
        listed = await ok(client, "list_todos", {"queue": "metered", "state": "pending"})
        assert [t["admission"]["deferred"] for t in listed["todos"]] == [True]

    with_client(mcp_server, agent.headers, mode, body)
    with psycopg.connect(mcp_db) as conn:
        used = conn.execute(
            "SELECT w.used FROM admission_windows w JOIN admission_policies p"
            " ON p.id = w.policy_id WHERE p.endpoint_id = %s",
            (agent.endpoint_id,),
        ).fetchall()
    assert used == [(1,)]


@pytest.mark.parametrize("mode", MODES)
def test_admission_status_agrees_with_the_database(
    mcp_server: Served, mcp_db: str, agent: Agent, mode: str
) -> None:
    put_policy(
        mcp_db, agent, "capped", {"max_in_flight": 1, "max_claims_per_window": 10, "window": DAY}
    )

    async def body(client: Client) -> Any:
        for title in ("a", "b", "c"):
            await ok(client, "create_todo", {"queue": "capped", "title": title})
        await ok(client, "create_todo", {"queue": "free", "title": "x"})
        await ok(client, "claim_next", {"queues": ["capped"]})
        return await ok(client, "admission_status")

    status = with_client(mcp_server, agent.headers, mode, body)
    [queue] = status["queues"]  # the unbudgeted queue is not listed
    assert (queue["endpoint"], queue["queue"], queue["status"], queue["reason"]) == (
        agent.endpoint,
        "capped",
        "deferred",
        "in_flight_full",
    )
    assert queue["policy"] == {
        "max_in_flight": 1,
        "max_claims_per_window": 10,
        "window": {**DAY, "weekday": None},
    }
    with psycopg.connect(mcp_db) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM todos WHERE endpoint_id = %(e)s AND queue = 'capped'"
            "        AND state = 'claimed'),"
            "       (SELECT count(*) FROM todos WHERE endpoint_id = %(e)s AND queue = 'capped'"
            "        AND state = 'pending'),"
            "       (SELECT w.used FROM admission_windows w JOIN admission_policies p"
            "        ON p.id = w.policy_id WHERE p.endpoint_id = %(e)s)",
            {"e": agent.endpoint_id},
        ).fetchone()
    assert (queue["in_flight"], queue["pending"], queue["used"]) == row
    assert queue["remaining"] == 10 - queue["used"]
    assert queue["exact"] is False and queue["next_eligible_at"] is not None


@pytest.mark.parametrize("mode", MODES)
def test_an_agent_granted_the_admission_family_changes_its_own_budget(
    mcp_server: Served, mcp_db: str, agent_factory: Any, mode: str
) -> None:
    agent = agent_factory(verbs=[*BASIC_VERBS, *DRAIN_VERBS, *ADMISSION_VERBS])

    async def body(client: Client) -> list[Any]:
        names = {t.name for t in (await client.list_tools()).tools}
        assert set(ADMISSION_VERBS) <= names
        bad = await refused(
            client,
            "set_admission_policy",
            {"queue": "mine", "policy": {"max_claims_per_window": 5}},
        )
        set_ = await ok(
            client, "set_admission_policy", {"queue": "mine", "policy": {"max_in_flight": 2}}
        )
        cleared = await ok(client, "clear_admission_policy", {"queue": "mine"})
        again = await ok(client, "clear_admission_policy", {"queue": "mine"})
        return [bad, set_, cleared, again]

    bad, set_, cleared, again = with_client(mcp_server, agent.headers, mode, body)
    assert bad["code"] == "invalid_params"
    assert bad["details"]["fields"] == {"policy": {"window": ["a window limit needs a window"]}}
    assert set_ == {"policy": {"max_in_flight": 2, "max_claims_per_window": None, "window": None}}
    assert (cleared, again) == ({"cleared": True}, {"cleared": False})
    with psycopg.connect(mcp_db) as conn:
        owner = conn.execute(
            "SELECT granted_by_human_id FROM grants WHERE id = %s", (agent.grant_id,)
        ).fetchone()
        audit = conn.execute(
            "SELECT action, actor_human_id, actor_endpoint_id FROM admission_policy_audit"
            " WHERE endpoint_id = %s ORDER BY id",
            (agent.endpoint_id,),
        ).fetchall()
    assert owner is not None
    assert audit == [
        ("create", owner[0], agent.endpoint_id),
        ("delete", owner[0], agent.endpoint_id),
    ]


def test_without_the_admission_family_an_agent_cannot_touch_its_budget(
    mcp_server: Served, agent_factory: Any
) -> None:
    agent = agent_factory(verbs=[*BASIC_VERBS, "claim_next"])

    async def body(client: Client) -> Any:
        names = [t.name for t in (await client.list_tools()).tools]
        error = await refused(
            client, "set_admission_policy", {"queue": "mine", "policy": {"max_in_flight": 0}}
        )
        return names, error

    names, error = with_client(mcp_server, agent.headers, "legacy", body)
    assert "admission_status" in names  # rides on the drain grant
    assert not set(ADMISSION_VERBS) & set(names)
    assert error["code"] == "forbidden"
