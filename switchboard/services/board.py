"""What the board shows beyond the operator service: sign-in, the queue page's pieces,
presence, the plain-language budget summary, the drain estimate and the audit diff.

Functions take an open connection (or nothing: the text helpers are pure) and ``now``; every
window computation goes through :mod:`switchboard.admission.windows`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from werkzeug.security import check_password_hash

from switchboard import doorbells
from switchboard.admission import service as admission
from switchboard.admission import windows
from switchboard.admission.service import Policy, QueueStatus
from switchboard.errors import Conflict, Invalid, NotFound
from switchboard.models import Endpoint, Grant, Human, Todo
from switchboard.schemas import SLUG_PATTERN
from switchboard.services import operator
from switchboard.services.operator import GrantView, Page, QueueView, TodoView
from switchboard.store import accounts as accounts_store
from switchboard.store import board as store
from switchboard.store import operator as operator_store
from switchboard.store.admission import PolicyRecord
from switchboard.store.board import AttachedAgent, AuditEntry, Ring
from switchboard.store.operator import QueueSummary

# Beyond this many windows the drain estimate says "more than N windows" (a queue of 1M
# pending at 1 claim/hour would otherwise walk a century of boundaries).
MAX_DRAIN_WINDOWS = 1000
POLICY_FIELDS = (
    ("max_in_flight", "in-flight cap"),
    ("max_claims_per_window", "claims per window"),
    ("period", "period"),
    ("tz", "zone"),
    ("start", "start"),
    ("weekday", "weekday"),
)


# --- who ------------------------------------------------------------------------------------


def sign_in(conn: Connection[Any], *, email: str, password: str) -> Human | None:
    """The human with this email and password, or None (unknown, wrong, or no password)."""
    human = accounts_store.find_human_by_email(conn, email=email.strip())
    if human is None or not human.password_hash:
        return None
    return human if check_password_hash(human.password_hash, password) else None


def signed_in(conn: Connection[Any], *, id: UUID) -> Human | None:
    """The human of a board session, or None when it no longer exists."""
    try:
        return accounts_store.get_human(conn, id=id)
    except NotFound:  # the human was deleted: the session ends
        return None


# --- presence and doorbells -----------------------------------------------------------------


def attached(
    conn: Connection[Any], *, endpoint_ids: Sequence[UUID]
) -> dict[UUID, list[AttachedAgent]]:
    """Agents attached to each endpoint, by the doorbells' own presence window (the same
    definition decides whether a ring goes to a stream or to the notify hook)."""
    found: dict[UUID, list[AttachedAgent]] = defaultdict(list)
    stale = doorbells.attached_window().total_seconds()
    rows = store.attached_agents(conn, endpoint_ids=endpoint_ids, stale_seconds=stale)
    for row in rows:
        found[row.endpoint_id].append(row)
    return dict(found)


def last_rings(
    conn: Connection[Any], *, endpoint_ids: Sequence[UUID]
) -> dict[tuple[UUID, str], Ring]:
    """The newest doorbell of each queue of the endpoints, by (endpoint id, queue)."""
    return {(r.endpoint_id, r.queue): r for r in store.last_rings(conn, endpoint_ids=endpoint_ids)}


def claimants(
    conn: Connection[Any], *, todos: Sequence[Todo], endpoint: Endpoint
) -> dict[UUID, str]:
    """Who holds each claimed todo: the agent's endpoint, or the human's name."""
    humans = store.human_names(
        conn, ids=sorted({t.claimed_by_human_id for t in todos if t.claimed_by_human_id})
    )
    names: dict[UUID, str] = {}
    for todo in todos:
        if todo.claimed_by_human_id is not None:
            names[todo.id] = humans.get(todo.claimed_by_human_id, "a human")
        elif todo.claimed_by_endpoint_id is not None:
            names[todo.id] = f"agent {endpoint.slug}"
    return names


# --- time, in zones -------------------------------------------------------------------------


def zone_or_utc(name: str | None) -> str:
    """``name`` when the embedded tzdata knows it, else ``UTC`` (the viewer's zone default)."""
    if not name:
        return "UTC"
    try:
        windows.load_zone(name)
    except windows.UnknownZone:
        return "UTC"
    return name


def local(at: datetime, zone: str) -> str:
    """``Tue 1 Dec 00:00 PST``: an instant on the wall clock of ``zone`` (embedded tzdata)."""
    wall = at.astimezone(windows.load_zone(zone))
    return f"{wall:%a} {wall.day} {wall:%b %H:%M} {wall.tzname()}"


def short(at: datetime, zone: str, *, like: datetime | None = None, like_zone: str = "UTC") -> str:
    """``08:00 UTC``, or with its date when that differs from ``like``'s date in its zone."""
    wall = at.astimezone(windows.load_zone(zone))
    if like is not None and like.astimezone(windows.load_zone(like_zone)).date() == wall.date():
        return f"{wall:%H:%M} {wall.tzname()}"
    return f"{wall:%a} {wall.day} {wall:%b %H:%M} {wall.tzname()}"


def in_zones(at: datetime, policy_zone: str, viewer_zone: str) -> str:
    """``Tue 1 Dec 00:00 PST (08:00 UTC)``: the policy's wall clock, then the viewer's."""
    first = local(at, policy_zone)
    if viewer_zone == policy_zone:
        return first
    return f"{first} ({short(at, viewer_zone, like=at, like_zone=policy_zone)})"


# --- the budget in words --------------------------------------------------------------------


def _window_words(window: windows.Window) -> str:
    if window.period == "hour":
        return f"hour from :{window.start[3:]} {window.tz}"
    if window.period == "week":
        return f"week from {window.weekday} {window.start} {window.tz}"
    return f"day from {window.start} {window.tz}"


def policy_summary(policy: Policy, *, now: datetime, viewer_zone: str = "UTC") -> str:
    """One line a person reads: ``200 claims per day from 00:00 America/Los_Angeles · at most
    3 in flight · resets Tue 1 Dec 00:00 PST (08:00 UTC)``."""
    if policy.max_in_flight == 0 or policy.max_claims_per_window == 0:
        return "Paused: a limit of 0 admits nothing until it is raised or cleared"
    parts: list[str] = []
    window = policy.window
    if policy.max_claims_per_window is not None and window is not None:
        parts.append(f"{policy.max_claims_per_window} claims per {_window_words(window)}")
    if policy.max_in_flight is not None:
        parts.append(f"at most {policy.max_in_flight} in flight")
    if window is not None:
        try:
            resets = windows.next_boundary(window, now)
        except windows.UnknownZone:
            parts.append(f"zone {window.tz} is unknown to the embedded tzdata")
        else:
            parts.append(f"resets {in_zones(resets, window.tz, viewer_zone)}")
    return " · ".join(parts)


@dataclass(frozen=True)
class DrainEstimate:
    """When the current backlog will have been admitted, assuming one claim each.

    ``kind``: ``empty`` (no backlog), ``now`` (fits the current window's remainder),
    ``window`` (admitted in the window ``[start, end)``, ``windows`` rollovers away),
    ``far`` (more than MAX_DRAIN_WINDOWS windows: after ``start``), ``paused``,
    ``unbounded`` (no window limit: only the in-flight cap paces it), ``unavailable``.
    """

    kind: str
    backlog: int
    windows: int = 0
    start: datetime | None = None
    end: datetime | None = None


def drain_estimate(policy: Policy, *, backlog: int, used: int, now: datetime) -> DrainEstimate:
    """Walk the windows forward from ``now``: each admits up to the limit (this one only its
    remainder), until the backlog is spent."""
    if backlog <= 0:
        return DrainEstimate("empty", 0)
    if policy.max_in_flight == 0 or policy.max_claims_per_window == 0:
        return DrainEstimate("paused", backlog)
    limit, window = policy.max_claims_per_window, policy.window
    if limit is None or window is None:
        return DrainEstimate("unbounded", backlog)
    try:
        start, end = windows.window_start(window, now), windows.next_boundary(window, now)
    except windows.UnknownZone:
        return DrainEstimate("unavailable", backlog)
    left, hops = backlog - max(limit - used, 0), 0
    while left > 0:
        if hops == MAX_DRAIN_WINDOWS:
            return DrainEstimate("far", backlog, hops, end, None)
        start, end = end, windows.next_boundary(window, end)
        left, hops = left - limit, hops + 1
    return DrainEstimate("window" if hops else "now", backlog, hops, start, end)


# --- the audit, readable --------------------------------------------------------------------


@dataclass(frozen=True)
class FieldChange:
    label: str
    before: str
    after: str


@dataclass(frozen=True)
class AuditLine:
    at: datetime
    who: str
    action: str
    changes: list[FieldChange]


def _flat(policy: dict[str, Any] | None) -> dict[str, Any]:
    if policy is None:
        return {}
    window = policy.get("window") or {}
    return {
        "max_in_flight": policy.get("max_in_flight"),
        "max_claims_per_window": policy.get("max_claims_per_window"),
        "period": window.get("period"),
        "tz": window.get("tz"),
        "start": window.get("start"),
        "weekday": window.get("weekday"),
    }


def _shown(value: Any) -> str:
    return "—" if value is None else str(value)


def audit_lines(conn: Connection[Any], *, endpoint_id: UUID, queue: str) -> list[AuditLine]:
    """A queue's policy audit, newest first: who did what, as a before → after field diff."""
    return [_line(entry) for entry in store.audit_page(conn, endpoint_id=endpoint_id, queue=queue)]


def _line(entry: AuditEntry) -> AuditLine:
    human = f"{entry.human_name} <{entry.human_email}>"
    who = f"agent {entry.agent_endpoint} on behalf of {human}" if entry.agent_endpoint else human
    before, after = _flat(entry.before), _flat(entry.after)
    changes = [
        FieldChange(label, _shown(before.get(name)), _shown(after.get(name)))
        for name, label in POLICY_FIELDS
        if before.get(name) != after.get(name)
    ]
    return AuditLine(entry.at, who, entry.action, changes)


def now_utc() -> datetime:
    return datetime.now(UTC)


def status_changes_at(status: QueueStatus | None) -> datetime | None:
    """When a queue's derived status next changes with no write (a window rolls over, a lease
    lapses): a live page re-renders its header then (the reopen)."""
    if status is None:
        return None
    verdict = status.verdict
    times = [t for t in (verdict.window_resets_at, verdict.next_eligible_at) if t is not None]
    return min(times) if times else None


# --- pages ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueuePage:
    """Everything a queue page shows: header (counts, budget strip, last ring) and cards."""

    endpoint: Endpoint
    queue: str
    summary: QueueSummary | None
    status: QueueStatus | None
    todos: Page[TodoView]
    claimants: dict[UUID, str]
    ring: Ring | None
    now: datetime


def queue_page(
    conn: Connection[Any], *, human: Human, key: str, queue: str, after: str | None = None
) -> QueuePage:
    """A queue of one of the human's endpoints; raises NotFound (foreign or unknown endpoint),
    Invalid for a bad cursor."""
    endpoint = operator.managed_endpoint(conn, human=human, key=key)
    summaries = operator_store.queue_summaries(conn, endpoint_ids=[endpoint.id], queue=queue)
    statuses = admission.queue_statuses(conn, endpoint_ids=[endpoint.id], queues=[queue])
    todos = operator.list_todos(
        conn, human=human, endpoint=endpoint.slug, queue=queue, after=after, limit=50
    )
    rings = last_rings(conn, endpoint_ids=[endpoint.id])
    return QueuePage(
        endpoint,
        queue,
        summaries[0] if summaries else None,
        statuses[0] if statuses else None,
        todos,
        claimants(conn, todos=[view.todo for view in todos.items], endpoint=endpoint),
        rings.get((endpoint.id, queue)),
        now_utc(),
    )


@dataclass(frozen=True)
class EndpointCard:
    endpoint: Endpoint
    queues: list[QueueView]
    grants: list[Grant]
    attached: list[AttachedAgent]
    rings: dict[str, Ring]


def endpoint_card(conn: Connection[Any], *, human: Human, key: str) -> EndpointCard:
    """An endpoint with its queues, grants, attached agents and last doorbells; raises
    NotFound (foreign or unknown)."""
    detail = operator.endpoint_detail(conn, human=human, key=key)
    found = detail.endpoint
    return EndpointCard(
        found,
        operator.queues(conn, human=human, endpoint=found.slug),
        detail.grants,
        attached(conn, endpoint_ids=[found.id]).get(found.id, []),
        {q: r for (_, q), r in last_rings(conn, endpoint_ids=[found.id]).items()},
    )


@dataclass(frozen=True)
class Overview:
    endpoints: list[Endpoint]
    queues: dict[UUID, list[QueueView]]
    attached: dict[UUID, list[AttachedAgent]]


def overview(conn: Connection[Any], *, human: Human) -> Overview:
    """The human's endpoints (every one for an admin), their queues and attached agents."""
    endpoints = accounts_store.list_endpoints(
        conn, owner_human_id=None if human.is_admin else human.id
    )
    by_endpoint: dict[UUID, list[QueueView]] = defaultdict(list)
    for view in operator.queues(conn, human=human):
        by_endpoint[view.summary.endpoint_id].append(view)
    ids = [e.id for e in endpoints]
    return Overview(
        endpoints,
        dict(by_endpoint),
        attached(conn, endpoint_ids=ids),
    )


@dataclass(frozen=True)
class BudgetPage:
    endpoint: Endpoint
    queue: str
    record: PolicyRecord | None
    status: QueueStatus | None
    backlog: int
    now: datetime


def budget_page(conn: Connection[Any], *, human: Human, key: str, queue: str) -> BudgetPage:
    """A queue's policy (or none), its status and backlog; raises NotFound for the endpoint."""
    endpoint = operator.managed_endpoint(conn, human=human, key=key)
    summaries = operator_store.queue_summaries(conn, endpoint_ids=[endpoint.id], queue=queue)
    statuses = admission.queue_statuses(conn, endpoint_ids=[endpoint.id], queues=[queue])
    backlog = summaries[0].pending + summaries[0].retry_wait if summaries else 0
    return BudgetPage(
        endpoint,
        queue,
        operator_store.policy_get(conn, endpoint_id=endpoint.id, queue=queue),
        statuses[0] if statuses else None,
        backlog,
        now_utc(),
    )


def vend_agent(
    conn: Connection[Any],
    *,
    human: Human,
    slug: str,
    display_name: str,
    verbs: Sequence[str],
    queues: Sequence[str] | None,
) -> GrantView:
    """The wizard's grant: on the human's endpoint ``slug``, created first when it does not
    exist; raises Invalid naming the field (a slug someone else holds is ``endpoint``)."""
    try:
        operator.managed_endpoint(conn, human=human, key=slug)
    except NotFound:
        try:
            operator.create_endpoint(
                conn, human=human, data={"slug": slug, "display_name": display_name}
            )
        except Conflict:
            raise Invalid({"endpoint": ["this endpoint name is taken"]}) from None
        except Invalid as error:
            raise Invalid({"endpoint": _messages(error)}) from None
    return operator.create_grant(conn, human=human, key=slug, verbs=verbs, queues=queues)


def check_agent(conn: Connection[Any], *, human: Human, slug: str) -> bool:
    """Whether the wizard would create the endpoint (True) or add to the human's (False);
    raises Invalid for a bad or foreign name."""
    try:
        operator.managed_endpoint(conn, human=human, key=slug)
        return False
    except NotFound:
        pass
    if not re.fullmatch(SLUG_PATTERN, slug):
        raise Invalid({"endpoint": [f"must match {SLUG_PATTERN}"]})
    try:
        accounts_store.get_endpoint(conn, key=slug)
    except NotFound:
        return True
    raise Invalid({"endpoint": ["this endpoint name is taken"]})


def _messages(error: Invalid) -> list[str]:
    return [
        str(m)
        for texts in error.fields.values()
        for m in (texts if isinstance(texts, list) else [texts])
    ]
