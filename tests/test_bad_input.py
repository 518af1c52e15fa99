"""Bad input is refused with a typed error naming the field or state, and nothing is written."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg import Connection

from switchboard.errors import Conflict, Invalid, NotFound
from switchboard.models import Actor, Endpoint, Human
from switchboard.services import accounts as account_service
from switchboard.services import todos as service
from switchboard.services.todos import TodoDefaults
from switchboard.store import todos


def count_rows(conn: Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()  # type: ignore[arg-type]
    assert row is not None
    return int(row[0])


def create(conn: Connection[Any], endpoint: Endpoint, data: Any) -> Any:
    return service.create(
        conn,
        endpoint_id=endpoint.id,
        data=data,
        actor=Actor(endpoint_id=endpoint.id),
        defaults=TodoDefaults(),
    )


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"queue": "q", "title": "x" * 501}, "title"),
        ({"queue": "q", "title": ""}, "title"),
        ({"queue": "q"}, "title"),
        ({"title": "t"}, "queue"),
        ({"queue": "bad queue!", "title": "t"}, "queue"),
        ({"queue": "-leading", "title": "t"}, "queue"),
        ({"queue": "q" * 129, "title": "t"}, "queue"),
        ({"queue": "q\n", "title": "t"}, "queue"),
        ({"queue": "q", "title": "t", "payload": [1, 2]}, "payload"),
        ({"queue": "q", "title": "t", "payload": "text"}, "payload"),
        ({"queue": "q", "title": "t", "max_attempts": 0}, "max_attempts"),
        ({"queue": "q", "title": "t", "max_attempts": "many"}, "max_attempts"),
        ({"queue": "q", "title": "t", "lease_seconds": 86401}, "lease_seconds"),
        ({"queue": "q", "title": "t", "body": "b" * 65537}, "body"),
        ({"queue": "q", "title": "t", "surprise": 1}, "surprise"),
        ({"queue": "q", "title": "nul\x00"}, "title"),
        ({"queue": "q", "title": "t", "body": "\x00"}, "body"),
        ({"queue": "q", "title": "t", "payload": {"deep": ["ok", "n\x00l"]}}, "payload"),
        ({"queue": "q", "title": "t", "payload": {"k\x00": 1}}, "payload"),
    ],
)
def test_bad_todo_fields_are_named_and_nothing_is_written(
    conn: Connection[Any], endpoint: Endpoint, data: dict[str, Any], field: str
) -> None:
    before = (count_rows(conn, "todos"), count_rows(conn, "events"), count_rows(conn, "queues"))
    with pytest.raises(Invalid) as err:
        create(conn, endpoint, data)
    assert field in err.value.fields
    assert field in err.value.message
    after = (count_rows(conn, "todos"), count_rows(conn, "events"), count_rows(conn, "queues"))
    assert after == before


def test_a_non_object_body_is_refused(conn: Connection[Any], endpoint: Endpoint) -> None:
    with pytest.raises(Invalid) as err:
        create(conn, endpoint, ["queue", "title"])
    assert "_schema" in err.value.fields


def test_unknown_ids_and_wrong_states_are_typed(conn: Connection[Any], endpoint: Endpoint) -> None:
    with pytest.raises(NotFound):
        todos.get(conn, id=uuid.uuid4(), endpoint_id=endpoint.id)
    todo = create(conn, endpoint, {"queue": "q", "title": "t"})
    with pytest.raises(Conflict) as err:
        todos.finish(
            conn, action="complete", id=todo.id, endpoint_id=endpoint.id, attempt=0, actor="x"
        )
    assert err.value.details["state"] == "pending"
    assert "pending" in err.value.message
    assert todos.get(conn, id=todo.id).state == "pending"


def test_bad_endpoint_slug_and_taken_slug(conn: Connection[Any], owner: Human) -> None:
    with pytest.raises(Invalid) as err:
        account_service.create_endpoint(conn, owner=owner, data={"slug": "Not A Slug"})
    assert "slug" in err.value.fields
    account_service.create_endpoint(conn, owner=owner, data={"slug": "taken"})
    with pytest.raises(Conflict) as conflict:
        account_service.create_endpoint(conn, owner=owner, data={"slug": "taken"})
    assert conflict.value.details == {"field": "slug"}


def test_grants_refuse_unknown_verbs_and_bad_queues(
    conn: Connection[Any], owner: Human, endpoint: Endpoint
) -> None:
    before = count_rows(conn, "grants")
    with pytest.raises(Invalid) as err:
        account_service.create_grant(conn, endpoint=endpoint, granted_by=owner, verbs=["fly"])
    assert "verbs" in err.value.fields
    with pytest.raises(Invalid) as err:
        account_service.create_grant(
            conn, endpoint=endpoint, granted_by=owner, queues=["ok", "not ok"]
        )
    assert "queues" in err.value.fields
    assert count_rows(conn, "grants") == before


def test_tokens_are_stored_hashed_and_authenticate(
    conn: Connection[Any], owner: Human, endpoint: Endpoint
) -> None:
    made = account_service.create_human(conn, data={"email": "ops@example.com"})
    assert made.token.startswith("sbo_")
    assert account_service.authenticate_human(conn, token=made.token) == made.human
    assert account_service.authenticate_human(conn, token=made.token + "x") is None
    vend = account_service.create_grant(conn, endpoint=endpoint, granted_by=owner)
    assert vend.token.startswith("sba_") and vend.grant.verbs == [
        "whoami",
        "create_todo",
        "get_todo",
        "list_todos",
    ]
    assert account_service.authenticate_grant(conn, token=vend.token) == vend.grant
    stored = conn.execute(
        "SELECT token_hash FROM api_tokens UNION ALL SELECT token_hash FROM grants"
    ).fetchall()
    assert all(made.token.encode() not in bytes(r[0]) for r in stored)
    assert all(len(bytes(r[0])) == 32 for r in stored)


def test_duplicate_human_email_is_named(conn: Connection[Any]) -> None:
    account_service.create_human(conn, data={"email": "dup@example.com"})
    with pytest.raises(Invalid) as err:
        account_service.create_human(conn, data={"email": "DUP@example.com"})
    assert "email" in err.value.fields
