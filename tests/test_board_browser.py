"""The board end to end in real headless Chromium (Debian's /usr/bin/chromium driven by
Playwright), against ``switchboard serve`` (gunicorn) on a real database, with an agent
claiming over MCP (plain JSON-RPC over HTTP): sign in, create an agent in the wizard, set a
budget with a bad then a good value, watch the budget strip change live as the agent claims,
see a deferred chip with its time. Then the same journey with JavaScript disabled, by reloads.

Set ``SWITCHBOARD_SCREENSHOTS=1`` to refresh docs/board-queue.png and docs/board-budget.png.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from switchboard.services import accounts
from tests.mcp_fixtures import ROOT, Agent, Rpc, Served, start_switchboard

CHROMIUM = Path(os.environ.get("SWITCHBOARD_CHROMIUM", "/usr/bin/chromium"))
PASSWORD = "a long browser password"

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="Playwright for Python is not installed (pip install -e .[dev])"
)


@pytest.fixture(scope="module")
def chromium() -> Path:
    if not CHROMIUM.exists():
        pytest.skip(
            f"SKIPPING THE BROWSER TESTS: no Chromium at {CHROMIUM} "
            "(apt-get install chromium, or set SWITCHBOARD_CHROMIUM)"
        )
    return CHROMIUM


@pytest.fixture(scope="module")
def server(module_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    served = start_switchboard(module_db, tmp_path_factory.mktemp("board-serve"))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def browser(chromium: Path) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(chromium), headless=True)
        yield launched
        launched.close()


@pytest.fixture
def operator_email(module_db: str) -> str:
    email = f"op-{uuid.uuid4().hex[:8]}@example.com"
    with psycopg.connect(module_db) as conn:
        accounts.create_human(conn, data={"email": email, "password": PASSWORD})
    return email


def _agent(database_url: str, token: str, slug: str) -> Agent:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT g.id, e.id FROM grants g JOIN endpoints e ON e.id = g.endpoint_id "
            "WHERE e.slug = %s ORDER BY g.created_at DESC LIMIT 1",
            (slug,),
        ).fetchone()
    assert row is not None
    return Agent(token, slug, row[1], row[0])


def _claim_next(rpc: Rpc) -> dict[str, Any]:
    result = rpc.call("claim_next", {})
    assert not result.get("isError"), result
    structured: dict[str, Any] = result["structuredContent"]
    return structured


def journey(page: Any, base: str, email: str, database_url: str, *, js: bool) -> None:
    expect = sync_api.expect
    slug = f"{'js' if js else 'nojs'}-bot-{uuid.uuid4().hex[:6]}"

    # Sign in (the board sends us to the login page first).
    page.goto(base + "/board/")
    expect(page).to_have_url(re.compile(r"/board/login"))
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", PASSWORD)
    page.click("button:has-text('Sign in')")
    expect(page.locator("h1")).to_have_text("My endpoints")

    # The wizard: describe, consent, token shown once with a ready MCP client config.
    page.click("text=+ New agent")
    expect(page.locator("text=lets the agent change its own budget")).to_be_visible()
    expect(page.locator("input[value=set_admission_policy]")).not_to_be_checked()
    expect(page.locator("input[value=claim_next]")).to_be_checked()
    page.fill("input[name=endpoint]", slug)
    page.fill("input[name=queues]", "jobs")
    page.click("button:has-text('Review')")
    expect(page.locator("h1")).to_have_text("Grant access?")
    page.click("button:has-text('Grant and show the token')")
    token = page.locator("#agent-token").inner_text().strip()
    assert token.startswith("sba_")
    expect(page.locator("#mcp-config")).to_contain_text(f"Bearer {token}")
    if js:
        expect(page.locator("button.copy").first).to_be_visible()
    page.reload()
    expect(page.locator("h1")).to_have_text("Token already shown")

    # Three todos through the queue page's form.
    queue_url = f"{base}/board/e/{slug}/q/jobs"
    page.goto(queue_url)
    for title in ("first job", "second job", "third job"):
        page.fill("input[name=title]", title)
        page.click("button:has-text('Add todo')")
        expect(page.locator(f"article.todo:has-text('{title}')")).to_be_visible()

    # The Budget editor: a bad value is refused with the input kept, then a good one saved.
    page.click("#queue-header a:has-text('Budget')")
    page.fill("input[name=max_claims_per_window]", "-2")
    page.select_option("select[name=period]", "day")
    page.select_option("select[name=tz]", "America/Los_Angeles")
    page.fill("input[name=start]", "00:00")
    page.click("button:has-text('Save budget')")
    expect(page.locator(".field-error")).to_contain_text("greater than or equal to 0")
    expect(page.locator("input[name=max_claims_per_window]")).to_have_value("-2")
    expect(page.locator("select[name=tz]")).to_have_value("America/Los_Angeles")
    page.fill("input[name=max_claims_per_window]", "2")
    page.click("button:has-text('Save budget')")
    expect(page.locator(".flash-ok")).to_have_text("Budget saved.")
    expect(page.locator("#budget-summary")).to_contain_text(
        "2 claims per day from 00:00 America/Los_Angeles · resets"
    )
    expect(page.locator("#drain-estimate")).to_contain_text("The last of the 3 waiting")
    _screenshot(page, "board-budget.png", js=js)

    # The queue page: the strip starts at 0 of 2; an agent claims over MCP.
    page.goto(queue_url)
    strip = page.locator("[data-strip=used]")
    expect(strip).to_contain_text("0 of 2")
    zone_names = ("CET", "CEST") if js else ("UTC",)
    resets = page.locator("[data-strip=resets]").inner_text()
    assert re.search(r"P[SD]T", resets) and any(name in resets for name in zone_names), resets
    rpc = Rpc(base + "/mcp", _agent(database_url, token, slug))
    rpc.initialize()
    if js:
        expect(page.locator("#live")).to_have_attribute("data-live", "open")
        page.evaluate("window.__notReloaded = true")
    assert _claim_next(rpc)["todo"]["title"] == "first job"
    if not js:
        page.reload()
    expect(strip).to_contain_text("1 of 2", timeout=10_000)
    expect(page.locator("[data-strip=in-flight]")).to_contain_text("1")
    assert _claim_next(rpc)["todo"]["title"] == "second job"
    if not js:
        page.reload()
    expect(strip).to_contain_text("2 of 2", timeout=10_000)
    expect(page.locator("[data-strip=status]")).to_contain_text("deferred · window exhausted")
    if js:
        assert page.evaluate("window.__notReloaded") is True  # pushed, not reloaded

    # The third is held back: the agent is told, the card shows the reason chip and its time.
    idle = _claim_next(rpc)
    assert idle["empty"] is True and idle["deferred"][0]["reason"] == "window_exhausted"
    chip = page.locator("article.todo:has-text('third job') .chip.reason")
    expect(chip).to_contain_text("window exhausted · eligible")
    assert re.search(r"eligible \w{3} \d+ \w{3} 00:00 P[SD]T", chip.inner_text())
    _screenshot(page, "board-queue.png", js=js)

    # An operator claim of the held-back todo is refused, and the board says why.
    page.locator("article.todo:has-text('third job') button:has-text('Claim')").click()
    expect(page.locator(".flash-error")).to_contain_text("Held back by the queue's budget")
    expect(page.locator(".flash-error")).to_contain_text("Eligible again")


def _screenshot(page: Any, name: str, *, js: bool) -> None:
    if js and os.environ.get("SWITCHBOARD_SCREENSHOTS") == "1":
        page.screenshot(path=str(ROOT / "docs" / name), full_page=True)


def test_the_journey_with_javascript(
    browser: Any, server: Served, operator_email: str, module_db: str
) -> None:
    context = browser.new_context(
        timezone_id="Europe/Paris", viewport={"width": 1280, "height": 900}
    )
    try:
        journey(context.new_page(), server.base, operator_email, module_db, js=True)
    finally:
        context.close()


def test_the_journey_without_javascript(
    browser: Any, server: Served, operator_email: str, module_db: str
) -> None:
    context = browser.new_context(java_script_enabled=False, timezone_id="Europe/Paris")
    try:
        journey(context.new_page(), server.base, operator_email, module_db, js=False)
    finally:
        context.close()


def _requests_sign_in(base: str, email: str) -> Any:
    import requests

    http = requests.Session()
    page = http.get(base + "/board/login", timeout=10).text
    match = re.search(r'name="csrf" value="([^"]+)"', page)
    assert match is not None
    signed = http.post(
        base + "/board/login",
        data={"csrf": match.group(1), "email": email, "password": PASSWORD},
        allow_redirects=False,
        timeout=10,
    )
    assert signed.status_code == 302, signed.text
    return http


def test_a_quick_stop_never_waits_on_an_open_live_page(
    module_db: str, operator_email: str, tmp_path: Path
) -> None:
    """SIGINT (gunicorn's quick stop): an open board stream ends at once through its worker's
    exit hook. (A graceful SIGTERM lets open streams, MCP's and the board's, hold a worker for
    at most the graceful timeout, 20 s; the browser then reconnects to another worker.)"""
    import signal
    import time

    slug = f"stop-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(module_db) as conn:
        from switchboard.store import accounts as store

        human = store.find_human_by_email(conn, email=operator_email)
        assert human is not None
        accounts.create_endpoint(conn, owner=human, data={"slug": slug})
    served = start_switchboard(module_db, tmp_path)
    try:
        http = _requests_sign_in(served.base, operator_email)
        live = http.get(f"{served.base}/board/e/{slug}/q/jobs/live", stream=True, timeout=30)
        assert live.status_code == 200
        lines = live.iter_lines()
        assert next(lines) == b"event: header"
        started = time.monotonic()
        served.process.send_signal(signal.SIGINT)
        served.process.wait(timeout=60)
        assert time.monotonic() - started < 10
        live.close()
    finally:
        served.stop()
