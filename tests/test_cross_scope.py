"""Cross-scope probing (SPEC §10 R-SAFE, "a foreign scope is 404"): two humans, each owning an
endpoint with budgeted work and an agent grant. Every REST route and every MCP tool is called
with the other side's ids and scopes; the answers are 404/403 (or tool errors not_found /
forbidden), lists show nothing foreign, and the database is unchanged, byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from flask import Flask

from switchboard.mcp import registry
from switchboard.verbs import ALL_VERBS
from tests.api_support import API, Operator, new_token, sql
from tests.mcp_fixtures import META, MODERN, Agent, make_agent

POLICY = {
    "max_in_flight": 5,
    "max_claims_per_window": 100,
    "window": {"period": "day", "tz": "UTC", "start": "00:00", "weekday": None},
}


@dataclass
class Side:
    """One human's world: the operator, the endpoint, an agent, and ids in it."""

    operator: Operator
    slug: str
    endpoint_id: str
    agent: Agent
    pending: str
    claimed: str
    claimed_attempt: int
    grant_id: str


def build_side(app: Flask, db_url: str) -> Side:
    operator = Operator(app.test_client(), new_token(app))
    endpoint = operator.endpoint()
    slug = endpoint["slug"]
    pending = operator.todo(slug, "q")["id"]
    claimed_id = operator.todo(slug, "q")["id"]
    operator.ok("PUT", f"/admission/endpoint:{slug}/q", POLICY)
    claimed = operator.ok("POST", f"/todos/{claimed_id}/claim", {})["todo"]
    grant = operator.ok("POST", f"/endpoints/{slug}/grants", {}, 201)
    agent = make_agent(db_url, verbs=ALL_VERBS, endpoint=_agent_stub(endpoint["id"]))
    return Side(
        operator, slug, endpoint["id"], agent, pending, claimed_id, claimed["attempt"], grant["id"]
    )


def _agent_stub(endpoint_id: str) -> Agent:
    import uuid

    return Agent("", "", uuid.UUID(endpoint_id), uuid.uuid4())


@pytest.fixture(scope="module")
def sides(app: Flask, module_db: str) -> tuple[Side, Side]:
    return build_side(app, module_db), build_side(app, module_db)


def fingerprint(app: Flask) -> dict[str, str]:
    """A digest of every table's rows (minus usage timestamps), to prove nothing changed."""
    tables = [
        row[0] for row in sql(app, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    ]
    digests = {}
    for table in tables:  # names from the catalog, quoted
        query = (
            "SELECT md5(coalesce(string_agg(r::text, ',' ORDER BY r::text), '')) FROM"
            " (SELECT to_jsonb(t) - 'last_used_at' - 'last_seen_at' AS r"
            f' FROM "{table}" t) x'
        )
        digests[table] = sql(app, query)[0][0]
    return digests


# --- REST -------------------------------------------------------------------------------------


def rest_probes(victim: Side) -> list[tuple[str, str, str, Any]]:
    """(rule, method, path, body) naming the victim's things, for every route with an id."""
    scope = f"endpoint:{victim.slug}"
    scope_by_id = f"endpoint:{victim.endpoint_id}"
    done = {"attempt": victim.claimed_attempt}
    return [
        ("/api/v1/endpoints/<slug>", "GET", f"/endpoints/{victim.slug}", None),
        ("/api/v1/endpoints/<slug>", "GET", f"/endpoints/{victim.endpoint_id}", None),
        ("/api/v1/endpoints/<slug>/grants", "POST", f"/endpoints/{victim.slug}/grants", {}),
        ("/api/v1/grants/<uuid:id>", "DELETE", f"/grants/{victim.grant_id}", None),
        ("/api/v1/todos/<uuid:id>", "GET", f"/todos/{victim.pending}", None),
        ("/api/v1/todos/<uuid:id>", "GET", f"/todos/{victim.claimed}", None),
        ("/api/v1/todos/<uuid:id>/claim", "POST", f"/todos/{victim.pending}/claim", {}),
        ("/api/v1/todos/<uuid:id>/complete", "POST", f"/todos/{victim.claimed}/complete", done),
        (
            "/api/v1/todos/<uuid:id>/fail",
            "POST",
            f"/todos/{victim.claimed}/fail",
            {**done, "error": "x"},
        ),
        ("/api/v1/todos/<uuid:id>/release", "POST", f"/todos/{victim.claimed}/release", done),
        ("/api/v1/todos/<uuid:id>/cancel", "POST", f"/todos/{victim.pending}/cancel", {}),
        ("/api/v1/todos", "POST", "/todos", {"endpoint": victim.slug, "queue": "q", "title": "t"}),
        ("/api/v1/todos", "GET", f"/todos?endpoint={victim.slug}", None),
        ("/api/v1/queues", "GET", f"/queues?endpoint={victim.slug}", None),
        ("/api/v1/admission/<scope>/<queue>", "GET", f"/admission/{scope}/q", None),
        ("/api/v1/admission/<scope>/<queue>", "GET", f"/admission/{scope_by_id}/q", None),
        ("/api/v1/admission/<scope>/<queue>", "PUT", f"/admission/{scope}/q", POLICY),
        ("/api/v1/admission/<scope>/<queue>", "PUT", f"/admission/{scope}/new", POLICY),
        ("/api/v1/admission/<scope>/<queue>", "DELETE", f"/admission/{scope}/q", None),
        ("/api/v1/humans", "POST", "/humans", {"email": "intruder@example.com"}),
    ]


# Routes with no foreign id: what they list must hold nothing of the other side.
LISTS = [
    ("/api/v1/endpoints", "GET", "/endpoints"),
    ("/api/v1/todos", "GET", "/todos"),
    ("/api/v1/queues", "GET", "/queues"),
    ("/api/v1/admission", "GET", "/admission"),
    ("/api/v1/humans", "GET", "/humans"),
    ("/api/v1/endpoints", "POST", "/endpoints"),  # creates one's own: probed in its own test
    ("/api/v1/openapi.json", "GET", "/openapi.json"),
]


def test_every_rest_route_is_probed(app: Flask, sides: tuple[Side, Side]) -> None:
    routes = {
        (rule.rule, method)
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith(API)
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    probed = {(rule, method) for rule, method, _, _ in rest_probes(sides[0])}
    probed |= {(rule, method) for rule, method, _ in LISTS}
    assert routes == probed


@pytest.mark.parametrize("direction", [(0, 1), (1, 0)])
def test_a_human_never_reaches_anothers_things(
    app: Flask, sides: tuple[Side, Side], direction: tuple[int, int]
) -> None:
    intruder, victim = sides[direction[0]], sides[direction[1]]
    before = fingerprint(app)
    for _, method, path, body in rest_probes(victim):
        response = intruder.operator.call(method, path, body)
        assert response.status_code in (403, 404), (method, path, response.get_data(as_text=True))
    assert fingerprint(app) == before
    foreign = json.dumps([victim.slug, victim.endpoint_id, victim.pending, victim.claimed])
    for _, method, path in LISTS[:4]:
        listed = intruder.operator.ok(method, path)
        text = json.dumps(listed)
        for value in json.loads(foreign):
            assert value not in text, (path, value)


def test_agent_tokens_are_no_operator_tokens(app: Flask, sides: tuple[Side, Side]) -> None:
    client = app.test_client()
    agent = sides[0].agent
    for _, method, path, body in rest_probes(sides[0]):
        response = client.open(API + path, method=method, json=body, headers=agent.headers)
        assert response.status_code == 401, (method, path)


# --- MCP --------------------------------------------------------------------------------------


def tool(app: Flask, token: str, name: str, arguments: dict[str, Any]) -> tuple[int, Any]:
    """A stateless (2026-07-28) tools/call; returns (HTTP status, JSON body)."""
    response = app.test_client().post(
        "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": name, "arguments": arguments, "_meta": META},
        },
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "tools/call",
            "Mcp-Name": name,
        },
    )
    return response.status_code, response.get_json()


def mcp_probes(victim: Side) -> list[tuple[str, dict[str, Any]]]:
    held = {"id": victim.claimed, "attempt": victim.claimed_attempt}
    return [
        ("get_todo", {"id": victim.pending}),
        ("get_todo", {"id": victim.claimed}),
        ("claim", {"id": victim.pending}),
        ("heartbeat", held),
        ("complete", held),
        ("fail", {**held, "error": "x"}),
        ("release", held),
        ("create_todo", {"queue": "q", "title": "t", "endpoint": victim.slug}),
        ("create_todo", {"queue": "q", "title": "t", "endpoint": victim.endpoint_id}),
    ]


# Tools with no foreign id: they act on the caller's own endpoint; checked for leaks below.
OWN_SCOPE_TOOLS = {
    "whoami",
    "list_todos",
    "claim_next",
    "admission_status",
    "set_admission_policy",
    "clear_admission_policy",
}


def test_every_tool_is_probed(sides: tuple[Side, Side]) -> None:
    probed = {name for name, _ in mcp_probes(sides[0])}
    assert probed | OWN_SCOPE_TOOLS == set(registry.REGISTRY)


@pytest.mark.parametrize("direction", [(0, 1), (1, 0)])
def test_an_agent_never_reaches_another_endpoints_things(
    app: Flask, sides: tuple[Side, Side], direction: tuple[int, int]
) -> None:
    intruder, victim = sides[direction[0]], sides[direction[1]]
    before = fingerprint(app)
    for name, arguments in mcp_probes(victim):
        status, body = tool(app, intruder.agent.token, name, arguments)
        assert status == 200, (name, body)
        result = body["result"]
        assert result["isError"], (name, result)
        assert result["structuredContent"]["error"]["code"] in ("not_found", "forbidden"), (
            name,
            result,
        )
    # Reads scoped to the caller show nothing of the victim's.
    for name, arguments in [
        ("whoami", {}),
        ("list_todos", {}),
        ("list_todos", {"queue": "q"}),
        ("admission_status", {}),
        ("admission_status", {"queue": "q"}),
    ]:
        status, body = tool(app, intruder.agent.token, name, arguments)
        text = json.dumps(body)
        for value in (victim.slug, victim.endpoint_id, victim.pending, victim.claimed):
            assert value not in text, (name, value)
    assert fingerprint(app) == before


def test_own_scope_writes_never_touch_the_other_endpoint(
    app: Flask, sides: tuple[Side, Side]
) -> None:
    """claim_next and the admission family act on the caller's endpoint only: the victim's
    rows (todos, policies, windows, audit) are the same afterwards."""
    intruder, victim = sides
    query = (
        "SELECT (SELECT md5(string_agg(to_jsonb(t)::text, ',' ORDER BY t.id)) FROM todos t"
        "         WHERE t.endpoint_id = %(e)s),"
        "       (SELECT md5(string_agg(to_jsonb(p)::text, ',')) FROM admission_policies p"
        "         WHERE p.endpoint_id = %(e)s),"
        "       (SELECT count(*) FROM admission_policy_audit a WHERE a.endpoint_id = %(e)s)"
    )
    before = sql(app, query, {"e": victim.endpoint_id})
    token = intruder.agent.token
    status, body = tool(app, token, "claim_next", {"queues": ["q"]})
    assert (status == 200 and "todo" not in body["result"]["structuredContent"]) or (
        body["result"]["structuredContent"]["todo"]["endpoint"] == intruder.slug
    )
    assert tool(app, token, "set_admission_policy", {"queue": "q", "policy": POLICY})[0] == 200
    assert tool(app, token, "clear_admission_policy", {"queue": "q"})[0] == 200
    assert sql(app, query, {"e": victim.endpoint_id}) == before


def test_a_queue_scoped_grant_never_reaches_other_queues(
    app: Flask, module_db: str, sides: tuple[Side, Side]
) -> None:
    """A grant limited to some queues of its own endpoint: the other queues are out of scope,
    even for a claim whose id and attempt (the fencing token) it somehow knows."""
    owner = sides[0]
    pending = owner.operator.todo(owner.slug, "elsewhere")["id"]
    held = owner.operator.todo(owner.slug, "elsewhere")["id"]
    attempt = owner.operator.ok("POST", f"/todos/{held}/claim", {})["todo"]["attempt"]
    scoped = make_agent(
        module_db, verbs=ALL_VERBS, queues=["q"], endpoint=_agent_stub(owner.endpoint_id)
    )
    before = fingerprint(app)
    for name, arguments in [
        ("get_todo", {"id": pending}),
        ("claim", {"id": pending}),
        ("heartbeat", {"id": held, "attempt": attempt}),
        ("complete", {"id": held, "attempt": attempt}),
        ("fail", {"id": held, "attempt": attempt, "error": "x"}),
        ("release", {"id": held, "attempt": attempt}),
        ("complete", {"id": pending, "attempt": 1}),
        ("create_todo", {"queue": "elsewhere", "title": "t"}),
        ("set_admission_policy", {"queue": "elsewhere", "policy": POLICY}),
        ("clear_admission_policy", {"queue": "elsewhere"}),
        ("admission_status", {"queue": "elsewhere"}),
    ]:
        status, body = tool(app, scoped.token, name, arguments)
        assert status == 200, (name, body)
        result = body["result"]
        assert result["isError"], (name, result)
        assert result["structuredContent"]["error"]["code"] in ("not_found", "forbidden"), (
            name,
            result,
        )
    status, body = tool(app, scoped.token, "claim_next", {"queues": ["elsewhere"]})
    assert status == 200 and "todo" not in body["result"]["structuredContent"], body
    assert fingerprint(app) == before


def rpc(app: Flask, token: str, method: str, params: dict[str, Any]) -> tuple[int, Any]:
    """A stateless (2026-07-28) request of any method; returns (HTTP status, JSON body)."""
    name = {"resources/read": params.get("uri")}.get(method)
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": method,
    }
    if isinstance(name, str):
        headers["Mcp-Name"] = name
    response = app.test_client().post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": META}},
        headers=headers,
    )
    return response.status_code, response.get_json()


@pytest.mark.parametrize("direction", [(0, 1), (1, 0)])
def test_another_endpoints_queues_are_no_resources_of_an_agent(
    app: Flask, sides: tuple[Side, Side], direction: tuple[int, int]
) -> None:
    """R-BELL's resources are scoped like the tools: listing shows only the caller's queues,
    and reading the victim's endpoint or queue resource is the MCP 'resource not found'."""
    intruder, victim = sides[direction[0]], sides[direction[1]]
    status, body = rpc(app, intruder.agent.token, "resources/list", {})
    assert status == 200 and victim.slug not in json.dumps(body)
    for uri in (f"switchboard://queues/{victim.slug}", f"switchboard://queues/{victim.slug}/q"):
        status, body = rpc(app, intruder.agent.token, "resources/read", {"uri": uri})
        assert body["error"]["code"] == -32002, body
        assert victim.pending not in json.dumps(body)
