"""The ``switchboard`` command: serve, migrate, bootstrap, and the operator commands (endpoint,
grant, todo, queue budget) that call the REST API at SWITCHBOARD_URL with SWITCHBOARD_TOKEN."""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import quote, urlencode

import click
import psycopg
from gunicorn.app.base import BaseApplication

from switchboard import config as configmod
from switchboard import db as dbmod
from switchboard import gunicorn_conf
from switchboard.admission import windows
from switchboard.errors import SwitchboardError
from switchboard.models import TODO_STATES
from switchboard.pgserver import EmbeddedPostgres
from switchboard.services import accounts


def _fail(message: str) -> NoReturn:
    click.echo(f"switchboard: {message}", err=True)
    sys.exit(1)


def _config() -> configmod.Config:
    try:
        return configmod.load()
    except configmod.ConfigError as exc:
        _fail(f"configuration error: {exc}")


@contextmanager
def _database_url(config: configmod.Config) -> Iterator[str]:
    """The configured database, or the embedded one for the duration of the block."""
    if config.database_url is not None:
        yield config.database_url
        return
    server = EmbeddedPostgres(config.data_dir)
    try:
        yield server.start()
    finally:
        server.stop()


@click.group()
def main() -> None:
    """Switchboard: a dispatch board for people and AI agents."""


@main.command()
def migrate() -> None:
    """Apply pending database migrations."""
    config = _config()
    try:
        with _database_url(config) as url:
            applied = dbmod.migrate(url)
    except psycopg.Error as exc:
        _fail(f"cannot migrate: {exc}")
    click.echo(f"applied {len(applied)} migration(s): {', '.join(applied) or 'none pending'}")


@main.command()
@click.option("--email", required=True, help="The first admin's email.")
@click.option("--password", default=None, help="A password for the board (optional).")
def bootstrap(email: str, password: str | None) -> None:
    """Create the first admin and print only its API token."""
    config = _config()
    try:
        with _database_url(config) as url:
            dbmod.migrate(url)
            database = dbmod.Database(url, min_size=1, max_size=1)
            database.open(wait=True)
            try:
                with database.transaction() as conn:
                    created = accounts.bootstrap(conn, email=email, password=password)
            finally:
                database.close()
    except SwitchboardError as exc:
        _fail(exc.message if not exc.details.get("fields") else _fields_line(exc.details))
    except psycopg.Error as exc:
        _fail(f"cannot reach the database: {exc}")
    click.echo(created.token)


def _fields_line(details: dict[str, Any]) -> str:
    fields = details["fields"]
    return "; ".join(f"{name}: {' '.join(map(str, msgs))}" for name, msgs in fields.items())


@main.command()
def serve() -> None:
    """Start PostgreSQL if embedded, migrate, and serve with gunicorn (gthread)."""
    config = _config()
    with _database_url(config) as url:
        try:
            dbmod.migrate(url)
        except psycopg.Error as exc:
            _fail(f"cannot migrate: {exc}")
        os.environ["DATABASE_URL"] = url  # workers use this server and start nothing
        click.echo(f"Switchboard serving on {config.public_url}")
        sys.stdout.flush()
        _Gunicorn(gunicorn_conf.settings(config)).run()


class _Gunicorn(BaseApplication):  # type: ignore[misc]
    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Any:
        from app import create_app

        return create_app()


# --- operator commands: the REST API over HTTP (SWITCHBOARD_URL, SWITCHBOARD_TOKEN) ----------

DEFAULT_URL = "http://127.0.0.1:8080"
API_PREFIX = "/api/v1"
HTTP_TIMEOUT = 30.0
WINDOW_FLAGS = (("per_hour", "hour"), ("per_day", "day"), ("per_week", "week"))


@dataclass(frozen=True)
class Reply:
    """An API answer: the parsed JSON (None for 204) and the body exactly as it came."""

    data: Any
    raw: str


def _usage(message: str) -> NoReturn:
    click.echo(f"switchboard: {message}", err=True)
    sys.exit(2)


def _base_url() -> str:
    return (os.environ.get("SWITCHBOARD_URL") or DEFAULT_URL).rstrip("/")


def _token() -> str:
    token = (os.environ.get("SWITCHBOARD_TOKEN") or "").strip()
    if not token:
        _fail(
            "SWITCHBOARD_TOKEN is not set: export an operator token (sbo_…); "
            "`switchboard bootstrap` prints the first admin's"
        )
    return token


def _path(*segments: str) -> str:
    return "/" + "/".join(quote(segment, safe=":@") for segment in segments)


def _call(method: str, path: str, body: Any = None, query: dict[str, Any] | None = None) -> Reply:
    """One API request; exits with the server's message on an error answer."""
    token = _token()
    params = {k: v for k, v in (query or {}).items() if v is not None}
    url = _base_url() + API_PREFIX + path + (f"?{urlencode(params)}" if params else "")
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT) as response:
            raw = response.read().decode("utf-8")
    except urllib.error.HTTPError as exc:
        _fail(_error_line(exc.read().decode("utf-8", "replace"), exc.code))
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        _fail(f"cannot reach {_base_url()}: {reason}")
    try:
        return Reply(json.loads(raw) if raw else None, raw)
    except ValueError:
        _fail(f"{_base_url()} answered something that is not Switchboard's JSON")


def _error_line(raw: str, status: int) -> str:
    """The server's error message, with each invalid field named."""
    try:
        error = json.loads(raw)["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status} from {_base_url()}"
    fields = (error.get("details") or {}).get("fields")
    if isinstance(fields, dict) and fields:
        return f"{message}: {'; '.join(_flatten(fields))}"
    return message


def _flatten(fields: dict[str, Any], prefix: str = "") -> list[str]:
    lines = []
    for name, messages in fields.items():
        if isinstance(messages, dict):
            lines += _flatten(messages, f"{prefix}{name}.")
        else:
            text = " ".join(map(str, messages)) if isinstance(messages, list) else str(messages)
            lines.append(f"{prefix}{name}: {text}")
    return lines


def _show(as_json: bool, reply: Reply, render: Callable[[Any], None]) -> None:
    """``--json``: the API's JSON verbatim; otherwise the readable form."""
    if as_json:
        click.echo(reply.raw)
    else:
        render(reply.data)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    if not rows:
        click.echo("(none)")
        return
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]
    for row in (headers, *rows):
        click.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _pairs(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max(len(key) for key, _ in pairs)
    for key, value in pairs:
        click.echo(f"{key.ljust(width)}  {'-' if value is None else value}")


def _next_page(page: dict[str, Any]) -> None:
    if page["next"]:
        click.echo(f"more: --after {page['next']}")


json_option = click.option("--json", "as_json", is_flag=True, help="Print the API's JSON as is.")


# --- endpoints ------------------------------------------------------------------------------


@main.group()
def endpoint() -> None:
    """Endpoints (agent identities) you manage."""


def _endpoint_row(item: dict[str, Any]) -> list[str]:
    return [item["slug"], item["display_name"], item["notify_url"] or "-", item["created_at"]]


@endpoint.command("create")
@click.argument("slug")
@click.option("--display-name", default=None, help="Default: the slug.")
@click.option("--notify-url", default=None, help="Where doorbells go when no agent is attached.")
@json_option
def endpoint_create(
    slug: str, display_name: str | None, notify_url: str | None, as_json: bool
) -> None:
    """Create an endpoint you own."""
    body = {"slug": slug, "display_name": display_name, "notify_url": notify_url}
    reply = _call("POST", "/endpoints", {k: v for k, v in body.items() if v is not None})
    _show(as_json, reply, _render_endpoint)


def _render_endpoint(item: dict[str, Any]) -> None:
    pairs = [("endpoint", item["slug"]), ("id", item["id"]), ("name", item["display_name"])]
    pairs += [("notify url", item["notify_url"]), ("notify secret", item.get("notify_secret"))]
    pairs += [("created", item["created_at"])]
    if "queues" in item:
        pairs.append(("queues", ", ".join(item["queues"]) or "(none yet)"))
    _pairs(pairs)
    if item.get("grants"):
        click.echo("\ngrants")
        _table(
            ["ID", "VERBS", "QUEUES", "CREATED", "REVOKED"],
            [
                [
                    grant["id"],
                    ",".join(grant["verbs"]),
                    ",".join(grant["queues"]) if grant["queues"] is not None else "(all)",
                    grant["created_at"],
                    grant["revoked_at"] or "-",
                ]
                for grant in item["grants"]
            ],
        )


@endpoint.command("list")
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--after", default=None, help="The cursor printed after the previous page.")
@json_option
def endpoint_list(limit: int, after: str | None, as_json: bool) -> None:
    """List the endpoints you manage (admins: all)."""
    reply = _call("GET", "/endpoints", query={"limit": limit, "after": after})

    def render(page: dict[str, Any]) -> None:
        _table(["SLUG", "NAME", "NOTIFY URL", "CREATED"], [_endpoint_row(e) for e in page["items"]])
        _next_page(page)

    _show(as_json, reply, render)


@endpoint.command("show")
@click.argument("slug")
@json_option
def endpoint_show(slug: str, as_json: bool) -> None:
    """Show an endpoint with its queues and grants."""
    _show(as_json, _call("GET", _path("endpoints", slug)), _render_endpoint)


# --- grants ---------------------------------------------------------------------------------


@main.group()
def grant() -> None:
    """Agent credentials (sba_ tokens) for an endpoint."""


@grant.command("create")
@click.argument("endpoint_slug", metavar="ENDPOINT")
@click.option("--verb", "verbs", multiple=True, help="A verb to grant (repeat; default: basics).")
@click.option(
    "--queue", "queues", multiple=True, help="Limit to this queue (repeat; default: all)."
)
@json_option
def grant_create(
    endpoint_slug: str, verbs: tuple[str, ...], queues: tuple[str, ...], as_json: bool
) -> None:
    """Vend an agent token for ENDPOINT; the token is shown once."""
    body = {"verbs": list(verbs) or None, "queues": list(queues) or None}
    reply = _call("POST", _path("endpoints", endpoint_slug, "grants"), body)

    def render(item: dict[str, Any]) -> None:
        queues_text = ", ".join(item["queues"]) if item["queues"] is not None else "(all)"
        _pairs(
            [
                ("grant", item["id"]),
                ("endpoint", item["endpoint"]),
                ("verbs", ", ".join(item["verbs"])),
                ("queues", queues_text),
                ("token", f"{item['token']}   (shown once)"),
            ]
        )

    _show(as_json, reply, render)


@grant.command("revoke")
@click.argument("grant_id", metavar="GRANT_ID")
def grant_revoke(grant_id: str) -> None:
    """Revoke a grant (its token stops working at once)."""
    _call("DELETE", _path("grants", grant_id))
    click.echo(f"revoked grant {grant_id}")


# --- todos ----------------------------------------------------------------------------------


@main.group()
def todo() -> None:
    """Todos of the endpoints you manage."""


def _admission_text(item: dict[str, Any]) -> str:
    block = item.get("admission")
    if not block:
        return "-"
    if not block["deferred"]:
        return "open"
    return f"deferred: {block['reason']}"


@todo.command("add")
@click.argument("endpoint_slug", metavar="ENDPOINT")
@click.argument("queue")
@click.argument("title")
@click.option("--body", default=None)
@click.option("--payload", default=None, help="A JSON object.")
@click.option("--max-attempts", type=int, default=None)
@click.option("--lease-seconds", type=int, default=None)
@json_option
def todo_add(
    endpoint_slug: str,
    queue: str,
    title: str,
    body: str | None,
    payload: str | None,
    max_attempts: int | None,
    lease_seconds: int | None,
    as_json: bool,
) -> None:
    """Put a new pending todo in QUEUE of ENDPOINT."""
    data: dict[str, Any] = {"endpoint": endpoint_slug, "queue": queue, "title": title}
    if payload is not None:
        try:
            data["payload"] = json.loads(payload)
        except ValueError as exc:
            _usage(f"--payload is not JSON: {exc}")
    optional = {"body": body, "max_attempts": max_attempts, "lease_seconds": lease_seconds}
    data.update({k: v for k, v in optional.items() if v is not None})
    _show(as_json, _call("POST", "/todos", data), _render_todo)


def _render_todo(item: dict[str, Any]) -> None:
    pairs: list[tuple[str, Any]] = [
        ("todo", item["id"]),
        ("queue", f"{item['endpoint']}/{item['queue']}"),
        ("title", item["title"]),
        ("state", item["state"]),
        ("attempt", f"{item['attempt']} of {item['max_attempts']}"),
        ("admission", _admission_text(item)),
    ]
    block = item.get("admission") or {}
    if block.get("deferred"):
        pairs.append(("eligible at", _when(block.get("next_eligible_at"), None)))
    for key in ("lease_expires_at", "retry_at", "last_error", "created_at", "finished_at"):
        if item.get(key) is not None:
            pairs.append((key.replace("_", " "), item[key]))
    if item.get("body"):
        pairs.append(("body", item["body"]))
    if item.get("payload"):
        pairs.append(("payload", json.dumps(item["payload"])))
    if item.get("result") is not None:
        pairs.append(("result", json.dumps(item["result"])))
    _pairs(pairs)


@todo.command("list")
@click.option("--endpoint", "endpoint_slug", default=None, help="Slug or id (default: all).")
@click.option("--queue", default=None)
@click.option("--state", type=click.Choice(TODO_STATES), default=None)
@click.option("--limit", type=click.IntRange(1, 200), default=50, show_default=True)
@click.option("--after", default=None, help="The cursor printed after the previous page.")
@json_option
def todo_list(
    endpoint_slug: str | None,
    queue: str | None,
    state: str | None,
    limit: int,
    after: str | None,
    as_json: bool,
) -> None:
    """List todos, newest first."""
    query = {"endpoint": endpoint_slug, "queue": queue, "state": state, "limit": limit}
    reply = _call("GET", "/todos", query=query | {"after": after})

    def render(page: dict[str, Any]) -> None:
        rows = [
            [
                item["id"],
                f"{item['endpoint']}/{item['queue']}",
                item["state"],
                str(item["attempt"]),
                _admission_text(item),
                item["title"][:40],
            ]
            for item in page["items"]
        ]
        _table(["ID", "QUEUE", "STATE", "ATTEMPT", "ADMISSION", "TITLE"], rows)
        _next_page(page)

    _show(as_json, reply, render)


@todo.command("show")
@click.argument("todo_id", metavar="ID")
@json_option
def todo_show(todo_id: str, as_json: bool) -> None:
    """Show one todo."""
    _show(as_json, _call("GET", _path("todos", todo_id)), _render_todo)


@todo.command("cancel")
@click.argument("todo_id", metavar="ID")
@json_option
def todo_cancel(todo_id: str, as_json: bool) -> None:
    """Cancel a todo that is not finished."""
    _show(as_json, _call("POST", _path("todos", todo_id, "cancel")), _render_todo)


# --- queues and budgets ---------------------------------------------------------------------


@main.group()
def queue() -> None:
    """Queues: counts, and their admission budgets."""


@queue.command("list")
@click.argument("endpoint_slug", metavar="[ENDPOINT]", required=False)
@json_option
def queue_list(endpoint_slug: str | None, as_json: bool) -> None:
    """Todos by state and the oldest pending age, per queue."""
    reply = _call("GET", "/queues", query={"endpoint": endpoint_slug})

    def render(items: list[dict[str, Any]]) -> None:
        rows = []
        for item in items:
            counts = item["counts"]
            status = item["admission"]
            rows.append(
                [
                    f"{item['endpoint']}/{item['queue']}",
                    *(str(counts[s]) for s in ("pending", "claimed", "retry_wait", "done")),
                    str(counts["failed"] + counts["cancelled"]),
                    _age(item["oldest_pending_age_s"]),
                    "-" if status is None else _status_text(status),
                ]
            )
        headers = [
            "QUEUE",
            "PENDING",
            "CLAIMED",
            "RETRY",
            "DONE",
            "FAILED+CANC",
            "OLDEST",
            "BUDGET",
        ]
        _table(headers, rows)

    _show(as_json, reply, render)


def _age(seconds: int | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    return f"{seconds // 3600}h"


@queue.group()
def budget() -> None:
    """Admission budgets: claims per window and claims in flight."""


def _zone(name: str | None) -> tzinfo | None:
    if name is None:
        return None
    try:
        return windows.load_zone(name)
    except windows.UnknownZone:
        return None


def _when(value: str | None, zone: tzinfo | None) -> str:
    """An RFC 3339 time in ``zone`` (None: this machine's zone), with the zone's abbreviation."""
    if value is None:
        return "-"
    at = datetime.fromisoformat(value)
    return (at.astimezone(zone) if zone else at.astimezone()).strftime("%Y-%m-%d %H:%M %Z")


def _status_text(status: dict[str, Any]) -> str:
    return status["status"] if status["status"] == "open" else f"deferred: {status['reason']}"


def _window_text(window: dict[str, Any] | None) -> str:
    if window is None:
        return "-"
    at = window["start"] if window["period"] != "week" else f"{window['weekday']} {window['start']}"
    return f"{window['period']} from {at} {window['tz']}"


def _fraction(value: int | None, limit: int | None) -> str:
    return f"{'-' if value is None else value}/{'-' if limit is None else limit}"


def _budget_row(status: dict[str, Any]) -> list[str]:
    policy = status["policy"]
    zone = _zone((policy["window"] or {}).get("tz"))
    return [
        status["endpoint"],
        status["queue"],
        _status_text(status),
        _fraction(status["used"], policy["max_claims_per_window"]),
        _fraction(status["in_flight"], policy["max_in_flight"]),
        str(status["pending"]),
        _when(status["window_resets_at"], zone) if zone else "-",
        _when(status["window_resets_at"], None),
    ]


BUDGET_HEADERS = [
    "ENDPOINT",
    "QUEUE",
    "STATUS",
    "USED/LIMIT",
    "IN-FLIGHT/CAP",
    "PENDING",
    "RESETS AT (POLICY ZONE)",
    "RESETS AT (LOCAL)",
]


def _render_budget(detail: dict[str, Any]) -> None:
    policy = detail["policy"]
    zone = _zone((policy["window"] or {}).get("tz"))
    status = _status_text(detail)
    if detail["status"] == "deferred":
        exact = "exact" if detail["exact"] else "estimate"
        status += f", eligible {_when(detail['next_eligible_at'], None)} ({exact})"
    resets_at = detail["window_resets_at"]
    resets = "-"
    if resets_at is not None:
        resets = f"{_when(resets_at, zone)} · {_when(resets_at, None)} (local)"
    _pairs(
        [
            ("budget", f"{detail['endpoint']}/{detail['queue']}"),
            ("status", status),
            ("used/limit", _fraction(detail["used"], policy["max_claims_per_window"])),
            ("in-flight/cap", _fraction(detail["in_flight"], policy["max_in_flight"])),
            ("pending", detail["pending"]),
            ("window", _window_text(policy["window"])),
            ("resets at", resets),
            ("policy id", detail["id"]),
        ]
    )
    if detail["windows"]:
        click.echo("\nrecent windows")
        rows = [[_when(w["window_start"], zone), str(w["used"])] for w in detail["windows"]]
        _table(["WINDOW START", "USED"], rows)
    click.echo("\naudit")
    rows = [
        [
            _when(entry["at"], None),
            entry["action"],
            f"human {entry['actor_human_id']}"
            + (f" via agent {entry['actor_endpoint_id']}" if entry["actor_endpoint_id"] else ""),
        ]
        for entry in detail["audit"]
    ]
    _table(["AT", "ACTION", "BY"], rows)


@budget.command("show")
@click.argument("endpoint_slug", metavar="[ENDPOINT]", required=False)
@click.argument("queue_name", metavar="[QUEUE]", required=False)
@json_option
def budget_show(endpoint_slug: str | None, queue_name: str | None, as_json: bool) -> None:
    """Budgets you manage: used/limit, in-flight/cap, status, resets-at in both zones."""
    if endpoint_slug is not None and queue_name is not None:
        reply = _call("GET", _path("admission", f"endpoint:{endpoint_slug}", queue_name))
        _show(as_json, reply, _render_budget)
        return
    reply = _call("GET", "/admission", query={"endpoint": endpoint_slug})
    _show(as_json, reply, lambda items: _table(BUDGET_HEADERS, [_budget_row(s) for s in items]))


@budget.command("set")
@click.argument("endpoint_slug", metavar="ENDPOINT")
@click.argument("queue_name", metavar="QUEUE")
@click.option("--per-hour", type=click.IntRange(0), default=None, help="Claims per hour.")
@click.option("--per-day", type=click.IntRange(0), default=None, help="Claims per day.")
@click.option("--per-week", type=click.IntRange(0), default=None, help="Claims per week.")
@click.option("--tz", default=None, help="IANA zone of the window (default: this machine's).")
@click.option("--start", default=None, help="HH:MM the window starts (default: 00:00).")
@click.option("--weekday", default=None, help="Mon…Sun, weekly windows (default: Mon).")
@click.option("--max-in-flight", type=click.IntRange(0), default=None, help="Claimed at once.")
@json_option
def budget_set(
    endpoint_slug: str,
    queue_name: str,
    per_hour: int | None,
    per_day: int | None,
    per_week: int | None,
    tz: str | None,
    start: str | None,
    weekday: str | None,
    max_in_flight: int | None,
    as_json: bool,
) -> None:
    """Set QUEUE's budget: a full replace (limits not given are removed); 0 pauses."""
    given = {"per_hour": per_hour, "per_day": per_day, "per_week": per_week}
    policy = _policy(given, tz=tz, start=start, weekday=weekday, max_in_flight=max_in_flight)
    path = _path("admission", f"endpoint:{endpoint_slug}", queue_name)
    _show(as_json, _call("PUT", path, policy), _render_budget)


def _policy(
    given: dict[str, int | None],
    *,
    tz: str | None,
    start: str | None,
    weekday: str | None,
    max_in_flight: int | None,
) -> dict[str, Any]:
    """The policy body of ``budget set``; exits 2 on flags that do not go together."""
    chosen = [(flag, period) for flag, period in WINDOW_FLAGS if given[flag] is not None]
    if len(chosen) > 1:
        names = " and ".join("--" + flag.replace("_", "-") for flag, _ in chosen)
        _usage(f"--per-hour, --per-day and --per-week are mutually exclusive (got {names})")
    if not chosen and max_in_flight is None:
        _usage("give --per-hour, --per-day or --per-week N, --max-in-flight N, or both")
    if not chosen and (tz or start or weekday):
        _usage("--tz, --start and --weekday need --per-hour, --per-day or --per-week")
    if weekday is not None and (not chosen or chosen[0][1] != "week"):
        _usage("--weekday goes with --per-week only")
    if not chosen:
        return {"max_in_flight": max_in_flight, "max_claims_per_window": None, "window": None}
    flag, period = chosen[0]
    window = {
        "period": period,
        "tz": tz or local_zone_name(),
        "start": start or "00:00",
        "weekday": (weekday or "Mon") if period == "week" else None,
    }
    return {"max_in_flight": max_in_flight, "max_claims_per_window": given[flag], "window": window}


def local_zone_name() -> str:
    """This machine's IANA zone (TZ, then /etc/localtime, then /etc/timezone), else UTC."""
    candidates = [os.environ.get("TZ", "").removeprefix(":")]
    try:
        link = os.readlink("/etc/localtime")
        candidates.append(link.partition("zoneinfo/")[2])
    except OSError:
        pass
    try:
        candidates.append(Path("/etc/timezone").read_text(encoding="utf-8").strip())
    except OSError:
        pass
    return next((name for name in candidates if name and _zone(name)), "UTC")


@budget.command("clear")
@click.argument("endpoint_slug", metavar="ENDPOINT")
@click.argument("queue_name", metavar="QUEUE")
def budget_clear(endpoint_slug: str, queue_name: str) -> None:
    """Remove QUEUE's budget: claims are no longer limited (the audit is kept)."""
    _call("DELETE", _path("admission", f"endpoint:{endpoint_slug}", queue_name))
    click.echo(f"cleared the budget of {endpoint_slug}/{queue_name}")
