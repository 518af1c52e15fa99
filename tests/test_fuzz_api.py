"""schemathesis over the operator REST API (SPEC §10 R-SAFE): every operation of
/api/v1/openapi.json, with the bearer token of an owner, an admin or a stranger, and path
parameters that name real (seeded) endpoints, todos, grants and budgeted queues as often as
random ones. The check is schemathesis's "not a server error": no input reaches a 5xx, and
none hangs (each request runs under a deadline). Examples are bounded per operation so the
module stays well under a minute.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from flask import Flask
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests import test_fuzz_mcp as fuzz_mcp
from tests.api_support import API, Operator, new_token

EXAMPLES_PER_OPERATION = 30
REQUEST_SECONDS = 10.0


@dataclass(frozen=True)
class Seeds:
    tokens: list[str]  # the owner's, an admin's, a stranger's: each authorization path
    path_values: dict[str, list[str]]


@pytest.fixture(scope="module")
def seeds(app: Flask) -> Seeds:
    """An owner's endpoint with a grant, todos in several states and a budgeted queue; an
    admin; a stranger who owns nothing."""
    owner = Operator(app.test_client(), new_token(app))
    slug = owner.endpoint()["slug"]
    grant = owner.ok("POST", f"/endpoints/{slug}/grants", {}, 201)
    todos = [owner.todo(slug, "q")["id"] for _ in range(6)]
    owner.ok("POST", f"/todos/{todos[1]}/claim", {})
    claimed = owner.ok("POST", f"/todos/{todos[2]}/claim", {})
    owner.ok("POST", f"/todos/{todos[2]}/complete", {"attempt": claimed["todo"]["attempt"]})
    policy = {
        "max_in_flight": 2,
        "max_claims_per_window": 10,
        "window": {"period": "day", "tz": "Europe/Paris", "start": "09:00", "weekday": None},
    }
    owner.ok("PUT", f"/admission/endpoint:{slug}/q", policy)
    return Seeds(
        [owner.token or "", new_token(app, admin=True), new_token(app)],
        {
            "slug": [slug],
            "id": [*todos, grant["id"]],
            "scope": [f"endpoint:{slug}", "endpoint:nope"],
            "queue": ["q", "other"],
        },
    )


def load_schema(app: Flask, seeds: Seeds) -> Any:
    """The API's own OpenAPI document, loaded through the WSGI app (no server)."""
    loaded = schemathesis.openapi.from_wsgi(f"{API}/openapi.json", app)

    @loaded.hook
    def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
        # Half the time a path names something that exists: the handlers behind the 404s.
        if not path_parameters:
            return st.just(path_parameters)
        return st.fixed_dictionaries(
            {
                name: st.sampled_from([value, *seeds.path_values.get(name, [])])
                for name, value in path_parameters.items()
            }
        )

    return loaded


_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="fuzz-api")


def within_deadline(request: Callable[[], Any]) -> Any:
    """The request's answer, or a failure if it takes longer than REQUEST_SECONDS (a hang)."""
    try:
        return _pool.submit(request).result(timeout=REQUEST_SECONDS)
    except FutureTimeout:
        raise AssertionError(f"hang: no answer within {REQUEST_SECONDS} s") from None


def test_no_input_reaches_a_server_error(app: Flask, seeds: Seeds) -> None:
    """Each operation, with data that fits the schema and data that does not. (Driven through
    hypothesis directly: schemathesis's lazy pytest fixture loader does not run on pytest 9.)"""
    schema = load_schema(app, seeds)
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20, [op.label for op in operations]
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(
                case=operation.as_strategy(generation_mode=mode),
                token=st.sampled_from(seeds.tokens),
            )
            @settings(
                max_examples=EXAMPLES_PER_OPERATION,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                database=None,
            )
            def exercise(case: Any, token: str) -> None:
                auth = {"Authorization": f"Bearer {token}"}
                response = within_deadline(lambda: case.call(headers=auth))
                case.validate_response(response, checks=[not_a_server_error], headers=auth)

            try:
                exercise()
            except Exception as exc:  # gathered, so one run names every failing operation
                failures.append(f"{operation.label} ({mode}): {exc}"[:3000])
    assert failures == [], "\n\n".join(failures)


@pytest.mark.parametrize("depth", [10, 500, 900, 950, 990, 5000])
def test_deep_json_bodies_are_refused_or_stored(app: Flask, seeds: Seeds, depth: int) -> None:
    """Deep nesting in a REST body: a 4xx or a stored todo that reads back, never a 5xx."""
    slug = seeds.path_values["slug"][0]
    opened = json.dumps({"endpoint": slug, "queue": "deep", "title": "t"})
    body = opened[:-1] + ', "payload": {"k": ' + "[" * depth + "1" + "]" * depth + "}}"
    client = app.test_client()
    headers = {"Authorization": f"Bearer {seeds.tokens[0]}", "Content-Type": "application/json"}
    made = client.post(f"{API}/todos", data=body, headers=headers)
    assert made.status_code in (201, 400, 413, 422), made.get_data(as_text=True)[:300]
    if made.status_code == 201:
        read = client.get(f"{API}/todos/{made.get_json()['id']}", headers=headers)
        assert read.status_code == 200
        listed = client.get(f"{API}/todos", query_string={"queue": "deep"}, headers=headers)
        assert listed.status_code == 200


def test_raw_hostile_bodies_and_queries_are_answered_below_500(app: Flask, seeds: Seeds) -> None:
    """What schemathesis does not send: bodies with NUL and lone surrogates (escaped and as
    invalid UTF-8), odd content types, and query strings of any text, on every route."""
    routes = [
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith(API)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"})
    ]
    names = {"slug": seeds.path_values["slug"], "id": seeds.path_values["id"]}
    names |= {"scope": seeds.path_values["scope"], "queue": seeds.path_values["queue"]}

    @given(
        route=st.sampled_from(routes),
        picks=st.dictionaries(st.sampled_from(sorted(names)), st.integers(0, 10), max_size=4),
        body=fuzz_mcp.values,
        raw=st.booleans(),
        content_type=st.sampled_from(
            ["application/json", "application/json; charset=latin-1", "text/plain", "", "x/y"]
        ),
        query=st.dictionaries(
            st.sampled_from(["endpoint", "queue", "state", "limit", "after", "x"]),
            fuzz_mcp.text,
            max_size=3,
        ),
        token=st.sampled_from(seeds.tokens),
    )
    @settings(
        max_examples=800,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def exercise(
        route: tuple[str, str],
        picks: dict[str, int],
        body: Any,
        raw: bool,
        content_type: str,
        query: dict[str, str],
        token: str,
    ) -> None:
        method, rule = route
        path = rule
        for name, choices in names.items():
            value = choices[picks.get(name, 0) % len(choices)]
            path = path.replace(f"<uuid:{name}>", value).replace(f"<{name}>", value)
        data = (
            json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
            if raw
            else json.dumps(body).encode()
        )
        headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
        safe_query = {k: v.encode("utf-8", "surrogatepass") for k, v in query.items()}
        response = within_deadline(
            lambda: app.test_client().open(
                path, method=method, data=data, headers=headers, query_string=safe_query
            )
        )
        assert response.status_code < 500, (method, path, data[:300], query, response.data[:300])

    exercise()
