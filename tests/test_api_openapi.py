"""The OpenAPI document (R-API): valid OpenAPI 3.1, generated from the same marshmallow
schemas, describing bearer auth, every route of the API and every error response; and no
route answers a hostile request with a 500 (R-SAFE)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from openapi_spec_validator import validate

from tests.api_support import API, Operator, new_token, running_app

ROUTES = {
    ("get", "/humans"),
    ("post", "/humans"),
    ("get", "/endpoints"),
    ("post", "/endpoints"),
    ("get", "/endpoints/{slug}"),
    ("post", "/endpoints/{slug}/grants"),
    ("delete", "/grants/{id}"),
    ("get", "/todos"),
    ("post", "/todos"),
    ("get", "/todos/{id}"),
    ("post", "/todos/{id}/claim"),
    ("post", "/todos/{id}/complete"),
    ("post", "/todos/{id}/fail"),
    ("post", "/todos/{id}/release"),
    ("post", "/todos/{id}/cancel"),
    ("get", "/queues"),
    ("get", "/admission"),
    ("get", "/admission/{scope}/{queue}"),
    ("put", "/admission/{scope}/{queue}"),
    ("delete", "/admission/{scope}/{queue}"),
    ("get", "/openapi.json"),
}


@pytest.fixture(scope="module")
def app(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    with running_app(module_db, tmp_path_factory.mktemp("api")) as app:
        yield app


@pytest.fixture(scope="module")
def document(app: Flask) -> dict[str, Any]:
    response = app.test_client().get(f"{API}/openapi.json")
    assert response.status_code == 200
    body: dict[str, Any] = response.get_json()
    return body


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, op in item.items():
            if method != "parameters":
                yield method, path.removeprefix(API), op


def test_the_document_is_valid_openapi_3_1(document: dict[str, Any]) -> None:
    assert document["openapi"] == "3.1.0"
    validate(document)


def test_every_route_is_documented_and_only_those(app: Flask, document: dict[str, Any]) -> None:
    documented = {(method, path) for method, path, _ in operations(document)}
    assert documented == ROUTES
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.endpoint.startswith("api."):
            path = re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", rule.rule).removeprefix(API)
            served |= {
                (m.lower(), path) for m in rule.methods or () if m not in ("HEAD", "OPTIONS")
            }
    assert served == ROUTES


def test_bearer_auth_and_the_error_responses(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "bearerFormat": "sbo_ operator token",
    }
    assert document["security"] == [{"bearer": []}]
    responses = document["components"]["responses"]
    assert "WWW-Authenticate" in responses["Unauthorized"]["headers"]
    assert "Retry-After" in responses["Deferred"]["headers"]
    for method, path, op in operations(document):
        codes = set(op["responses"])
        if path == "/openapi.json":
            assert op["security"] == [] and "401" not in codes
            continue
        assert "401" in codes, (method, path)
        if "requestBody" in op:
            assert {"400", "413", "422"} <= codes, (method, path)
        for code, response in op["responses"].items():
            if code.startswith(("4", "5")):
                name = response["$ref"].rsplit("/", 1)[1]
                schema = responses[name]["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Error"}
    claim = document["paths"][f"{API}/todos/{{id}}/claim"]["post"]["responses"]
    assert {"404", "409", "429", "503"} <= set(claim)
    humans = document["paths"][f"{API}/humans"]
    assert "403" in humans["get"]["responses"] and "403" in humans["post"]["responses"]


def test_the_schemas_are_the_marshmallow_ones(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    todo = schemas["Todo"]
    assert {"id", "endpoint", "queue", "state", "attempt", "admission"} <= set(todo["properties"])
    status = schemas["QueueStatus"]["properties"]
    assert status["status"]["enum"] == ["open", "deferred"]
    put = document["paths"][f"{API}/admission/{{scope}}/{{queue}}"]["put"]
    assert put["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PolicyInput"
    }
    window = schemas["WindowInput"]["properties"]
    assert window["period"]["enum"] == ["hour", "day", "week"]
    page = schemas["TodoPage"]["properties"]
    assert page["items"]["items"] == {"$ref": "#/components/schemas/Todo"}


# --- R-SAFE: hostile input never reaches a 500 -------------------------------------------------

HOSTILE_BODIES: list[Any] = [
    None,
    {},
    [],
    "text",
    17,
    {"slug": None, "queue": 5, "title": ["x"], "endpoint": {"a": 1}},
    {"verbs": "claim", "queues": "q", "lease_seconds": 1e300, "attempt": -1},
    {"max_in_flight": True, "window": "day", "result": {"deep": [[[[]]]]}},
    {"endpoint": "x" * 90, "queue": "q", "title": "t", "payload": {"\u00e9": "\U0001f600"}},
]
HOSTILE_PARAMS = {
    "slug": ["x", "-", "%20", "a" * 300, "..", "endpoint:x"],
    "id": [str(uuid.uuid4()), "0", "not-a-uuid"],
    "scope": ["endpoint:x", "team:1", ":", "endpoint:" + "a" * 300, "%2F"],
    "queue": ["q", "..", "a" * 300, "%25"],
}
HOSTILE_QUERIES = ["", "?limit=1e9&after=%%%", "?endpoint=&state=", "?a=b"]


def test_no_hostile_request_is_a_server_error(app: Flask, document: dict[str, Any]) -> None:
    operator = Operator(app.test_client(), new_token(app, admin=True))
    slug = operator.endpoint()["slug"]
    params = {name: [*values] for name, values in HOSTILE_PARAMS.items()}
    params["slug"].append(slug)
    params["scope"].append(f"endpoint:{slug}")
    statuses: set[int] = set()
    for method, template, _ in operations(document):
        for values in _param_sets(template, params):
            path = template.format(**values)
            for query in HOSTILE_QUERIES if method == "get" else [""]:
                for body in HOSTILE_BODIES if method in ("post", "put") else [None]:
                    response = operator.call(method.upper(), path + query, body)
                    statuses.add(response.status_code)
                    assert response.status_code < 500, (method, path, query, body)
                    if response.status_code >= 400:
                        assert set(response.get_json()) == {"error"}
    assert {200, 404, 422} <= statuses


def _param_sets(template: str, params: dict[str, list[str]]) -> list[dict[str, str]]:
    """Enough combinations of the path parameters that each hostile value is used once."""
    names = re.findall(r"{(\w+)}", template)
    if not names:
        return [{}]
    width = max(len(params[name]) for name in names)
    return [{n: params[n][i % len(params[n])] for n in names} for i in range(width)]
