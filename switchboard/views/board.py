"""``/board``: the operators' HTML board (SPEC §8).

Server-rendered pages and plain HTML forms: every page works with JavaScript off. A session
cookie (HttpOnly, SameSite=Lax, Secure when the request came over https) carries the signed-in
human and a CSRF token that every POST must echo; every successful POST redirects (PRG). With
JavaScript on, a vendored htmx and its SSE extension swap in the live queue header and cards
(``board_live``). Domain errors are titled by ``views/errors.py``.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import unquote
from uuid import UUID

import psycopg
from flask import (
    Blueprint,
    Flask,
    Response,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    stream_with_context,
    url_for,
)
from flask.sessions import SecureCookieSessionInterface
from werkzeug.exceptions import BadRequest, HTTPException, NotFound
from werkzeug.wrappers import Response as BaseResponse

from switchboard import board_forms, errors, extensions
from switchboard.admission import windows
from switchboard.admission.service import policy_of
from switchboard.db import Database
from switchboard.models import Human
from switchboard.schemas import QUEUE_PATTERN, load
from switchboard.services import board, operator
from switchboard.verbs import ADMISSION_VERBS, BASIC_VERBS, DRAIN_VERBS
from switchboard.views import board_live
from switchboard.views.api import _storable
from switchboard.views.errors import board_title, html_error, status_of
from switchboard.views.mcp import _hangup_probe

bp = Blueprint(
    "board",
    __name__,
    url_prefix="/board",
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)
_LIVE_KEY = "switchboard.board_live"
_PUBLIC = frozenset({"board.login", "board.static"})
VERB_GROUPS = (
    ("Basics", BASIC_VERBS, True, "see who it is, create, read and list todos"),
    ("Drain", DRAIN_VERBS, True, "claim work, keep leases alive, finish it, see its budget"),
    ("Admission", ADMISSION_VERBS, False, "lets the agent change its own budget"),
)
DONE = {"claim": "claimed", "complete": "completed", "release": "released", "cancel": "cancelled"}
R = TypeVar("R")


class _SessionInterface(SecureCookieSessionInterface):
    """Flask's signed cookie, marked Secure whenever the request itself came over https
    (behind a proxy, ProxyFix makes ``request.is_secure`` see the client's scheme)."""

    def get_cookie_secure(self, app: Flask) -> bool:
        return bool(app.config.get("SESSION_COOKIE_SECURE")) or request.is_secure


def init_app(app: Flask) -> None:
    """Session cookie settings, the live-page poller, and the blueprint."""
    app.session_interface = _SessionInterface()
    app.config.update(
        SESSION_COOKIE_NAME="switchboard_session",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
    )
    state = extensions.state(app)
    limit = max(2, state.config.threads // 4)
    app.extensions[_LIVE_KEY] = board_live.BoardLive(state.db, limit=limit)
    app.register_blueprint(bp)
    app.add_url_rule("/", "board_root", lambda: redirect(url_for("board.overview")))


def live_of(app: Any) -> board_live.BoardLive | None:
    """The app's live-page hub (None for anything else): a worker's SIGTERM hook closes it,
    so open board tabs never hold a stopping worker for the graceful timeout."""
    extensions = getattr(app, "extensions", {})
    hub = extensions.get(_LIVE_KEY)
    return hub if isinstance(hub, board_live.BoardLive) else None


# --- plumbing -------------------------------------------------------------------------------


def _db() -> Database:
    return extensions.database(current_app)


def _keepalive() -> int:
    return extensions.state(current_app).config.mcp_keepalive_seconds


def _human() -> Human:
    human: Human = g.human
    return human


def _read(fn: Callable[..., R], **kwargs: Any) -> R:
    """Call a service function in one transaction as the signed-in human."""
    with _db().transaction() as conn:
        return fn(conn, human=_human(), **kwargs)


def csrf_token() -> str:
    """This session's CSRF token (made on first use)."""
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(32)
    token: str = session["csrf"]
    return token


def _viewer_zone() -> str:
    """The viewer's zone: ``?tz=``, else the cookie the page script sets, else UTC."""
    chosen = request.args.get("tz") or unquote(request.cookies.get("tz", ""))  # JS-encoded
    return board.zone_or_utc(chosen)


@bp.app_template_global()
def verb_groups() -> tuple[tuple[str, tuple[str, ...], bool, str], ...]:
    return VERB_GROUPS


@bp.app_template_filter("when")
def when_filter(at: datetime | None, zone: str = "UTC") -> str:
    """``Tue 1 Dec 00:00 PST`` in a zone; a dash for no time."""
    return "—" if at is None else board.local(at, zone)


@bp.app_template_filter("ago")
def ago_filter(seconds: int | float | None) -> str:
    if seconds is None:
        return "—"
    seconds = int(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@bp.context_processor
def _context() -> dict[str, Any]:
    return {
        "csrf_token": csrf_token,
        "human": g.get("human"),
        "viewer_zone": _viewer_zone(),
        "in_zones": board.in_zones,
        "local": board.local,
        "short": board.short,
    }


@bp.before_request
def _guard() -> BaseResponse | None:
    """Text PostgreSQL can't store is a 400; a POST must echo the session's CSRF token; every
    page but the sign-in needs a signed-in human."""
    form_values = [value for _, values in request.form.lists() for value in values]
    _storable(request.path, *request.args.values(), form_values)
    if request.method == "POST" and not _csrf_ok(request.form.get("csrf", "")):
        raise BadRequest(
            "This form has expired (its CSRF token does not match). Reload the page and try again."
        )
    if request.endpoint in _PUBLIC:
        return None
    human_id = session.get("human_id")
    human = None
    if human_id:
        with _db().transaction() as conn:
            human = board.signed_in(conn, id=UUID(human_id))
    if human is None:
        session.pop("human_id", None)
        return redirect(url_for("board.login", next=request.full_path.rstrip("?")))
    g.human = human
    return None


def _csrf_ok(sent: str) -> bool:
    expected = session.get("csrf")
    return bool(expected) and hmac.compare_digest(sent.encode(), str(expected).encode())


@bp.errorhandler(errors.SwitchboardError)
def _domain(error: errors.SwitchboardError) -> tuple[str, int]:
    return html_error(status_of(error), board_title(error), error.message)


@bp.errorhandler(HTTPException)
def _http(error: HTTPException) -> tuple[str, int]:
    return html_error(error.code or 500, error.name, error.description or error.name)


def _check_queue(queue: str) -> str:
    if re.fullmatch(QUEUE_PATTERN, queue) is None:
        raise NotFound("No such queue.")
    return queue


def _back(default: str) -> str:
    """A same-site board path from the form's ``back`` field, else ``default``."""
    back = request.form.get("back", "")
    if back.startswith(board_prefix()) and not back.startswith("//") and "\\" not in back:
        return back
    return default


def board_prefix() -> str:
    return url_for("board.overview")


def _say(error: errors.SwitchboardError) -> None:
    """Flash a refusal, explained: for a deferral, why and until when (in both zones)."""
    text = f"{board_title(error)}: {error.message}"
    at = error.details.get("next_eligible_at")
    if isinstance(at, datetime):
        text += f" Eligible again {board.in_zones(at, 'UTC', _viewer_zone())}."
    elif error.details.get("reason") == "paused":
        text += " The queue is paused (a limit of 0)."
    flash(text, "error")


# --- sign-in --------------------------------------------------------------------------------


@bp.route("/login", methods=["GET", "POST"])
def login() -> BaseResponse | tuple[str, int] | str:
    if request.method == "GET":
        return render_template("board/login.html", email="", next=request.args.get("next", ""))
    form = request.form.to_dict()
    try:
        fields = load(board_forms.LoginForm(), form)
    except errors.Invalid:
        fields = None
    human = None
    if fields is not None:
        with _db().transaction() as conn:
            human = board.sign_in(conn, email=fields["email"], password=fields["password"])
    if human is None:
        page = render_template(
            "board/login.html",
            email=form.get("email", ""),
            next=form.get("next", ""),
            failed=True,
        )
        return page, 401
    session.clear()
    session["human_id"] = str(human.id)
    csrf_token()
    target = form.get("next", "")
    if not (target.startswith("/board") and not target.startswith("//")):
        target = url_for("board.overview")
    return redirect(target)


@bp.post("/logout")
def logout() -> BaseResponse:
    session.clear()
    flash("Signed out.", "ok")
    return redirect(url_for("board.login"))


# --- overview and endpoint card -------------------------------------------------------------


@bp.get("/")
def overview() -> str:
    data = _read(board.overview)
    return render_template("board/overview.html", data=data)


@bp.get("/e/<slug>")
def endpoint(slug: str) -> str:
    card = _read(board.endpoint_card, key=slug)
    return render_template("board/endpoint.html", card=card)


@bp.post("/e/<slug>/grants/<uuid:grant_id>/revoke")
def revoke_grant(slug: str, grant_id: UUID) -> BaseResponse:
    with _db().transaction() as conn:
        found = operator.managed_endpoint(conn, human=_human(), key=slug)
        grant = operator.revoke_grant(conn, human=_human(), id=grant_id)
        if grant.endpoint_id != found.id:
            raise errors.NotFound(f"grant {grant_id} not found")
    flash("Grant revoked: its token no longer works.", "ok")
    return redirect(url_for("board.endpoint", slug=slug))


# --- the queue page -------------------------------------------------------------------------


def _queue_context(slug: str, queue: str) -> dict[str, Any]:
    page = _read(board.queue_page, key=slug, queue=queue, after=request.args.get("after"))
    return {"page": page, "back": url_for("board.queue", slug=page.endpoint.slug, queue=queue)}


@bp.get("/e/<slug>/q/<queue>")
def queue(slug: str, queue: str) -> str:
    context = _queue_context(slug, _check_queue(queue))
    return render_template("board/queue.html", **context)


@bp.get("/e/<slug>/q/<queue>/live")
def live(slug: str, queue: str) -> Response:
    """The queue page's SSE stream: ``header`` and ``cards`` fragments when they change."""
    _check_queue(queue)
    with _db().transaction() as conn:
        found = operator.managed_endpoint(conn, human=_human(), key=slug)
    hub: board_live.BoardLive = current_app.extensions[_LIVE_KEY]
    try:
        watcher = hub.watch((found.id, queue))
    except board_live.Busy as exc:
        return Response(str(exc), 503, {"Retry-After": "5"}, mimetype="text/plain")

    gone = _hangup_probe(request.environ.get("gunicorn.socket")) or (lambda: False)
    body = board_live.stream(
        hub, watcher, render=lambda: _live_frames(slug, queue), gone=gone, keepalive=_keepalive()
    )
    response = Response(stream_with_context(body), mimetype="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    return response


def _live_frames(slug: str, queue: str) -> tuple[bytes, float | None] | None:
    """The header and cards as SSE events, and the epoch second at which the queue's status
    changes by itself (a window reset, a lapsing lease: the reopen); None ends the stream."""
    try:
        context = _queue_context(slug, queue)
    except (errors.NotFound, psycopg.Error):
        return None  # the endpoint went away, or the database: end; the browser retries
    header = render_template("board/_queue_header.html", **context)
    cards = render_template("board/_cards.html", **context)
    due = board.status_changes_at(context["page"].status)
    at = due.timestamp() + 0.5 if due is not None else None
    if at is not None and at <= datetime.now(UTC).timestamp():
        at = None  # already past (e.g. a lapsed lease not yet taken over): wait for a change
    return board_live.sse("header", header) + board_live.sse("cards", cards), at


@bp.post("/e/<slug>/q/<queue>/todos")
def add_todo(slug: str, queue: str) -> BaseResponse:
    _check_queue(queue)
    back = url_for("board.queue", slug=slug, queue=queue)
    try:
        form = load(board_forms.NewTodoForm(), request.form.to_dict())
        data = {"queue": queue, "title": form["title"], "body": form["body"]}
        with _db().transaction() as conn:
            operator.create_todo(
                conn,
                human=_human(),
                key=slug,
                data=data,
                defaults=extensions.state(current_app).todo_defaults,
            )
    except errors.Invalid as error:
        _say(error)
        return redirect(back)
    flash("Todo added.", "ok")
    return redirect(back)


@bp.post("/todos/<uuid:todo_id>/<action>")
def todo_action(todo_id: UUID, action: str) -> BaseResponse:
    """claim (operator-owned), complete, release or cancel; a refusal is explained."""
    if action not in ("claim", "complete", "release", "cancel"):
        raise NotFound("No such action.")
    back = _back(url_for("board.overview"))
    try:
        if action == "claim":
            operator.claim_todo(_db(), human=_human(), id=todo_id)
        else:
            with _db().transaction() as conn:
                if action == "cancel":
                    operator.cancel_todo(conn, human=_human(), id=todo_id)
                else:
                    operator.finish_todo(conn, human=_human(), id=todo_id, action=action, fields={})
    except errors.NotFound:
        raise
    except errors.SwitchboardError as error:
        _say(error)
        return redirect(back)
    flash(f"Todo {DONE[action]}.", "ok")
    return redirect(back)


# --- the Budget editor and the audit --------------------------------------------------------


def _form_of(page: board.BudgetPage) -> dict[str, str]:
    """The editor's fields for the saved policy (or a fresh form)."""
    if page.record is None:
        return {
            "max_in_flight": "",
            "max_claims_per_window": "",
            "period": "",
            "tz": "UTC",
            "start": "00:00",
            "weekday": "",
        }
    policy = policy_of(page.record)
    window = policy.window
    return {
        "max_in_flight": "" if policy.max_in_flight is None else str(policy.max_in_flight),
        "max_claims_per_window": ""
        if policy.max_claims_per_window is None
        else str(policy.max_claims_per_window),
        "period": window.period if window else "",
        "tz": window.tz if window else "UTC",
        "start": window.start if window else "00:00",
        "weekday": (window.weekday or "") if window else "",
    }


def _budget(
    slug: str, queue: str, form: dict[str, str] | None, problems: dict[str, list[str]]
) -> str:
    page = _read(board.budget_page, key=slug, queue=queue)
    policy = policy_of(page.record) if page.record is not None else None
    used = page.status.verdict.used if page.status and page.status.verdict.used else 0
    return render_template(
        "board/budget.html",
        page=page,
        form=form or _form_of(page),
        errors=problems,
        policy=policy,
        summary=board.policy_summary(policy, now=page.now, viewer_zone=_viewer_zone())
        if policy
        else None,
        drain=board.drain_estimate(policy, backlog=page.backlog, used=used, now=page.now)
        if policy
        else None,
        zones=windows.available_zones(),
        weekdays=windows.WEEKDAYS,
        periods=windows.PERIODS,
    )


@bp.get("/e/<slug>/q/<queue>/budget")
def budget(slug: str, queue: str) -> str:
    return _budget(slug, _check_queue(queue), None, {})


@bp.post("/e/<slug>/q/<queue>/budget")
def save_budget(slug: str, queue: str) -> BaseResponse | tuple[str, int]:
    _check_queue(queue)
    form = {name: request.form.get(name, "") for name in board_forms.BudgetForm().fields}
    try:
        body = board_forms.load_budget(form)
        with _db().transaction() as conn:
            operator.put_policy(
                conn, human=_human(), scope=f"endpoint:{slug}", queue=queue, data=body
            )
    except errors.Invalid as error:
        return _budget(slug, queue, form, board_forms.field_errors(error)), 422
    flash("Budget saved.", "ok")
    return redirect(url_for("board.budget", slug=slug, queue=queue))


@bp.post("/e/<slug>/q/<queue>/budget/clear")
def clear_budget(slug: str, queue: str) -> BaseResponse:
    _check_queue(queue)
    try:
        with _db().transaction() as conn:
            operator.delete_policy(conn, human=_human(), scope=f"endpoint:{slug}", queue=queue)
    except errors.NotFound:
        with _db().transaction() as conn:
            operator.managed_endpoint(conn, human=_human(), key=slug)  # foreign: 404
        flash("This queue has no budget to clear.", "error")
        return redirect(url_for("board.budget", slug=slug, queue=queue))
    flash("Budget cleared: the queue admits every claim again.", "ok")
    return redirect(url_for("board.budget", slug=slug, queue=queue))


@bp.get("/e/<slug>/q/<queue>/audit")
def audit(slug: str, queue: str) -> str:
    _check_queue(queue)
    with _db().transaction() as conn:
        found = operator.managed_endpoint(conn, human=_human(), key=slug)
        lines = board.audit_lines(conn, endpoint_id=found.id, queue=queue)
    return render_template("board/audit.html", endpoint=found, queue=queue, lines=lines)


# --- the new-agent wizard -------------------------------------------------------------------


def _wizard(
    form: dict[str, Any], problems: dict[str, list[str]], status: int = 200
) -> tuple[str, int]:
    with _db().transaction() as conn:
        mine = operator.list_endpoints(conn, human=_human(), limit=200).items
    page = render_template("board/agent_new.html", form=form, errors=problems, endpoints=mine)
    return page, status


def _agent_form() -> dict[str, Any]:
    return {
        "endpoint": request.form.get("endpoint", ""),
        "display_name": request.form.get("display_name", ""),
        "queues": request.form.get("queues", ""),
        "verbs": request.form.getlist("verbs"),
    }


@bp.get("/agents/new")
def new_agent() -> tuple[str, int]:
    form = {
        "endpoint": request.args.get("slug", ""),
        "display_name": "",
        "queues": "",
        "verbs": [*BASIC_VERBS, *DRAIN_VERBS],
    }
    return _wizard(form, {})


@bp.post("/agents/new")
def agent_consent() -> BaseResponse | tuple[str, int]:
    """Step 2: the consent screen (``step=review``); step 3 (``step=grant``) vends the token."""
    raw = _agent_form()
    try:
        form = board_forms.load_agent_form(raw)
        with _db().transaction() as conn:
            creates = board.check_agent(conn, human=_human(), slug=form["endpoint"])
    except errors.Invalid as error:
        return _wizard(raw, board_forms.field_errors(error), 422)
    if request.form.get("step") != "grant":
        return render_template("board/agent_consent.html", form=form, creates=creates), 200
    try:
        with _db().transaction() as conn:
            vended = board.vend_agent(
                conn,
                human=_human(),
                slug=form["endpoint"],
                display_name=form["display_name"],
                verbs=form["verbs"],
                queues=form["queue_list"],
            )
    except errors.Invalid as error:
        return _wizard(raw, board_forms.field_errors(error), 422)
    # Shown once: the token rides the signed session cookie to the next page, which pops it.
    session["new_token"] = {"token": vended.grant.token, "endpoint": vended.endpoint}
    return redirect(url_for("board.agent_token"))


@bp.get("/agents/token")
def agent_token() -> str:
    shown = session.pop("new_token", None)
    config = None
    if shown is not None:
        url = extensions.state(current_app).config.public_url.rstrip("/") + "/mcp"
        config = json.dumps(
            {
                "mcpServers": {
                    f"switchboard-{shown['endpoint']}": {
                        "type": "http",
                        "url": url,
                        "headers": {"Authorization": f"Bearer {shown['token']}"},
                    }
                }
            },
            indent=2,
        )
    return render_template("board/agent_token.html", shown=shown, config=config)
