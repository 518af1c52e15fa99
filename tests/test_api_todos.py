"""Operator API (R-API): todos — create, list with keyset pages, show, cancel and the
operator's claim, complete, fail and release; queue summaries."""

from __future__ import annotations

import uuid

import pytest
from flask import Flask

from tests.api_support import (
    Operator,
    error,
    new_token,
    sql,
)

TODO_KEYS = {
    "id",
    "endpoint",
    "queue",
    "title",
    "body",
    "payload",
    "state",
    "attempt",
    "max_attempts",
    "lease_seconds",
    "lease_expires_at",
    "claimed_at",
    "retry_at",
    "last_error",
    "result",
    "created_at",
    "updated_at",
    "finished_at",
}


def test_create_and_show_a_todo(alice: Operator, slug: str) -> None:
    created = alice.todo(slug, queue="inbox", body="b", payload={"k": [1]}, max_attempts=2)
    assert set(created) == TODO_KEYS  # no admission block: the queue has no policy
    assert created["endpoint"] == slug and created["state"] == "pending"
    assert created["payload"] == {"k": [1]} and created["max_attempts"] == 2
    assert created["created_at"].endswith("Z")
    assert alice.ok("GET", f"/todos/{created['id']}") == created


def test_create_names_every_bad_field_and_writes_nothing(app: Flask, alice: Operator) -> None:
    before = sql(app, "SELECT count(*) FROM todos")
    response = alice.post("/todos", {"queue": "bad queue", "lease_seconds": 0})
    assert response.status_code == 422
    assert set(error(response)["details"]["fields"]) == {
        "endpoint",
        "queue",
        "title",
        "lease_seconds",
    }
    assert sql(app, "SELECT count(*) FROM todos") == before


def test_todos_on_foreign_endpoints_are_404(alice: Operator, bob: Operator, slug: str) -> None:
    response = bob.post("/todos", {"endpoint": slug, "queue": "q", "title": "t"})
    assert response.status_code == 404
    assert bob.get(f"/todos?endpoint={slug}").status_code == 404


def test_foreign_and_unknown_todos_are_the_same_404(
    alice: Operator, bob: Operator, slug: str
) -> None:
    todo = alice.todo(slug)
    unknown = str(uuid.uuid4())
    for action in ("", "/claim", "/complete", "/fail", "/release", "/cancel"):
        method = "GET" if not action else "POST"
        body = {"error": "x"} if action == "/fail" else None
        foreign = bob.call(method, f"/todos/{todo['id']}{action}", body)
        missing = bob.call(method, f"/todos/{unknown}{action}", body)
        assert foreign.status_code == missing.status_code == 404, action
        assert error(foreign) == {"code": "not_found", "message": f"todo {todo['id']} not found"}
        assert error(missing) == {"code": "not_found", "message": f"todo {unknown} not found"}
    assert alice.ok("GET", f"/todos/{todo['id']}")["state"] == "pending"  # untouched


def test_keyset_pages_cover_every_todo_once_newest_first(alice: Operator, slug: str) -> None:
    ids = [alice.todo(slug, queue="paged")["id"] for _ in range(7)]
    seen: list[str] = []
    pages = 0
    after = None
    while True:
        query = f"/todos?endpoint={slug}&queue=paged&limit=3" + (f"&after={after}" if after else "")
        page = alice.ok("GET", query)
        pages += 1
        seen += [todo["id"] for todo in page["items"]]
        after = page["next"]
        if after is None:
            break
    assert pages == 3
    assert seen == ids[::-1]


def test_list_filters_by_state_and_queue(alice: Operator, slug: str) -> None:
    kept = alice.todo(slug, queue="filters")
    gone = alice.todo(slug, queue="filters")
    alice.ok("POST", f"/todos/{gone['id']}/cancel")
    alice.todo(slug, queue="elsewhere")
    pending = alice.ok("GET", "/todos?queue=filters&state=pending")
    assert [t["id"] for t in pending["items"]] == [kept["id"]]
    cancelled = alice.ok("GET", f"/todos?endpoint={slug}&state=cancelled")
    assert [t["id"] for t in cancelled["items"]] == [gone["id"]]
    everything = alice.ok("GET", "/todos?limit=200")  # every endpoint alice manages
    assert {kept["id"], gone["id"]} <= {t["id"] for t in everything["items"]}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=many", "limit"),
        ("after=bm9wZQ", "after"),
        ("after=WyJ4IiwieSJd", "after"),  # ["x","y"]: the right shape, not a keyset
        ("state=lost", "state"),
        ("queue=bad%20queue", "queue"),
        ("surprise=1", "surprise"),
    ],
)
def test_bad_list_parameters_are_422(alice: Operator, query: str, field: str) -> None:
    response = alice.get(f"/todos?{query}")
    assert response.status_code == 422
    assert field in error(response)["details"]["fields"]


def test_claim_then_complete(alice: Operator, slug: str) -> None:
    todo = alice.todo(slug, queue="work")
    claimed = alice.ok("POST", f"/todos/{todo['id']}/claim", {"lease_seconds": 60})
    assert set(claimed) == {"todo"}  # no headroom: the queue has no policy
    assert claimed["todo"]["state"] == "claimed" and claimed["todo"]["attempt"] == 1
    done = alice.ok("POST", f"/todos/{todo['id']}/complete", {"attempt": 1, "result": {"ok": 1}})
    assert done["state"] == "done" and done["result"] == {"ok": 1}
    again = alice.post(f"/todos/{todo['id']}/complete", {"attempt": 1})
    assert again.status_code == 409
    assert error(again)["code"] == "conflict"


def test_fail_release_and_a_stale_attempt(alice: Operator, slug: str) -> None:
    todo = alice.todo(slug, queue="work", max_attempts=3)
    alice.ok("POST", f"/todos/{todo['id']}/claim")
    released = alice.ok("POST", f"/todos/{todo['id']}/release")  # the current attempt
    assert released["state"] == "pending"
    alice.ok("POST", f"/todos/{todo['id']}/claim")
    stale = alice.post(f"/todos/{todo['id']}/fail", {"attempt": 1, "error": "boom"})
    assert stale.status_code == 409
    assert error(stale)["details"] == {"state": "claimed", "attempt": 2}
    failed = alice.ok("POST", f"/todos/{todo['id']}/fail", {"attempt": 2, "error": "boom"})
    assert failed["state"] == "retry_wait" and failed["last_error"] == "boom"
    final = alice.todo(slug, queue="work", max_attempts=1)
    alice.ok("POST", f"/todos/{final['id']}/claim")
    dead = alice.ok("POST", f"/todos/{final['id']}/fail", {"error": "x", "retry": False})
    assert dead["state"] == "failed"


def test_finishing_an_unclaimed_todo_is_409(alice: Operator, slug: str) -> None:
    todo = alice.todo(slug)
    for action in ("complete", "release"):
        assert alice.post(f"/todos/{todo['id']}/{action}").status_code == 409
    response = alice.post(f"/todos/{todo['id']}/fail", {})
    assert response.status_code == 422
    assert "error" in error(response)["details"]["fields"]


def test_cancel_once(alice: Operator, slug: str) -> None:
    todo = alice.todo(slug)
    assert alice.ok("POST", f"/todos/{todo['id']}/cancel", {})["state"] == "cancelled"
    response = alice.post(f"/todos/{todo['id']}/cancel")
    assert response.status_code == 409
    assert error(response)["details"] == {"state": "cancelled"}
    assert alice.post(f"/todos/{todo['id']}/cancel", {"why": "x"}).status_code == 422


def test_a_claim_of_a_claimed_todo_is_409(alice: Operator, slug: str) -> None:
    todo = alice.todo(slug)
    alice.ok("POST", f"/todos/{todo['id']}/claim")
    response = alice.post(f"/todos/{todo['id']}/claim")
    assert response.status_code == 409


def test_queue_summaries(app: Flask, alice: Operator, bob: Operator) -> None:
    slug = alice.endpoint()["slug"]
    for _ in range(3):
        alice.todo(slug, queue="a")
    claimed = alice.todo(slug, queue="b")
    alice.ok("POST", f"/todos/{claimed['id']}/claim")
    sql(
        app,
        "UPDATE todos SET created_at = now() - interval '90 seconds' WHERE queue = 'a' AND "
        "endpoint_id = (SELECT id FROM endpoints WHERE slug = %(s)s)",
        {"s": slug},
    )
    queues = alice.ok("GET", f"/queues?endpoint={slug}")
    assert [(q["endpoint"], q["queue"]) for q in queues] == [(slug, "a"), (slug, "b")]
    a, b = queues
    assert a["counts"] == {
        "pending": 3,
        "claimed": 0,
        "retry_wait": 0,
        "done": 0,
        "failed": 0,
        "cancelled": 0,
    }
    assert 90 <= a["oldest_pending_age_s"] < 120
    assert b["counts"]["claimed"] == 1 and b["oldest_pending_age_s"] is None
    assert a["admission"] is None
    assert bob.ok("GET", "/queues") == []
    assert bob.get(f"/queues?endpoint={slug}").status_code == 404


def test_a_fresh_human_with_no_endpoints_lists_nothing(app: Flask) -> None:
    nobody = Operator(app.test_client(), new_token(app))
    assert nobody.ok("GET", "/todos") == {"items": [], "next": None}
    assert nobody.ok("GET", "/admission") == []
