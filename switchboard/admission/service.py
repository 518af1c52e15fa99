"""Admission control (SPEC §4): policies, derived status, and the decisions of the claim path.

Functions take a connection and ``now``; nothing here knows about Flask. Window arithmetic is
delegated to :mod:`switchboard.admission.windows`.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from marshmallow import Schema, ValidationError, fields, validate, validates_schema
from psycopg import Connection

from switchboard.admission import windows
from switchboard.admission.windows import Window
from switchboard.errors import Invalid, NotFound
from switchboard.models import Endpoint, Todo
from switchboard.schemas import QUEUE_PATTERN, FullMatch, load
from switchboard.store import admission as store
from switchboard.store.todos import PolicyRow

PAUSED = "paused"
WINDOW_EXHAUSTED = "window_exhausted"
IN_FLIGHT_FULL = "in_flight_full"
UNAVAILABLE = "admission_unavailable"


@dataclass(frozen=True)
class Policy:
    """The wire shape of a policy: limits and the window of the window limit."""

    max_in_flight: int | None
    max_claims_per_window: int | None
    window: Window | None

    def as_json(self) -> dict[str, Any]:
        window = None
        if self.window is not None:
            window = {
                "period": self.window.period,
                "tz": self.window.tz,
                "start": self.window.start,
                "weekday": self.window.weekday,
            }
        return {
            "max_in_flight": self.max_in_flight,
            "max_claims_per_window": self.max_claims_per_window,
            "window": window,
        }


@dataclass(frozen=True)
class Verdict:
    """A queue's admission status at one instant (R-DERIVED)."""

    policy: Policy
    reason: str | None  # None: open
    in_flight: int | None
    used: int | None
    remaining: int | None
    window_start: datetime | None
    window_resets_at: datetime | None
    next_eligible_at: datetime | None
    exact: bool

    @property
    def deferred(self) -> bool:
        return self.reason is not None


@dataclass(frozen=True)
class QueueStatus:
    endpoint_id: UUID
    queue: str
    verdict: Verdict
    pending: int


@dataclass(frozen=True)
class Headroom:
    """What a budgeted queue has left after a claim (R-HEADROOM)."""

    max_in_flight: int | None
    in_flight: int | None
    max_claims_per_window: int | None
    used: int | None
    remaining: int | None
    window_resets_at: datetime | None


@dataclass(frozen=True)
class DeferredQueue:
    """One queue left out of a claim, why, and when it becomes eligible (R-DEFER)."""

    queue: str
    reason: str
    pending: int
    next_eligible_at: datetime | None
    exact: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "reason": self.reason,
            "pending": self.pending,
            "next_eligible_at": self.next_eligible_at,
            "exact": self.exact,
        }


@dataclass(frozen=True)
class TodoAdmission:
    deferred: bool
    reason: str | None = None
    next_eligible_at: datetime | None = None
    exact: bool | None = None


# --- policies --------------------------------------------------------------------------------


class WindowSchema(Schema):
    period = fields.String(required=True, validate=validate.OneOf(windows.PERIODS))
    tz = fields.String(required=True)
    start = fields.String(
        load_default="00:00", validate=FullMatch(r"([01][0-9]|2[0-3]):[0-5][0-9]")
    )
    weekday = fields.String(
        load_default=None, allow_none=True, validate=validate.OneOf(windows.WEEKDAYS)
    )

    @validates_schema
    def _check(self, data: dict[str, Any], **_: Any) -> None:
        try:
            windows.load_zone(data["tz"])
        except windows.UnknownZone:
            raise ValidationError("unknown IANA zone (embedded tzdata)", "tz") from None
        if data["period"] == "week" and data.get("weekday") is None:
            raise ValidationError("required for a week window", "weekday")
        if data["period"] != "week" and data.get("weekday") is not None:
            raise ValidationError("only a week window has a weekday", "weekday")


class PolicySchema(Schema):
    max_in_flight = fields.Integer(
        load_default=None, allow_none=True, strict=True, validate=validate.Range(min=0, max=10000)
    )
    max_claims_per_window = fields.Integer(
        load_default=None,
        allow_none=True,
        strict=True,
        validate=validate.Range(min=0, max=1_000_000),
    )
    window = fields.Nested(WindowSchema, load_default=None, allow_none=True)

    @validates_schema
    def _check(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("max_in_flight") is None and data.get("max_claims_per_window") is None:
            raise ValidationError("set max_in_flight, max_claims_per_window or both", "_schema")
        if data.get("max_claims_per_window") is not None and data.get("window") is None:
            raise ValidationError("a window limit needs a window", "window")
        if data.get("max_claims_per_window") is None and data.get("window") is not None:
            raise ValidationError("a window needs max_claims_per_window", "window")


_POLICY = PolicySchema()


def parse_policy(data: Any) -> Policy:
    """Validate a policy body; raises Invalid naming each bad field, nothing written."""
    loaded = load(_POLICY, data)
    window = loaded["window"]
    return Policy(
        max_in_flight=loaded["max_in_flight"],
        max_claims_per_window=loaded["max_claims_per_window"],
        window=Window(**window) if window is not None else None,
    )


def policy_of(row: PolicyRow | store.PolicyRecord | store.PolicyState) -> Policy:
    """The wire policy of a stored row."""
    window = None
    if row.window_period is not None and row.window_tz is not None:
        window = Window(
            row.window_period, row.window_tz, row.window_start or "00:00", row.window_weekday
        )
    return Policy(row.max_in_flight, row.max_claims_per_window, window)


def _columns(policy: Policy) -> dict[str, Any]:
    window = policy.window
    return {
        "max_in_flight": policy.max_in_flight,
        "max_claims_per_window": policy.max_claims_per_window,
        "window_period": window.period if window else None,
        "window_tz": window.tz if window else None,
        "window_start": window.start if window else None,
        "window_weekday": window.weekday if window else None,
    }


def _check_queue(queue: str) -> None:
    if not isinstance(queue, str) or re.fullmatch(QUEUE_PATTERN, queue) is None:
        raise Invalid({"queue": [f"must match {QUEUE_PATTERN}"]})


def put_policy(
    conn: Connection[Any],
    *,
    endpoint: Endpoint,
    queue: str,
    data: Any,
    actor_human_id: UUID,
    actor_endpoint_id: UUID | None = None,
) -> Policy:
    """Create or fully replace a queue's policy, audited in the same transaction (R-AUDIT).

    Raises Invalid (nothing written). The policy id is kept, so usage survives a limit change;
    a new window definition changes the window keys (an audited reset).
    """
    _check_queue(queue)
    policy = parse_policy(data)
    before = store.get_for_update(conn, endpoint_id=endpoint.id, queue=queue)
    row = store.upsert(
        conn,
        endpoint_id=endpoint.id,
        queue=queue,
        fields=_columns(policy),
        actor_human_id=actor_human_id,
    )
    store.audit(
        conn,
        policy_id=row.id,
        endpoint_id=endpoint.id,
        queue=queue,
        actor_human_id=actor_human_id,
        actor_endpoint_id=actor_endpoint_id,
        action="create" if before is None else "update",
        before=policy_of(before).as_json() if before is not None else None,
        after=policy.as_json(),
    )
    return policy


def delete_policy(
    conn: Connection[Any],
    *,
    endpoint: Endpoint,
    queue: str,
    actor_human_id: UUID,
    actor_endpoint_id: UUID | None = None,
) -> Policy:
    """Remove a queue's policy (today's behaviour returns at once); audited. Raises NotFound."""
    row = store.delete(conn, endpoint_id=endpoint.id, queue=queue)
    if row is None:
        raise NotFound(f"no admission policy on queue {queue!r}")
    policy = policy_of(row)
    store.audit(
        conn,
        policy_id=row.id,
        endpoint_id=endpoint.id,
        queue=queue,
        actor_human_id=actor_human_id,
        actor_endpoint_id=actor_endpoint_id,
        action="delete",
        before=policy.as_json(),
        after=None,
    )
    return policy


# --- decisions -------------------------------------------------------------------------------


def decide(
    policy: Policy,
    *,
    now: datetime,
    in_flight: int | None,
    used_in: tuple[datetime | None, int | None],
    earliest_lease_expiry: datetime | None,
) -> Verdict:
    """The status of a budgeted queue at ``now``. ``used_in`` is (window start, used) of the
    newest counter at or before now; a zone the embedded tzdata lacks fails closed."""
    window_start = resets_at = None
    used = None
    if policy.window is not None:
        try:
            window_start = windows.window_start(policy.window, now)
            resets_at = windows.next_boundary(policy.window, now)
        except windows.UnknownZone:
            return Verdict(policy, UNAVAILABLE, in_flight, None, None, None, None, None, False)
        used = (used_in[1] or 0) if used_in[0] == window_start else 0
    cap, limit = policy.max_in_flight, policy.max_claims_per_window
    remaining = max(limit - used, 0) if limit is not None and used is not None else None
    reason, eligible, exact = _refusal(
        cap, limit, in_flight, used, resets_at, earliest_lease_expiry
    )
    return Verdict(
        policy, reason, in_flight, used, remaining, window_start, resets_at, eligible, exact
    )


def _refusal(
    cap: int | None,
    limit: int | None,
    in_flight: int | None,
    used: int | None,
    resets_at: datetime | None,
    earliest_lease_expiry: datetime | None,
) -> tuple[str | None, datetime | None, bool]:
    """(reason, next_eligible_at, exact); the order matches claim_admitted's SQL verdict."""
    if cap == 0 or limit == 0:
        return PAUSED, None, False
    full = cap is not None and in_flight is not None and in_flight >= cap
    if limit is not None and used is not None and used >= limit:
        if (
            full
            and earliest_lease_expiry is not None
            and resets_at is not None
            and earliest_lease_expiry > resets_at
        ):
            return WINDOW_EXHAUSTED, earliest_lease_expiry, False
        return WINDOW_EXHAUSTED, resets_at, not full
    if full:
        return IN_FLIGHT_FULL, earliest_lease_expiry, False
    return None, None, False


def evaluate(state: store.PolicyState, *, for_claim: bool = False) -> Verdict:
    """The verdict of an unlocked policy read. ``for_claim`` counts only claims with a live
    lease: claim_next's pre-read must not exclude a queue whose lapsed claims can be taken
    over (the locked check decides those exactly)."""
    return decide(
        policy_of(state),
        now=state.now,
        in_flight=state.live_in_flight if for_claim else state.in_flight,
        used_in=(state.latest_window_start, state.latest_used),
        earliest_lease_expiry=state.earliest_lease_expiry,
    )


def headroom(verdict: Verdict) -> Headroom:
    """Headroom to report after a claim, from the verdict computed with the claim counted."""
    policy = verdict.policy
    return Headroom(
        policy.max_in_flight,
        verdict.in_flight,
        policy.max_claims_per_window,
        verdict.used,
        verdict.remaining,
        verdict.window_resets_at,
    )


def deferred_items(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    verdicts: dict[str, Verdict],
    now: datetime | None,
) -> list[DeferredQueue]:
    """The deferred list of an idle claim_next: refused queues that have work waiting."""
    if not verdicts:
        return []
    waiting = store.waiting(conn, endpoint_id=endpoint_id, queues=sorted(verdicts), now=now)
    return [
        DeferredQueue(
            queue,
            verdict.reason or UNAVAILABLE,
            waiting[queue],
            verdict.next_eligible_at,
            verdict.exact,
        )
        for queue, verdict in sorted(verdicts.items())
        if waiting.get(queue)
    ]


# --- reads -----------------------------------------------------------------------------------


def queue_statuses(
    conn: Connection[Any],
    *,
    endpoint_ids: Sequence[UUID],
    queues: Sequence[str] | None = None,
    now: datetime | None = None,
) -> list[QueueStatus]:
    """Status of every policy over the endpoints' queues (None: all), with waiting counts."""
    states = store.states(
        conn, endpoint_ids=endpoint_ids, queues=queues, count_in_flight=True, now=now
    )
    by_endpoint: dict[UUID, list[str]] = defaultdict(list)
    for state in states:
        by_endpoint[state.endpoint_id].append(state.queue)
    waiting = {
        (endpoint_id, queue): count
        for endpoint_id, names in by_endpoint.items()
        for queue, count in store.waiting(
            conn, endpoint_id=endpoint_id, queues=names, now=now
        ).items()
    }
    return [
        QueueStatus(s.endpoint_id, s.queue, evaluate(s), waiting.get((s.endpoint_id, s.queue), 0))
        for s in states
    ]


def todo_admission(
    conn: Connection[Any], todos: Iterable[Todo], *, now: datetime | None = None
) -> dict[UUID, TodoAdmission]:
    """The admission block of each pending todo of a budgeted queue (R-DERIVED)."""
    pending = [todo for todo in todos if todo.state == "pending"]
    if not pending:
        return {}
    endpoint_ids = sorted({todo.endpoint_id for todo in pending})
    queues = sorted({todo.queue for todo in pending})
    verdicts = {
        (state.endpoint_id, state.queue): evaluate(state)
        for state in store.states(conn, endpoint_ids=endpoint_ids, queues=queues, now=now)
    }
    blocks: dict[UUID, TodoAdmission] = {}
    for todo in pending:
        verdict = verdicts.get((todo.endpoint_id, todo.queue))
        if verdict is None:
            continue
        blocks[todo.id] = (
            TodoAdmission(True, verdict.reason, verdict.next_eligible_at, verdict.exact)
            if verdict.deferred
            else TodoAdmission(False)
        )
    return blocks
