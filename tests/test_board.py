"""The board through Flask's test client on a real database (SPEC §8): sign-in, CSRF, every
page and form, field errors with the input kept, foreign endpoints as 404, operator actions and
their explained refusals, the live stream, and friendly error pages."""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from werkzeug.test import TestResponse

from switchboard import extensions
from switchboard.admission.service import Policy
from switchboard.admission.windows import Window
from switchboard.services import accounts, board
from tests.api_support import sql

PASSWORD = "correct horse battery"


@dataclass
class Person:
    """A signed-in browser session of one human."""

    client: FlaskClient
    email: str
    slug: str

    def csrf(self) -> str:
        with self.client.session_transaction() as session:
            token: str = session["csrf"]
        return token

    def get(self, path: str, **kwargs: Any) -> TestResponse:
        return self.client.get(path, **kwargs)

    def post(self, path: str, data: dict[str, Any] | None = None, **kwargs: Any) -> TestResponse:
        body = {"csrf": self.csrf(), **(data or {})}
        return self.client.post(path, data=body, **kwargs)

    def text(self, path: str, status: int = 200) -> str:
        response = self.get(path)
        assert response.status_code == status, response.get_data(as_text=True)[:2000]
        return response.get_data(as_text=True)

    def todo(self, queue: str = "q", title: str = "a todo") -> str:
        response = self.post(f"/board/e/{self.slug}/q/{queue}/todos", {"title": title})
        assert response.status_code == 302
        rows = sql(
            _app,
            "SELECT t.id FROM todos t JOIN endpoints e ON e.id = t.endpoint_id "
            "WHERE e.slug = %(slug)s AND t.title = %(title)s ORDER BY t.created_at DESC",
            {"slug": self.slug, "title": title},
        )
        return str(rows[0][0])


_app: Flask


@pytest.fixture(autouse=True)
def _remember(app: Flask) -> None:
    global _app
    _app = app


def make_person(app: Flask, *, admin: bool = False) -> tuple[str, str]:
    """A human with a password and one endpoint; returns (email, slug)."""
    email = f"p-{uuid.uuid4().hex[:8]}@example.com"
    slug = f"ep-{uuid.uuid4().hex[:8]}"
    with extensions.database(app).transaction() as conn:
        human = accounts.create_human(
            conn, data={"email": email, "password": PASSWORD, "is_admin": admin}
        ).human
        accounts.create_endpoint(conn, owner=human, data={"slug": slug})
    return email, slug


def sign_in(app: Flask, email: str, slug: str) -> Person:
    client = app.test_client()
    client.get("/board/login")
    person = Person(client, email, slug)
    response = person.post("/board/login", {"email": email, "password": PASSWORD})
    assert response.status_code == 302, response.get_data(as_text=True)
    return person


@pytest.fixture
def ann(app: Flask) -> Person:
    return sign_in(app, *make_person(app))


@pytest.fixture
def ben(app: Flask) -> Person:
    return sign_in(app, *make_person(app))


def flashes(person: Person) -> list[str]:
    with person.client.session_transaction() as session:
        return [message for _, message in session.get("_flashes", [])]


# --- sign-in, session, CSRF -------------------------------------------------------------------


def test_pages_need_a_session_and_send_to_the_login(app: Flask) -> None:
    response = app.test_client().get("/board/")
    assert response.status_code == 302
    assert response.headers["Location"].startswith("/board/login?next=/board/")


def test_login_sets_a_safe_session_cookie_and_logout_ends_it(app: Flask) -> None:
    email, slug = make_person(app)
    client = app.test_client()
    client.get("/board/login")
    with client.session_transaction() as session:
        csrf = session["csrf"]
    response = client.post(
        "/board/login",
        data={"csrf": csrf, "email": email, "password": PASSWORD, "next": "/board/e/" + slug},
    )
    assert response.status_code == 302 and response.headers["Location"] == "/board/e/" + slug
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Secure" not in cookie
    person = Person(client, email, slug)
    assert slug in person.text("/board/")
    assert person.post("/board/logout").status_code == 302
    assert client.get("/board/").status_code == 302


def test_the_cookie_is_secure_over_https(app: Flask) -> None:
    email, _ = make_person(app)
    client = app.test_client()
    client.get("/board/login", base_url="https://board.example.com")
    with client.session_transaction(base_url="https://board.example.com") as session:
        csrf = session["csrf"]
    response = client.post(
        "/board/login",
        data={"csrf": csrf, "email": email, "password": PASSWORD},
        base_url="https://board.example.com",
    )
    assert response.status_code == 302
    assert "Secure" in response.headers["Set-Cookie"]


def test_a_wrong_password_is_refused_keeping_the_email(app: Flask) -> None:
    email, _ = make_person(app)
    client = app.test_client()
    client.get("/board/login")
    with client.session_transaction() as session:
        csrf = session["csrf"]
    response = client.post("/board/login", data={"csrf": csrf, "email": email, "password": "no"})
    assert response.status_code == 401
    page = response.get_data(as_text=True)
    assert "do not match" in page and f'value="{email}"' in page


def test_a_post_without_the_csrf_token_is_refused_and_changes_nothing(ann: Person) -> None:
    response = ann.client.post(f"/board/e/{ann.slug}/q/q/todos", data={"title": "sneaky"})
    assert response.status_code == 400
    assert "expired" in response.get_data(as_text=True)
    forged = ann.client.post(
        f"/board/e/{ann.slug}/q/q/todos", data={"title": "sneaky", "csrf": "forged"}
    )
    assert forged.status_code == 400
    accented = ann.client.post(
        f"/board/e/{ann.slug}/q/q/todos", data={"title": "sneaky", "csrf": "jeton-é"}
    )
    assert accented.status_code == 400
    assert sql(_app, "SELECT count(*) FROM todos WHERE title = 'sneaky'") == [(0,)]


def test_login_itself_needs_the_csrf_token(app: Flask) -> None:
    email, _ = make_person(app)
    response = app.test_client().post("/board/login", data={"email": email, "password": PASSWORD})
    assert response.status_code == 400


# --- pages ------------------------------------------------------------------------------------


def test_overview_lists_my_endpoints_queues_and_presence(ann: Person, ben: Person) -> None:
    ann.todo("inbox", "first")
    page = ann.text("/board/")
    assert ann.slug in page and "inbox" in page and ben.slug not in page
    assert "no agent attached" in page
    endpoint_id = sql(_app, "SELECT id FROM endpoints WHERE slug = %s", (ann.slug,))[0][0]  # type: ignore[arg-type]
    grant = _grant(ann)
    sql(
        _app,
        "INSERT INTO mcp_streams (endpoint_id, grant_id, era, client_name) "
        "VALUES (%(e)s, %(g)s, 'legacy', 'claude-code')",
        {"e": endpoint_id, "g": grant},
    )
    assert "1 attached: claude-code" in ann.text("/board/")
    sql(
        _app,
        "UPDATE mcp_streams SET seen_at = now() - interval '1 hour' WHERE grant_id = %(g)s",
        {"g": grant},
    )
    assert "no agent attached" in ann.text("/board/")


def _grant(person: Person, verbs: tuple[str, ...] = ("whoami",)) -> Any:
    with extensions.database(_app).transaction() as conn:
        from switchboard.store import accounts as store

        endpoint = store.get_endpoint(conn, key=person.slug)
        human = store.get_human(conn, id=endpoint.owner_human_id)
        return accounts.create_grant(
            conn, endpoint=endpoint, granted_by=human, verbs=verbs
        ).grant.id


def test_endpoint_card_shows_queues_grants_and_links(ann: Person) -> None:
    ann.todo("mail")
    grant = _grant(ann)
    page = ann.text(f"/board/e/{ann.slug}")
    assert f"/board/e/{ann.slug}/q/mail/budget" in page
    assert f"/board/e/{ann.slug}/q/mail/audit" in page
    assert f"/grants/{grant}/revoke" in page
    response = ann.post(f"/board/e/{ann.slug}/grants/{grant}/revoke")
    assert response.status_code == 302
    assert sql(
        _app, "SELECT revoked_at IS NOT NULL FROM grants WHERE id = %(g)s", {"g": grant}
    ) == [(True,)]
    assert "revoked" in ann.text(f"/board/e/{ann.slug}")


def test_a_foreign_endpoint_is_404_on_every_page_and_form(ann: Person, ben: Person) -> None:
    todo = ben.todo("q", "bens")
    for path in (
        f"/board/e/{ben.slug}",
        f"/board/e/{ben.slug}/q/q",
        f"/board/e/{ben.slug}/q/q/budget",
        f"/board/e/{ben.slug}/q/q/audit",
        f"/board/e/{ben.slug}/q/q/live",
        "/board/e/no-such-endpoint",
    ):
        response = ann.get(path)
        assert response.status_code == 404, path
        assert "Not found" in response.get_data(as_text=True)
        assert "Traceback" not in response.get_data(as_text=True)
    for path, data in (
        (f"/board/e/{ben.slug}/q/q/todos", {"title": "x"}),
        (f"/board/e/{ben.slug}/q/q/budget", {"max_in_flight": "1"}),
        (f"/board/e/{ben.slug}/q/q/budget/clear", {}),
        (f"/board/todos/{todo}/cancel", {"back": f"/board/e/{ann.slug}"}),
        (f"/board/todos/{todo}/claim", {}),
    ):
        assert ann.post(path, data).status_code == 404, path
    assert sql(_app, "SELECT state FROM todos WHERE id = %(t)s", {"t": todo}) == [("pending",)]
    grant = _grant(ben)
    assert ann.post(f"/board/e/{ann.slug}/grants/{grant}/revoke").status_code == 404
    assert ann.post(f"/board/e/{ben.slug}/grants/{grant}/revoke").status_code == 404
    assert sql(_app, "SELECT revoked_at FROM grants WHERE id = %(g)s", {"g": grant}) == [(None,)]


def test_error_pages_are_friendly_html(ann: Person) -> None:
    response = ann.get("/board/nowhere")
    assert response.status_code == 404 and response.mimetype == "text/html"
    assert "Back to the overview" in response.get_data(as_text=True)
    bad_queue = ann.get(f"/board/e/{ann.slug}/q/bad queue!")
    assert bad_queue.status_code == 404
    assert ann.get("/board/e/x%00y").status_code == 400
    nul = ann.post(f"/board/e/{ann.slug}/q/q/todos", {"title": "a\x00b"})
    assert nul.status_code == 400 and "NUL" in nul.get_data(as_text=True)


# --- the queue page and operator actions --------------------------------------------------------


def test_queue_page_cards_and_actions(ann: Person) -> None:
    todo = ann.todo("work", "write the report")
    page = ann.text(f"/board/e/{ann.slug}/q/work")
    assert "write the report" in page and "No budget" in page and "0/5" in page
    back = f"/board/e/{ann.slug}/q/work"
    assert ann.post(f"/board/todos/{todo}/claim", {"back": back}).headers["Location"] == back
    page = ann.text(back)
    assert "1/5" in page and "Lease until" in page and "Claimant" in page
    assert ann.post(f"/board/todos/{todo}/release", {"back": back}).status_code == 302
    ann.post(f"/board/todos/{todo}/claim", {"back": back})
    ann.post(f"/board/todos/{todo}/complete", {"back": back})
    assert sql(_app, "SELECT state FROM todos WHERE id = %(t)s", {"t": todo}) == [("done",)]
    refused = ann.post(f"/board/todos/{todo}/cancel", {"back": back})
    assert refused.status_code == 302
    assert any("Not possible right now" in m for m in flashes(ann))


def test_adding_a_todo_without_a_title_explains_and_writes_nothing(ann: Person) -> None:
    response = ann.post(f"/board/e/{ann.slug}/q/empty/todos", {"title": ""})
    assert response.status_code == 302
    assert any("title" in m for m in flashes(ann))
    assert sql(
        _app,
        "SELECT count(*) FROM todos t JOIN endpoints e ON e.id = t.endpoint_id "
        "WHERE e.slug = %(s)s",
        {"s": ann.slug},
    ) == [(0,)]


def test_a_deferred_claim_is_refused_with_why_and_until_when(ann: Person) -> None:
    first = ann.todo("paced", "one")
    second = ann.todo("paced", "two")
    saved = ann.post(
        f"/board/e/{ann.slug}/q/paced/budget",
        {
            "max_claims_per_window": "1",
            "period": "day",
            "tz": "America/Los_Angeles",
            "start": "00:00",
        },
    )
    assert saved.status_code == 302
    back = f"/board/e/{ann.slug}/q/paced"
    ann.post(f"/board/todos/{first}/claim", {"back": back})
    ann.post(f"/board/todos/{second}/claim", {"back": back})
    message = flashes(ann)[-1]
    assert "Held back by the queue's budget" in message and "Eligible again" in message
    assert sql(_app, "SELECT state FROM todos WHERE id = %(t)s", {"t": second}) == [("pending",)]
    page = ann.text(back)
    assert 'data-reason="window_exhausted"' in page and "eligible" in page
    assert '1 <span class="muted">of</span> 1' in page
    assert "PST" in page or "PDT" in page


def test_an_unknown_zone_is_flagged_loudly(ann: Person) -> None:
    ann.todo("stale", "x")
    ann.post(
        f"/board/e/{ann.slug}/q/stale/budget",
        {"max_claims_per_window": "5", "period": "day", "tz": "UTC", "start": "00:00"},
    )
    sql(_app, "UPDATE admission_policies SET window_tz = 'Mars/Olympus_Mons' WHERE queue = 'stale'")
    page = ann.text(f"/board/e/{ann.slug}/q/stale")
    assert 'class="alarm"' in page and "Mars/Olympus_Mons" in page
    assert "nothing in this queue is admitted" in page


def test_the_viewer_zone_comes_from_the_tz_cookie(ann: Person) -> None:
    ann.todo("zoned", "x")
    ann.post(
        f"/board/e/{ann.slug}/q/zoned/budget",
        {
            "max_claims_per_window": "5",
            "period": "day",
            "tz": "America/Los_Angeles",
            "start": "00:00",
        },
    )
    utc = ann.text(f"/board/e/{ann.slug}/q/zoned")
    assert re.search(r"\d\d:\d\d UTC", utc)
    ann.client.set_cookie("tz", "Asia/Kathmandu")
    assert "+0545" in ann.text(f"/board/e/{ann.slug}/q/zoned")
    ann.client.set_cookie("tz", "Not/AZone")
    assert "times in UTC" in ann.text(f"/board/e/{ann.slug}/q/zoned")


# --- the Budget editor and the audit ----------------------------------------------------------


def test_budget_field_errors_keep_the_input_and_write_nothing(ann: Person) -> None:
    path = f"/board/e/{ann.slug}/q/b/budget"
    response = ann.post(
        path,
        {
            "max_claims_per_window": "-5",
            "max_in_flight": "many",
            "period": "day",
            "tz": "Europe/Paris",
            "start": "25:00",
        },
    )
    assert response.status_code == 422
    page = response.get_data(as_text=True)
    assert "Nothing was saved" in page
    assert 'value="-5"' in page and 'value="many"' in page and 'value="25:00"' in page
    assert "<option selected>Europe/Paris</option>" in page
    assert page.count('class="field-error"') >= 2
    assert sql(_app, "SELECT count(*) FROM admission_policies WHERE queue = 'b'") == [(0,)]
    bad_zone = ann.post(
        path, {"max_claims_per_window": "5", "period": "day", "tz": "Nope/Nope", "start": "00:00"}
    )
    assert bad_zone.status_code == 422 and "unknown IANA zone" in bad_zone.get_data(as_text=True)
    no_window = ann.post(path, {"max_claims_per_window": "5", "period": ""})
    assert no_window.status_code == 422 and "needs a window" in no_window.get_data(as_text=True)
    nothing = ann.post(path, {})
    assert nothing.status_code == 422 and "set max_in_flight" in nothing.get_data(as_text=True)


def test_budget_save_summary_drain_estimate_clear_and_audit(ann: Person) -> None:
    for n in range(3):
        ann.todo("d", f"t{n}")
    path = f"/board/e/{ann.slug}/q/d/budget"
    assert "No budget" in ann.text(path)
    saved = ann.post(
        path,
        {
            "max_claims_per_window": "1",
            "max_in_flight": "2",
            "period": "week",
            "tz": "Europe/Berlin",
            "start": "09:30",
            "weekday": "Mon",
        },
    )
    assert saved.status_code == 302 and saved.headers["Location"] == path
    page = ann.text(path)
    assert (
        "1 claims per week from Mon 09:30 Europe/Berlin · at most 2 in flight · resets Mon" in page
    )
    assert "The last of the 3 waiting can be admitted in the window from" in page
    assert "2 window resets away" in page
    ann.post(
        path,
        {
            "max_claims_per_window": "200",
            "max_in_flight": "2",
            "period": "week",
            "tz": "Europe/Berlin",
            "start": "09:30",
            "weekday": "Mon",
        },
    )
    assert "All 3 waiting fit in this window" in ann.text(path)
    cleared = ann.post(path + "/clear")
    assert cleared.status_code == 302
    assert "No budget" in ann.text(path)
    audit = ann.text(f"/board/e/{ann.slug}/q/d/audit")
    assert audit.count('class="chip chip-') == 3
    assert "create" in audit and "update" in audit and "delete" in audit
    assert "<del>1</del> → <ins>200</ins>" in audit
    assert ann.email in audit


def test_clearing_a_queue_without_a_budget_says_so(ann: Person) -> None:
    response = ann.post(f"/board/e/{ann.slug}/q/none/budget/clear")
    assert response.status_code == 302
    assert any("no budget to clear" in m for m in flashes(ann))


def test_the_audit_names_an_agent_on_behalf_of_its_human(ann: Person) -> None:
    with extensions.database(_app).transaction() as conn:
        from switchboard.admission import service as admission
        from switchboard.store import accounts as store

        endpoint = store.get_endpoint(conn, key=ann.slug)
        admission.put_policy(
            conn,
            endpoint=endpoint,
            queue="a",
            data={"max_in_flight": 4},
            actor_human_id=endpoint.owner_human_id,
            actor_endpoint_id=endpoint.id,
        )
    audit = ann.text(f"/board/e/{ann.slug}/q/a/audit")
    assert f"agent {ann.slug} on behalf of" in audit and ann.email in audit


# --- the wizard -------------------------------------------------------------------------------


def test_wizard_consent_and_a_token_shown_once(ann: Person) -> None:
    form = ann.text("/board/agents/new")
    assert "lets the agent change its own budget" in form
    assert 'value="set_admission_policy" >' in form or 'value="set_admission_policy">' in form
    assert 'value="claim_next" checked' in form
    slug = f"bot-{uuid.uuid4().hex[:6]}"
    data = {
        "endpoint": slug,
        "queues": "inbox, outbox",
        "verbs": ["whoami", "claim_next"],
        "step": "review",
    }
    consent = ann.post("/board/agents/new", data)
    assert consent.status_code == 200
    text = consent.get_data(as_text=True)
    assert "Grant access?" in text and "A new endpoint" in text and "<code>outbox</code>" in text
    assert sql(_app, "SELECT count(*) FROM endpoints WHERE slug = %(s)s", {"s": slug}) == [(0,)]
    granted = ann.post("/board/agents/new", {**data, "step": "grant"})
    assert granted.status_code == 302 and granted.headers["Location"] == "/board/agents/token"
    shown = html.unescape(ann.text("/board/agents/token"))
    token = re.search(r"sba_[A-Za-z0-9_-]+", shown)
    assert token is not None
    assert '"url": "http' in shown and "/mcp" in shown and f"Bearer {token.group(0)}" in shown
    again = ann.text("/board/agents/token")
    assert "sba_" not in again and "shown only once" in again
    rows = sql(
        _app,
        "SELECT g.verbs, g.queues FROM grants g JOIN endpoints e ON e.id = g.endpoint_id "
        "WHERE e.slug = %(s)s",
        {"s": slug},
    )
    assert rows == [(["whoami", "claim_next"], ["inbox", "outbox"])]


def test_wizard_field_errors(ann: Person, ben: Person) -> None:
    bad = ann.post(
        "/board/agents/new", {"endpoint": "Bad Name", "verbs": ["whoami"], "step": "review"}
    )
    assert bad.status_code == 422 and "must match" in bad.get_data(as_text=True)
    assert 'value="Bad Name"' in bad.get_data(as_text=True)
    taken = ann.post(
        "/board/agents/new", {"endpoint": ben.slug, "verbs": ["whoami"], "step": "grant"}
    )
    assert taken.status_code == 422 and "taken" in taken.get_data(as_text=True)
    none = ann.post("/board/agents/new", {"endpoint": ann.slug, "step": "review"})
    assert none.status_code == 422 and "at least one verb" in none.get_data(as_text=True)
    queues = ann.post(
        "/board/agents/new",
        {"endpoint": ann.slug, "queues": "ok, bad/name", "verbs": ["whoami"], "step": "grant"},
    )
    assert queues.status_code == 422 and "invalid queue names" in queues.get_data(as_text=True)
    unknown = ann.post(
        "/board/agents/new", {"endpoint": ann.slug, "verbs": ["rm_rf"], "step": "grant"}
    )
    assert unknown.status_code == 422
    assert sql(
        _app,
        "SELECT count(*) FROM grants g JOIN endpoints e ON e.id = g.endpoint_id "
        "WHERE e.slug = %(s)s",
        {"s": ann.slug},
    ) == [(0,)]


# --- live updates -----------------------------------------------------------------------------


def test_the_live_stream_pushes_the_header_when_the_queue_changes(ann: Person) -> None:
    todo = ann.todo("live", "watch me")
    ann.post(
        f"/board/e/{ann.slug}/q/live/budget",
        {"max_claims_per_window": "10", "period": "hour", "tz": "UTC", "start": "00:00"},
    )
    response = ann.client.get(f"/board/e/{ann.slug}/q/live", buffered=False)
    response.close()
    stream = ann.client.get(f"/board/e/{ann.slug}/q/live/live", buffered=False)
    try:
        assert stream.mimetype == "text/event-stream"
        chunks = iter(stream.response)
        first = next(chunks).decode()
        assert first.startswith("event: header\n") and "event: cards\n" in first
        assert '0 <span class="muted">of</span> 10' in first
        ann.post(f"/board/todos/{todo}/claim", {"back": "/board/"})
        pushed = ""
        for _ in range(10):  # the poller's first sighting may re-send the old header first
            pushed = next(chunks).decode()
            if '1 <span class="muted">of</span> 10' in pushed:
                break
        assert '1 <span class="muted">of</span> 10' in pushed
        assert "watch me" in pushed and "Lease until" in pushed
    finally:
        stream.close()


def test_poll_once_reads_every_watched_queue_in_one_statement(app: Flask, ann: Person) -> None:
    from switchboard.views.board_live import BoardLive

    ann.todo("p1")
    ann.todo("p2")
    endpoint_id = sql(app, "SELECT id FROM endpoints WHERE slug = %(s)s", {"s": ann.slug})[0][0]
    hub = BoardLive(extensions.database(app), limit=4, poll_seconds=3600)
    one, two = hub.watch((endpoint_id, "p1")), hub.watch((endpoint_id, "p2"))
    try:
        assert hub.poll_once() == 2 and one.changed.is_set() and two.changed.is_set()
        one.changed.clear()
        two.changed.clear()
        assert hub.poll_once() == 0
        ann.todo("p2", "another")
        assert hub.poll_once() == 1 and two.changed.is_set() and not one.changed.is_set()
    finally:
        hub.unwatch(one)
        hub.unwatch(two)
        hub.close()


# --- pure helpers -----------------------------------------------------------------------------


def test_summary_matches_the_issue_example() -> None:
    policy = Policy(None, 200, Window("day", "America/Los_Angeles", "00:00"))
    now = datetime(2026, 11, 30, 20, 0, tzinfo=UTC)
    assert board.policy_summary(policy, now=now) == (
        "200 claims per day from 00:00 America/Los_Angeles · resets Tue 1 Dec 00:00 PST (08:00 UTC)"
    )


def test_drain_estimate_walks_windows_across_dst() -> None:
    policy = Policy(None, 10, Window("day", "America/New_York", "02:30"))
    now = datetime(2026, 3, 6, 12, 0, tzinfo=UTC)
    estimate = board.drain_estimate(policy, backlog=25, used=5, now=now)
    # 5 left today, then 10 on Mar 7, the last 10 in the window that starts on the DST day at
    # the end of the gap (02:30 never happens: 07:00Z).
    assert estimate.kind == "window" and estimate.windows == 2
    assert estimate.start == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)
    assert estimate.end == datetime(2026, 3, 9, 6, 30, tzinfo=UTC)
    assert board.drain_estimate(policy, backlog=5, used=5, now=now).kind == "now"
    assert board.drain_estimate(policy, backlog=0, used=0, now=now).kind == "empty"
    far = board.drain_estimate(Policy(None, 1, policy.window), backlog=10**6, used=0, now=now)
    assert far.kind == "far" and far.start is not None and far.start > now + timedelta(days=999)
    assert board.drain_estimate(Policy(0, None, None), backlog=3, used=0, now=now).kind == "paused"
    assert (
        board.drain_estimate(Policy(3, None, None), backlog=3, used=0, now=now).kind == "unbounded"
    )
    gone = Policy(None, 3, Window("day", "Mars/Base", "00:00"))
    assert board.drain_estimate(gone, backlog=3, used=0, now=now).kind == "unavailable"


@pytest.fixture(scope="module", autouse=True)
def _no_leftover_streams() -> Iterator[None]:
    yield


def test_an_unexpected_error_is_a_friendly_500_without_a_trace(
    ann: Person, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internals")

    monkeypatch.setattr(board, "overview", broken)
    response = ann.get("/board/")
    page = response.get_data(as_text=True)
    assert response.status_code == 500 and response.mimetype == "text/html"
    assert "Something went wrong" in page and "secret internals" not in page
    assert "Traceback" not in page


def test_live_pages_over_the_process_bound_get_503(app: Flask, ann: Person) -> None:
    from switchboard.views.board import _LIVE_KEY

    hub = app.extensions[_LIVE_KEY]
    held = [hub.watch((uuid.uuid4(), f"q{n}")) for n in range(hub.limit)]
    try:
        response = ann.get(f"/board/e/{ann.slug}/q/q/live")
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
    finally:
        for watcher in held:
            hub.unwatch(watcher)


def test_the_live_version_read_is_index_probes(clone_db: str) -> None:
    """The poller's one statement never scans a queue: one backward probe of the events
    index, the in-flight count from the claimed index, one probe each for policy and window."""
    import psycopg

    from switchboard.store.board import _Q
    from tests.conftest import make_endpoint, make_human

    with psycopg.connect(clone_db) as conn:
        endpoint = make_endpoint(conn, make_human(conn))
        conn.execute(
            "INSERT INTO todos (endpoint_id, queue, title) SELECT %s, 'q', 't'"
            " FROM generate_series(1, 20000)",
            (endpoint.id,),
        )
        conn.execute(
            "UPDATE todos SET state = 'claimed', attempt = 1, claimed_at = now(),"
            " lease_expires_at = now() + interval '1 hour'"
            " WHERE id IN (SELECT id FROM todos LIMIT 500)"
        )
        conn.execute(
            "INSERT INTO events (at, endpoint_id, queue, kind, actor, data)"
            " SELECT now(), %s, 'q', 'created', 'human:x', '{}' FROM generate_series(1, 2000)",
            (endpoint.id,),
        )
        # Newer events of 19 other queues: walking the primary key backwards would read them all.
        conn.execute(
            "INSERT INTO events (at, endpoint_id, queue, kind, actor, data)"
            " SELECT now(), %s, 'other' || (i %% 19), 'created', 'human:x', '{}'"
            " FROM generate_series(1, 40000) i",
            (endpoint.id,),
        )
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
        row = conn.execute(
            "EXPLAIN (FORMAT JSON) " + _Q["queue_versions"],
            {"endpoint_ids": [endpoint.id], "queues": ["q"]},
        ).fetchone()
    assert row is not None
    scans = {
        node.get("Relation Name"): node.get("Index Name")
        for node in _nodes(row[0][0]["Plan"])
        if node.get("Relation Name") in ("events", "todos")
    }
    assert scans == {"events": "idx_events_scope", "todos": "idx_todos_claimed_endpoint_queue"}
    for node in _nodes(row[0][0]["Plan"]):  # (the empty policy tables may sort their 0 rows)
        if node["Node Type"] == "Sort":
            assert not {n.get("Relation Name") for n in _nodes(node)} & {"events", "todos"}


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_a_live_page_re_renders_by_itself_when_its_status_is_due_to_change(app: Flask) -> None:
    """The reopen: a window reset changes the header with no write to notice, so the stream
    renders again at the moment ``render`` named, without being woken."""
    import time

    from switchboard.views.board_live import BoardLive, stream

    hub = BoardLive(extensions.database(app), limit=1, poll_seconds=3600)
    watcher = hub.watch((uuid.uuid4(), "q"))
    frames = iter([(b"first", time.time() + 0.2), (b"after the reset", None)])
    body = stream(hub, watcher, render=lambda: next(frames), gone=lambda: False, keepalive=30)
    try:
        assert next(body) == b"first"
        started = time.monotonic()
        assert next(body) == b"after the reset"
        assert time.monotonic() - started < 5 and not watcher.changed.is_set()
    finally:
        body.close()
    again = hub.watch((uuid.uuid4(), "q"))  # closing the body gave the one slot back
    hub.unwatch(again)
    hub.close()


def test_a_live_page_ends_when_its_queue_can_no_longer_be_rendered(app: Flask) -> None:
    from switchboard.views.board_live import BoardLive, stream

    hub = BoardLive(extensions.database(app), limit=1, poll_seconds=3600)
    watcher = hub.watch((uuid.uuid4(), "q"))
    assert list(stream(hub, watcher, render=lambda: None, gone=lambda: False, keepalive=1)) == []
    again = hub.watch((uuid.uuid4(), "q"))  # the one slot is free again
    hub.unwatch(again)
    hub.close()


def test_an_admin_sees_every_endpoint(app: Flask, ann: Person) -> None:
    admin = sign_in(app, *make_person(app, admin=True))
    assert ann.slug in admin.text("/board/")
    assert admin.get(f"/board/e/{ann.slug}").status_code == 200


def test_the_queue_page_pages_older_todos(ann: Person) -> None:
    sql(
        _app,
        "INSERT INTO queues (endpoint_id, name) SELECT id, 'long' FROM endpoints"
        " WHERE slug = %(s)s ON CONFLICT DO NOTHING",
        {"s": ann.slug},
    )
    sql(
        _app,
        "INSERT INTO todos (endpoint_id, queue, title, created_at)"
        " SELECT e.id, 'long', 'todo #' || i, now() - make_interval(secs => 100 - i)"
        " FROM endpoints e, generate_series(1, 55) i WHERE e.slug = %(s)s",
        {"s": ann.slug},
    )
    first = ann.text(f"/board/e/{ann.slug}/q/long")
    assert "todo #55" in first and "todo #5<" not in first
    older = re.search(r'href="([^"]+after=[^"]+)"', first)
    assert older is not None
    second = ann.text(html.unescape(older.group(1)))
    assert "todo #5<" in second and "todo #1<" in second and "todo #55" not in second
    assert ann.get(f"/board/e/{ann.slug}/q/long?after=garbage").status_code == 422
