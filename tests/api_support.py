"""Helpers for the operator API tests: a real app on a real database, humans made straight in
it, and a small client that sends the bearer token and JSON."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from app import create_app
from switchboard import config, extensions
from switchboard.services import accounts

API = "/api/v1"


@contextmanager
def running_app(url: str, data_dir: Path) -> Iterator[Flask]:
    """The real app (no scheduler) on the database at ``url``; its pool closed afterwards."""
    app = create_app(
        {
            "config": config.load(
                {
                    "DATABASE_URL": url,
                    "SWITCHBOARD_DATA_DIR": str(data_dir),
                    "SWITCHBOARD_SCHEDULER": "off",
                    "SWITCHBOARD_DOORBELLS": "off",
                }
            ),
            "TESTING": True,
        }
    )
    try:
        yield app
    finally:
        extensions.database(app).close()


def new_token(app: Flask, *, admin: bool = False) -> str:
    """A fresh human's first API token."""
    with extensions.database(app).transaction() as conn:
        created = accounts.create_human(
            conn, data={"email": f"op-{uuid.uuid4().hex[:10]}@example.com", "is_admin": admin}
        )
    return created.token


def sql(app: Flask, query: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """Run SQL in the app's database (test setup and checks only)."""
    with extensions.database(app).transaction() as conn:
        cur = conn.execute(query, params)
        return list(cur.fetchall()) if cur.description else []


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@dataclass
class Operator:
    """A test client acting as one human."""

    client: FlaskClient
    token: str | None

    def call(self, method: str, path: str, body: Any = None, **kwargs: Any) -> TestResponse:
        headers = dict(kwargs.pop("headers", {}))
        if self.token is not None:
            headers.setdefault("Authorization", f"Bearer {self.token}")
        if body is not None:
            kwargs["json"] = body
        return self.client.open(API + path, method=method, headers=headers, **kwargs)

    def get(self, path: str, **kwargs: Any) -> TestResponse:
        return self.call("GET", path, **kwargs)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> TestResponse:
        return self.call("POST", path, body, **kwargs)

    def put(self, path: str, body: Any = None, **kwargs: Any) -> TestResponse:
        return self.call("PUT", path, body, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> TestResponse:
        return self.call("DELETE", path, **kwargs)

    def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        """The JSON of a call that must answer ``status``."""
        response = self.call(method, path, body)
        assert response.status_code == status, response.get_data(as_text=True)
        return response.get_json() if response.data else None

    def endpoint(self, slug: str | None = None) -> dict[str, Any]:
        return self.ok("POST", "/endpoints", {"slug": slug or unique("ep")}, 201)

    def todo(self, endpoint: str, queue: str = "q", **fields: Any) -> dict[str, Any]:
        body = {"endpoint": endpoint, "queue": queue, "title": "t", **fields}
        return self.ok("POST", "/todos", body, 201)


def error(response: TestResponse) -> dict[str, Any]:
    """The ``error`` object of an error response (asserting the one error shape)."""
    body = response.get_json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert {"code", "message"} <= set(body["error"]) <= {"code", "message", "details"}
    return body["error"]


# Fixtures shared by the API test modules (imported there by name).


@pytest.fixture(scope="module")
def app(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Flask]:
    with running_app(module_db, tmp_path_factory.mktemp("api")) as app:
        yield app


@pytest.fixture
def alice(app: Flask) -> Operator:
    return Operator(app.test_client(), new_token(app))


@pytest.fixture
def bob(app: Flask) -> Operator:
    return Operator(app.test_client(), new_token(app))


@pytest.fixture
def slug(alice: Operator) -> str:
    return str(alice.endpoint()["slug"])
