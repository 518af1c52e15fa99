"""Operator API (R-API, R-POLICY, R-AUDIT, R-DEFER, R-DERIVED, R-HEADROOM): the design's
admission routes, and admission on the operator's claim (429 with Retry-After, 503)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from flask import Flask

from switchboard.errors import AdmissionUnavailable, Deferred
from switchboard.views.errors import retry_after
from tests.api_support import (
    Operator,
    error,
    new_token,
    sql,
)

WEEKLY = {
    "max_in_flight": None,
    "max_claims_per_window": 1,
    "window": {"period": "week", "tz": "America/New_York", "start": "09:30", "weekday": "Wed"},
}
STATUS_KEYS = {
    "endpoint",
    "queue",
    "policy",
    "status",
    "in_flight",
    "used",
    "remaining",
    "window_start",
    "window_resets_at",
    "next_eligible_at",
    "exact",
    "pending",
}


def audit_rows(app: Flask, slug: str) -> list[str]:
    rows = sql(
        app,
        "SELECT a.action FROM admission_policy_audit a JOIN endpoints e ON e.id = a.endpoint_id "
        "WHERE e.slug = %(slug)s ORDER BY a.id",
        {"slug": slug},
    )
    return [row[0] for row in rows]


def test_put_get_and_the_policy_detail(alice: Operator, slug: str) -> None:
    put = alice.ok("PUT", f"/admission/endpoint:{slug}/mail", WEEKLY)
    assert set(put) == STATUS_KEYS | {"id", "created_at", "updated_at", "windows", "audit"}
    assert put["policy"] == WEEKLY and put["status"] == "open"
    assert put["used"] == 0 and put["remaining"] == 1 and put["exact"] is False
    assert put["window_resets_at"] > put["window_start"]
    assert [entry["action"] for entry in put["audit"]] == ["create"]
    assert put["audit"][0]["after"] == WEEKLY and put["audit"][0]["before"] is None
    assert put["windows"] == []
    assert alice.ok("GET", f"/admission/endpoint:{slug}/mail") == put


def test_put_keeps_the_id_and_the_usage_on_a_limit_change(alice: Operator, slug: str) -> None:
    first = alice.ok("PUT", f"/admission/endpoint:{slug}/q", {**WEEKLY, "max_claims_per_window": 5})
    todo = alice.todo(slug)
    claimed = alice.ok("POST", f"/todos/{todo['id']}/claim")
    assert claimed["admission"]["used"] == 1 and claimed["admission"]["remaining"] == 4
    assert claimed["admission"]["max_claims_per_window"] == 5
    raised = alice.ok(
        "PUT", f"/admission/endpoint:{slug}/q", {**WEEKLY, "max_claims_per_window": 9}
    )
    assert raised["id"] == first["id"]
    assert raised["used"] == 1 and raised["remaining"] == 8
    assert [w["used"] for w in raised["windows"]] == [1]
    assert raised["windows"][0]["window_start"] == raised["window_start"]
    assert [entry["action"] for entry in raised["audit"]] == ["update", "create"]
    assert raised["audit"][0]["before"]["max_claims_per_window"] == 5


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({}, {"_schema"}),
        ({"max_in_flight": -1}, {"max_in_flight"}),
        ({"max_in_flight": "3"}, {"max_in_flight"}),
        ({"max_claims_per_window": 5}, {"window"}),
        ({**WEEKLY, "window": {**WEEKLY["window"], "tz": "Mars/Olympus"}}, {"window"}),
        ({**WEEKLY, "window": {**WEEKLY["window"], "start": "25:00"}}, {"window"}),
        ({**WEEKLY, "window": {"period": "day", "tz": "UTC", "weekday": "Mon"}}, {"window"}),
        ({**WEEKLY, "window": {"period": "week", "tz": "UTC"}}, {"window"}),
        ({"max_in_flight": 1, "colour": "red"}, {"colour"}),
        ([1], {"_schema"}),
    ],
)
def test_a_bad_policy_is_422_naming_the_field_and_nothing_is_written(
    app: Flask, alice: Operator, slug: str, body: object, fields: set[str]
) -> None:
    response = alice.put(f"/admission/endpoint:{slug}/bad", body)
    assert response.status_code == 422
    assert set(error(response)["details"]["fields"]) == fields
    assert error(response)["code"] == "invalid_params"
    assert alice.get(f"/admission/endpoint:{slug}/bad").status_code == 404
    assert audit_rows(app, slug) == []


def test_an_unknown_zone_names_the_nested_field(alice: Operator, slug: str) -> None:
    body = {**WEEKLY, "window": {**WEEKLY["window"], "tz": "Mars/Olympus"}}
    details = error(alice.put(f"/admission/endpoint:{slug}/bad", body))["details"]
    assert "tz" in details["fields"]["window"]


def test_a_bad_queue_name_is_422(alice: Operator, slug: str) -> None:
    response = alice.put(f"/admission/endpoint:{slug}/bad queue", WEEKLY)
    assert response.status_code == 422
    assert "queue" in error(response)["details"]["fields"]


def test_scopes_foreign_unknown_and_malformed_are_the_same_404(
    alice: Operator, bob: Operator, slug: str
) -> None:
    alice.ok("PUT", f"/admission/endpoint:{slug}/q", WEEKLY)
    endpoint_id = alice.ok("GET", f"/endpoints/{slug}")["id"]
    assert alice.ok("GET", f"/admission/endpoint:{endpoint_id}/q")["queue"] == "q"  # by id
    for method, body in (("GET", None), ("PUT", WEEKLY), ("DELETE", None)):
        foreign = bob.call(method, f"/admission/endpoint:{slug}/q", body)
        unknown = bob.call(method, f"/admission/endpoint:{slug}-x/q", body)
        assert foreign.status_code == unknown.status_code == 404
        assert error(foreign) == {"code": "not_found", "message": f"endpoint {slug!r} not found"}
        assert error(unknown)["message"] == f"endpoint {slug + '-x'!r} not found"
        for scope in ("team:abc", slug, "endpoint:", f"Endpoint:{slug}"):
            response = alice.call(method, f"/admission/{scope}/q", body)
            assert response.status_code == 404, (method, scope)
            assert error(response)["code"] == "not_found"
    assert alice.ok("GET", f"/admission/endpoint:{slug}/q")["policy"] == WEEKLY  # untouched


def test_list_shows_every_manageable_policy_and_only_those(
    app: Flask, alice: Operator, bob: Operator, slug: str
) -> None:
    other = alice.endpoint()["slug"]
    alice.ok("PUT", f"/admission/endpoint:{slug}/a", WEEKLY)
    alice.ok("PUT", f"/admission/endpoint:{other}/b", {"max_in_flight": 2})
    listed = alice.ok("GET", "/admission")
    assert sorted((s["endpoint"], s["queue"]) for s in listed) == sorted(
        [(slug, "a"), (other, "b")]
    )
    assert all(set(s) == STATUS_KEYS for s in listed)
    assert [s["queue"] for s in alice.ok("GET", f"/admission?endpoint={other}")] == ["b"]
    assert bob.ok("GET", "/admission") == []
    admin = Operator(app.test_client(), new_token(app, admin=True))
    assert {(slug, "a"), (other, "b")} <= {
        (s["endpoint"], s["queue"]) for s in admin.ok("GET", "/admission")
    }


def test_delete_removes_the_policy_and_keeps_the_audit(
    app: Flask, alice: Operator, slug: str
) -> None:
    alice.ok("PUT", f"/admission/endpoint:{slug}/q", WEEKLY)
    response = alice.delete(f"/admission/endpoint:{slug}/q")
    assert response.status_code == 204 and response.data == b""
    assert alice.get(f"/admission/endpoint:{slug}/q").status_code == 404
    again = alice.delete(f"/admission/endpoint:{slug}/q")
    assert again.status_code == 404
    assert audit_rows(app, slug) == ["create", "delete"]
    alice.ok("PUT", f"/admission/endpoint:{slug}/q", WEEKLY)  # the audit tail spans both lives
    detail = alice.ok("GET", f"/admission/endpoint:{slug}/q")
    assert [entry["action"] for entry in detail["audit"]] == ["create", "delete", "create"]


def test_a_deferred_operator_claim_is_429_with_retry_after(alice: Operator, slug: str) -> None:
    alice.ok("PUT", f"/admission/endpoint:{slug}/q", WEEKLY)
    first, second = alice.todo(slug), alice.todo(slug)
    alice.ok("POST", f"/todos/{first['id']}/claim")
    shown = alice.ok("GET", f"/todos/{second['id']}")  # R-DERIVED on every read
    assert shown["admission"]["deferred"] is True
    assert shown["admission"]["reason"] == "window_exhausted"
    response = alice.post(f"/todos/{second['id']}/claim")
    assert response.status_code == 429
    body = error(response)
    assert body["code"] == "deferred"
    details = body["details"]
    assert set(details) == {"queue", "reason", "pending", "next_eligible_at", "exact"}
    assert details["reason"] == "window_exhausted" and details["exact"] is True
    assert details["next_eligible_at"] == shown["admission"]["next_eligible_at"]
    eligible = datetime.fromisoformat(details["next_eligible_at"])
    seconds = int(response.headers["Retry-After"])
    expected = math.ceil((eligible - datetime.now(UTC)).total_seconds())
    assert 0 < seconds and abs(seconds - expected) <= 2
    assert alice.ok("GET", f"/todos/{second['id']}")["state"] == "pending"  # nothing claimed
    status = alice.ok("GET", f"/admission/endpoint:{slug}/q")
    assert status["used"] == 1 and status["status"] == "deferred"  # nothing charged
    assert status["reason"] == "window_exhausted" and status["pending"] == 1


def test_in_flight_full_and_paused_are_429_without_retry_after(alice: Operator, slug: str) -> None:
    alice.ok("PUT", f"/admission/endpoint:{slug}/cap", {"max_in_flight": 1})
    first, second = alice.todo(slug, queue="cap"), alice.todo(slug, queue="cap")
    claimed = alice.ok("POST", f"/todos/{first['id']}/claim")
    assert claimed["admission"]["in_flight"] == 1 and claimed["admission"]["max_in_flight"] == 1
    full = alice.post(f"/todos/{second['id']}/claim")
    assert full.status_code == 429 and "Retry-After" not in full.headers
    assert error(full)["details"]["reason"] == "in_flight_full"
    assert error(full)["details"]["exact"] is False
    alice.ok("PUT", f"/admission/endpoint:{slug}/cap", {"max_in_flight": 0})
    paused = alice.post(f"/todos/{second['id']}/claim")
    assert paused.status_code == 429 and "Retry-After" not in paused.headers
    assert error(paused)["details"]["reason"] == "paused"
    assert error(paused)["details"]["next_eligible_at"] is None


def test_a_zone_the_tzdata_lacks_fails_closed_with_503(
    app: Flask, alice: Operator, slug: str
) -> None:
    alice.ok("PUT", f"/admission/endpoint:{slug}/lost", WEEKLY)
    sql(app, "UPDATE admission_policies SET window_tz = 'Mars/Olympus' WHERE queue = 'lost'")
    todo = alice.todo(slug, queue="lost")
    response = alice.post(f"/todos/{todo['id']}/claim")
    assert response.status_code == 503
    assert error(response)["code"] == "admission_unavailable"
    assert "Retry-After" not in response.headers
    status = alice.ok("GET", f"/admission/endpoint:{slug}/lost")
    assert status["status"] == "deferred" and status["reason"] == "admission_unavailable"


def test_queues_carry_the_admission_status(alice: Operator, slug: str) -> None:
    alice.todo(slug, queue="plain")
    alice.todo(slug, queue="budgeted")
    alice.ok("PUT", f"/admission/endpoint:{slug}/budgeted", WEEKLY)
    by_queue = {q["queue"]: q for q in alice.ok("GET", f"/queues?endpoint={slug}")}
    assert by_queue["plain"]["admission"] is None
    admission = by_queue["budgeted"]["admission"]
    assert set(admission) == STATUS_KEYS
    assert admission["status"] == "open" and admission["pending"] == 1


def test_retry_after_rounds_up_and_only_for_exact_deferrals() -> None:
    now = datetime(2026, 3, 8, 6, 59, 49, 800000, tzinfo=UTC)
    at = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    exact = {"queue": "q", "reason": "window_exhausted", "next_eligible_at": at, "exact": True}
    assert retry_after(Deferred("x", details=exact), now=now) == 11  # 10.2 s → 11
    assert retry_after(Deferred("x", details=exact), now=at + timedelta(seconds=5)) == 0
    assert retry_after(Deferred("x", details={**exact, "exact": False}), now=now) is None
    assert retry_after(Deferred("x", details={**exact, "next_eligible_at": None}), now=now) is None
    assert retry_after(AdmissionUnavailable("x", details=exact), now=now) is None
