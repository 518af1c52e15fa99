"""Operator API (R-API): bearer auth, humans, endpoints, grants, and bad requests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from flask import Flask

from switchboard import extensions
from switchboard.services import accounts
from switchboard.tokens import hash_token
from switchboard.verbs import BASIC_VERBS
from tests.api_support import Operator, error, new_token, running_app, sql, unique


@pytest.fixture(scope="module")
def app(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    with running_app(module_db, tmp_path_factory.mktemp("api")) as app:
        yield app


@pytest.fixture(scope="module")
def admin(app: Flask) -> Operator:
    return Operator(app.test_client(), new_token(app, admin=True))


@pytest.fixture
def alice(app: Flask) -> Operator:
    return Operator(app.test_client(), new_token(app))


@pytest.fixture
def bob(app: Flask) -> Operator:
    return Operator(app.test_client(), new_token(app))


# --- authentication -------------------------------------------------------------------------


def test_no_token_is_401_with_a_bearer_challenge(app: Flask) -> None:
    response = Operator(app.test_client(), None).get("/endpoints")
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="switchboard"'
    assert error(response)["code"] == "unauthorized"


@pytest.mark.parametrize(
    "header", ["Bearer sbo_nope", "Bearer ", "Basic dXNlcjpwYXNz", "sbo_x", "Bearer sba_agent"]
)
def test_bad_tokens_are_401(app: Flask, header: str) -> None:
    response = Operator(app.test_client(), None).get("/todos", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert error(response)["code"] == "unauthorized"


def test_an_agent_token_is_not_an_operator_token(app: Flask, alice: Operator) -> None:
    slug = alice.endpoint()["slug"]
    token = alice.ok("POST", f"/endpoints/{slug}/grants", {}, 201)["token"]
    response = Operator(app.test_client(), token).get("/endpoints")
    assert response.status_code == 401
    assert 'error="invalid_token"' in response.headers["WWW-Authenticate"]


def test_a_revoked_token_is_401(app: Flask) -> None:
    token = new_token(app)
    operator = Operator(app.test_client(), token)
    assert operator.get("/endpoints").status_code == 200
    sql(
        app,
        "UPDATE api_tokens SET revoked_at = now() WHERE token_hash = %(h)s",
        {"h": hash_token(token)},
    )
    assert operator.get("/endpoints").status_code == 401


def test_the_openapi_document_needs_no_token(app: Flask) -> None:
    response = Operator(app.test_client(), None).get("/openapi.json")
    assert response.status_code == 200
    assert response.get_json()["openapi"].startswith("3.1")


# --- humans ---------------------------------------------------------------------------------


def test_admins_create_humans_whose_token_works(app: Flask, admin: Operator) -> None:
    email = f"{unique('new')}@example.com"
    created = admin.ok("POST", "/humans", {"email": email, "display_name": "New"}, 201)
    assert set(created) == {"id", "email", "display_name", "is_admin", "created_at", "token"}
    assert created["email"] == email and created["is_admin"] is False
    assert created["token"].startswith("sbo_")
    newcomer = Operator(app.test_client(), created["token"])
    assert newcomer.ok("GET", "/endpoints") == {"items": [], "next": None}


def test_a_taken_email_is_422_naming_it(admin: Operator) -> None:
    email = f"{unique('dup')}@example.com"
    admin.ok("POST", "/humans", {"email": email}, 201)
    response = admin.post("/humans", {"email": email.upper()})
    assert response.status_code == 422
    assert "email" in error(response)["details"]["fields"]


def test_non_admins_get_403_on_humans(alice: Operator) -> None:
    for response in (alice.get("/humans"), alice.post("/humans", {"email": "x@example.com"})):
        assert response.status_code == 403
        assert error(response)["code"] == "forbidden"


def test_humans_page_by_keyset(app: Flask, admin: Operator) -> None:
    for _ in range(3):
        new_token(app)
    seen: list[str] = []
    after = None
    while True:
        query = {"limit": 2} | ({"after": after} if after else {})
        page = admin.ok("GET", "/humans?" + "&".join(f"{k}={v}" for k, v in query.items()))
        assert len(page["items"]) <= 2
        seen += [human["email"] for human in page["items"]]
        after = page["next"]
        if after is None:
            break
    total = sql(app, "SELECT count(*) FROM humans")[0][0]
    assert len(seen) == len(set(seen)) == total
    assert seen == sorted(seen, key=str.lower)


# --- endpoints ------------------------------------------------------------------------------


def test_create_list_and_show_endpoints(alice: Operator) -> None:
    slug = unique("ep")
    created = alice.ok(
        "POST", "/endpoints", {"slug": slug, "notify_url": "https://example.com/hook"}, 201
    )
    assert created["slug"] == slug and created["display_name"] == slug
    assert len(created["notify_secret"]) == 64
    listed = alice.ok("GET", "/endpoints")
    assert [item["slug"] for item in listed["items"]] == [slug]
    assert "notify_secret" not in listed["items"][0]
    alice.todo(slug, queue="inbox")
    grant = alice.ok("POST", f"/endpoints/{slug}/grants", {"queues": ["inbox"]}, 201)
    shown = alice.ok("GET", f"/endpoints/{slug}")
    assert shown["queues"] == ["inbox"]
    assert [g["id"] for g in shown["grants"]] == [grant["id"]]
    assert "token" not in shown["grants"][0]
    assert alice.ok("GET", f"/endpoints/{created['id']}")["slug"] == slug  # by id too


def test_endpoints_page_by_keyset(alice: Operator) -> None:
    slugs = sorted(alice.endpoint()["slug"] for _ in range(5))
    first = alice.ok("GET", "/endpoints?limit=2")
    second = alice.ok("GET", f"/endpoints?limit=2&after={first['next']}")
    third = alice.ok("GET", f"/endpoints?limit=2&after={second['next']}")
    pages = [first, second, third]
    assert [e["slug"] for page in pages for e in page["items"]] == slugs
    assert third["next"] is None


def test_a_taken_slug_is_409_and_a_bad_one_422_with_nothing_written(
    app: Flask, alice: Operator
) -> None:
    slug = alice.endpoint()["slug"]
    response = alice.post("/endpoints", {"slug": slug})
    assert response.status_code == 409
    assert error(response)["code"] == "conflict"
    before = sql(app, "SELECT count(*) FROM endpoints")
    response = alice.post("/endpoints", {"slug": "Bad Slug!", "notify_url": "ftp://x"})
    assert response.status_code == 422
    assert set(error(response)["details"]["fields"]) == {"slug", "notify_url"}
    assert sql(app, "SELECT count(*) FROM endpoints") == before


def test_foreign_and_unknown_endpoints_are_the_same_404(alice: Operator, bob: Operator) -> None:
    slug = alice.endpoint()["slug"]
    foreign = bob.get(f"/endpoints/{slug}")
    unknown = bob.get(f"/endpoints/{slug}-x")
    assert foreign.status_code == unknown.status_code == 404
    assert error(foreign) == {"code": "not_found", "message": f"endpoint {slug!r} not found"}
    assert error(unknown) == {"code": "not_found", "message": f"endpoint {slug + '-x'!r} not found"}
    assert bob.post(f"/endpoints/{slug}/grants", {}).status_code == 404


def test_admins_manage_every_endpoint(admin: Operator, alice: Operator) -> None:
    slug = alice.endpoint()["slug"]
    assert admin.ok("GET", f"/endpoints/{slug}")["slug"] == slug
    admin.ok("POST", f"/endpoints/{slug}/grants", {}, 201)


# --- grants ---------------------------------------------------------------------------------


def test_grants_are_vended_once_and_revoked(app: Flask, alice: Operator) -> None:
    slug = alice.endpoint()["slug"]
    grant = alice.ok("POST", f"/endpoints/{slug}/grants", None, 201)
    assert grant["token"].startswith("sba_")
    assert grant["verbs"] == list(BASIC_VERBS) and grant["queues"] is None
    assert grant["endpoint"] == slug
    with extensions.database(app).transaction() as conn:
        assert accounts.authenticate_grant(conn, token=grant["token"]) is not None
    assert alice.delete(f"/grants/{grant['id']}").status_code == 204
    assert alice.delete(f"/grants/{grant['id']}").status_code == 204  # idempotent
    with extensions.database(app).transaction() as conn:
        assert accounts.authenticate_grant(conn, token=grant["token"]) is None
    (listed,) = alice.ok("GET", f"/endpoints/{slug}")["grants"]
    assert listed["id"] == grant["id"] and listed["revoked_at"] is not None


def test_grant_verbs_and_queues_are_checked(app: Flask, alice: Operator) -> None:
    slug = alice.endpoint()["slug"]
    chosen = alice.ok(
        "POST", f"/endpoints/{slug}/grants", {"verbs": ["claim", "complete"], "queues": ["a"]}, 201
    )
    assert chosen["verbs"] == ["claim", "complete"] and chosen["queues"] == ["a"]
    before = sql(app, "SELECT count(*) FROM grants")
    for body, field in [
        ({"verbs": ["fly"]}, "verbs"),
        ({"verbs": []}, "verbs"),
        ({"queues": ["bad queue"]}, "queues"),
        ({"queues": []}, "queues"),
        ({"surprise": 1}, "surprise"),
    ]:
        response = alice.post(f"/endpoints/{slug}/grants", body)
        assert response.status_code == 422, body
        assert field in error(response)["details"]["fields"]
    assert sql(app, "SELECT count(*) FROM grants") == before


def test_foreign_and_unknown_grants_are_the_same_404(alice: Operator, bob: Operator) -> None:
    slug = alice.endpoint()["slug"]
    grant = alice.ok("POST", f"/endpoints/{slug}/grants", {}, 201)
    unknown = uuid.uuid4()
    foreign = bob.delete(f"/grants/{grant['id']}")
    missing = bob.delete(f"/grants/{unknown}")
    assert foreign.status_code == missing.status_code == 404
    assert error(foreign) == {"code": "not_found", "message": f"grant {grant['id']} not found"}
    assert error(missing) == {"code": "not_found", "message": f"grant {unknown} not found"}
    assert bob.delete("/grants/not-a-uuid").status_code == 404


# --- bad requests ---------------------------------------------------------------------------


def test_malformed_json_is_400(alice: Operator) -> None:
    response = alice.post("/endpoints", data="{", content_type="application/json")
    assert response.status_code == 400
    assert error(response)["code"] == "bad_request"
    assert "JSON" in error(response)["message"]


def test_a_body_that_is_not_json_is_400(alice: Operator) -> None:
    response = alice.post(
        "/endpoints", data="slug=x", content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    assert "application/json" in error(response)["message"]


def test_a_non_object_body_is_422(alice: Operator) -> None:
    response = alice.post("/endpoints", ["slug"])
    assert response.status_code == 422
    assert "_schema" in error(response)["details"]["fields"]


def test_an_oversized_body_is_413(alice: Operator) -> None:
    big = '{"slug": "x", "display_name": "' + "x" * (1024 * 1024 + 10) + '"}'
    response = alice.post("/endpoints", data=big, content_type="application/json")
    assert response.status_code == 413
    assert error(response)["code"] == "request_entity_too_large"


def test_unknown_routes_and_methods_answer_json(alice: Operator) -> None:
    assert error(alice.get("/nothing-here"))["code"] == "not_found"
    response = alice.call("PATCH", "/endpoints")
    assert response.status_code == 405
    assert error(response)["code"] == "method_not_allowed"
    assert set(response.headers["Allow"].split(", ")) >= {"GET", "POST"}  # RFC 9110
    assert response.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize(
    "raw",
    [
        '{"slug": NaN}',
        '{"slug": "x", "n": 1e400}',
        '{"slug": "x", "n": 1' + "0" * 5000 + "}",
        "[" * 5000,
        '{"slug": "x", "display_name": "\\ud800"}',
        b"\xff\xfe{",
    ],
)
def test_json_that_python_would_accept_or_choke_on_is_400(alice: Operator, raw: str) -> None:
    response = alice.post("/endpoints", data=raw, content_type="application/json")
    assert response.status_code == 400
    message = error(response)["message"]
    assert message.startswith("the body is not valid JSON") or "lone surrogates" in message


@pytest.mark.parametrize(
    "path",
    ["/endpoints/a%00b", "/todos?endpoint=%00", "/admission/endpoint:%00/q", "/queues?x%00=1"],
)
def test_nul_in_paths_and_queries_is_400(alice: Operator, path: str) -> None:
    response = alice.get(path)
    assert response.status_code == 400
    assert "NUL" in error(response)["message"]


def test_nul_in_a_body_is_400(alice: Operator) -> None:
    response = alice.post("/endpoints", {"slug": "nul", "display_name": "a\u0000b"})
    assert response.status_code == 400


@pytest.mark.parametrize(
    "cursor", ["WyJhXHUwMDAwIl0", "WyJcdWQ4MDAiXQ", "WyJ4IiwgInkiLCAieiJd", "%%%"]
)
def test_forged_cursors_are_422(admin: Operator, cursor: str) -> None:
    for path in ("/endpoints", "/humans", "/todos"):
        response = admin.get(f"{path}?after={cursor}")
        assert response.status_code == 422, path
        assert "after" in error(response)["details"]["fields"]
