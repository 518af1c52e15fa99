"""Todo operations for agents and operators: validation, scoping, then the store.

Every function takes an open transaction's connection; the caller commits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from psycopg import Connection

from switchboard import doorbells, metrics
from switchboard.admission import service as admission
from switchboard.admission import windows
from switchboard.admission.service import DeferredQueue, Headroom, Verdict
from switchboard.admission.windows import Window
from switchboard.db import Database
from switchboard.errors import AdmissionUnavailable, Deferred, NotFound
from switchboard.models import Actor, Claim, Human, Todo
from switchboard.schemas import NewTodoSchema, load
from switchboard.store import accounts, todos
from switchboard.store import admission as admission_store
from switchboard.store.doorbells import CREATE
from switchboard.store.todos import Candidate

__all__ = ["Claimed", "DeferredQueue", "Headroom", "Idle", "TodoDefaults"]

_NEW_TODO = NewTodoSchema()


@dataclass(frozen=True)
class TodoDefaults:
    """Configured defaults applied when a new todo does not say."""

    lease_seconds: int = 300
    max_attempts: int = 5


def create(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    data: Any,
    actor: Actor,
    defaults: TodoDefaults,
    now: datetime | None = None,
) -> Todo:
    """Validate and insert a pending todo; raises Invalid naming the bad field."""
    fields = load(_NEW_TODO, data)
    todo = todos.create(
        conn,
        endpoint_id=endpoint_id,
        queue=fields["queue"],
        title=fields["title"],
        body=fields["body"],
        payload=fields["payload"],
        max_attempts=fields["max_attempts"] or defaults.max_attempts,
        lease_seconds=fields["lease_seconds"] or defaults.lease_seconds,
        created_by_human_id=actor.human_id,
        created_by_endpoint_id=actor.endpoint_id,
        actor=actor.label,
        now=now,
    )
    doorbells.owe(conn, endpoint_id=endpoint_id, queue=todo.queue, cause=CREATE, now=now)
    return todo


def drainable_queues(
    granted: Sequence[str] | None, asked: Sequence[str] | None
) -> list[str] | None:
    """The queues a claim may draw from: the asked subset of the granted ones (None: all)."""
    if asked is None:
        return None if granted is None else list(granted)
    if granted is None:
        return list(asked)
    return [queue for queue in asked if queue in granted]


@dataclass(frozen=True)
class Claimed:
    """A committed claim; ``headroom`` is set when the queue has an admission policy."""

    claim: Claim
    headroom: Headroom | None


@dataclass(frozen=True)
class Idle:
    """Nothing to claim now; ``deferred`` lists queues with waiting work held back (R-DEFER)."""

    deferred: list[DeferredQueue]


@dataclass(frozen=True)
class _Refused:
    queue: str
    verdict: Verdict


_HintKey = tuple[UUID, tuple[str, ...] | None]
_NO_POLICY = "none"
# A window assumption the gate found stale (redefined policy, or a clock across a boundary)
# makes claim_next re-read the policies with the database clock; this many times at most.
_STALE_RETRIES = 3
_STALE = ("policy_changed", "window_moved")
_EVER = (datetime.min.replace(tzinfo=UTC), datetime.max.replace(tzinfo=UTC))


def _python_now() -> datetime:
    """The instant windows are placed at when claim_next runs on a cached pre-read. The gate
    checks it against the database clock (window_moved), so skew costs a retry, never a
    wrong charge."""
    return datetime.now(UTC)


class _Budgeted:
    """The policies of a queue set as a pre-read saw them (queue → window of its window limit,
    None without one), and the gate's parameters for the windows around the last instant asked,
    reused until an instant falls outside them."""

    def __init__(self, policies: dict[str, Window | None]) -> None:
        self.policies = policies
        self._placed: tuple[datetime, datetime, todos.Budgets] | None = None

    def at(self, t: datetime) -> todos.Budgets:
        placed = self._placed
        if placed is None or not placed[0] <= t < placed[1]:
            placed = self._placed = _place(self.policies, t)
        return placed[2]


def _place(
    policies: dict[str, Window | None], t: datetime
) -> tuple[datetime, datetime, todos.Budgets]:
    """The gate's parameters at ``t`` and the span [from, until) in which they hold. A queue in
    a zone the embedded tzdata lacks is left out: the pre-read refused it already."""
    budgets = todos.Budgets([], [], [], [], [], [], [])
    valid_from, valid_until = _EVER
    for queue, window in policies.items():
        start = end = None
        if window is not None:
            try:
                start = windows.window_start(window, t)
                end = windows.next_boundary(window, t)
            except windows.UnknownZone:
                continue
            valid_from, valid_until = max(valid_from, start), min(valid_until, end)
        budgets.queues.append(queue)
        budgets.periods.append(window.period if window else None)
        budgets.tzs.append(window.tz if window else None)
        budgets.starts.append(window.start if window else None)
        budgets.weekdays.append(window.weekday if window else None)
        budgets.window_starts.append(start)
        budgets.window_ends.append(end)
    return valid_from, valid_until, budgets


_Hint = _Budgeted | str


class _PreReadHints:
    """What claim_next's pre-read found a moment ago, per (endpoint, queue set): ``"none"`` (no
    policy: the claim can run as today's statement) or the policies, none of them exhausted
    (nothing to exclude up front; the claim runs through the gate).

    Only a hint. Correctness never depends on it — the claim statement locks and checks the
    candidate queue's policy itself, refuses when the policy is not the one assumed here, and
    any refusal drops the hint — it only spares the hot path a round trip per claim.
    """

    def __init__(self, ttl_seconds: float) -> None:
        self.ttl = ttl_seconds
        self._hints: dict[_HintKey, tuple[float, _Hint]] = {}
        self._lock = threading.Lock()

    def get(self, key: _HintKey) -> _Hint | None:
        with self._lock:
            until, hint = self._hints.get(key, (0.0, None))
        return hint if until > time.monotonic() else None

    def remember(self, key: _HintKey, hint: _Hint | None) -> None:
        with self._lock:
            if hint is None:
                self._hints.pop(key, None)
                return
            if len(self._hints) > 10_000:
                self._hints.clear()
            self._hints[key] = (time.monotonic() + self.ttl, hint)


HINT_SECONDS = 1.0  # how long a pre-read is reused by claim_next
_HINTS = _PreReadHints(ttl_seconds=HINT_SECONDS)


@metrics.counts_claims
def claim_next(
    db: Database,
    *,
    endpoint_id: UUID,
    granted_queues: Sequence[str] | None,
    asked_queues: Sequence[str] | None,
    actor: Actor,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Claimed | Idle:
    """Claim the oldest claimable todo of the agent's queues that admission lets through.

    Queues found exhausted by an unlocked pre-read are excluded up front; a queue refused
    under its policy lock is excluded and the next candidate tried, at most once per queue.
    Each try is one statement (R-ZERO without policies; the gate with them).
    """
    queues = drainable_queues(granted_queues, asked_queues)
    if queues == []:
        return Idle([])
    common: dict[str, Any] = {
        "endpoint_id": endpoint_id,
        "queues": queues,
        "claimant_endpoint_id": actor.endpoint_id,
        "claimant_human_id": actor.human_id,
        "actor": actor.label,
        "lease_seconds": lease_seconds,
        "now": now,
    }
    key = (endpoint_id, tuple(queues) if queues is not None else None)
    hint = _HINTS.get(key)
    if hint == _NO_POLICY:
        with db.statement() as conn:  # R-ZERO: today's one statement, one round trip
            found = todos.claim_next(conn, **common)
        if found is None or isinstance(found, Claim):
            return Claimed(found, None) if found else Idle([])
        hint = None  # A policy appeared; the statement claimed nothing and its locks are gone.
    refused: dict[str, Verdict] = {}
    at = now  # where windows are placed: pinned, the pre-read's database clock, else Python's
    stale = 0
    # Over several queues, first pass over those whose policy another claim holds (the next
    # queue instead of a wait); if that finds nothing, wait (R-ADMIT order is kept per queue).
    skip_busy = queues is None or len(queues) > 1
    # Bounded: each pass returns, refuses a queue not yet excluded, counts a stale try, or
    # stops skipping busy queues.
    while True:
        if not isinstance(hint, _Budgeted):
            hint, exhausted, read_at = _pre_read(db, key, queues, now)
            refused.update(exhausted)
            at = now or read_at
        with db.statement() as conn:
            result = todos.claim_next_budgeted(
                conn,
                budgets=hint.at(at or _python_now()),
                excluded=sorted(refused),
                skip_busy=skip_busy,
                **common,
            )
        if result is None:
            if skip_busy:  # the free queues had nothing: try again, waiting for busy ones
                skip_busy = False
                continue
            return Idle(_deferred(db, endpoint_id, refused, now))
        window = hint.policies.get(result.queue)
        outcome = _admission_outcome(window, result)
        if isinstance(outcome, Claimed):
            return outcome
        _HINTS.remember(key, None)
        if isinstance(outcome, _Refused):
            refused[outcome.queue] = outcome.verdict
            continue
        stale += 1
        if stale > _STALE_RETRIES:  # the policy keeps changing under us: fail closed
            refused[result.queue] = _unavailable(window, result)
        hint = None


def _pre_read(
    db: Database, key: _HintKey, queues: Sequence[str] | None, now: datetime | None
) -> tuple[_Budgeted, dict[str, Verdict], datetime | None]:
    """The policies of the queues, the queues to exclude up front (unlocked read) and the
    database clock of the read; notes the hint."""
    with db.statement() as conn:
        states = admission_store.states(conn, endpoint_ids=[key[0]], queues=queues, now=now)
    refused = {s.queue: v for s in states if (v := admission.evaluate(s, for_claim=True)).deferred}
    budgeted = _Budgeted({s.queue: admission.policy_of(s).window for s in states})
    _HINTS.remember(key, _NO_POLICY if not states else None if refused else budgeted)
    return budgeted, refused, states[0].now if states else None


def _deferred(
    db: Database, endpoint_id: UUID, refused: dict[str, Verdict], now: datetime | None
) -> list[DeferredQueue]:
    """The deferred list of an idle claim_next (a read only when queues were refused)."""
    if not refused:
        return []
    with db.statement() as conn:
        deferred = admission.deferred_items(
            conn, endpoint_id=endpoint_id, verdicts=refused, now=now
        )
        # The caller now waits for these queues: their gates ring when they open (R-REOPEN).
        doorbells.waiting(conn, endpoint_id=endpoint_id, deferred=deferred, now=now)
    return deferred


def _unavailable(window: Window | None, result: todos.Admission) -> Verdict:
    policy = admission.Policy(result.max_in_flight, result.max_claims_per_window, window)
    return Verdict(policy, admission.UNAVAILABLE, None, None, None, None, None, None, False)


@metrics.counts_claims
def claim(
    db: Database,
    *,
    id: UUID,
    endpoint_id: UUID,
    granted_queues: Sequence[str] | None,
    actor: Actor,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Claimed:
    """An agent claims one todo by id; raises NotFound, Conflict, Deferred or
    AdmissionUnavailable (nothing claimed, nothing charged)."""
    while True:  # again only if a window is redefined between candidate and lock
        with db.pipelined() as conn:
            admitted = _claim_by_id(
                conn,
                id=id,
                endpoint_id=endpoint_id,
                queues=granted_queues,
                actor=actor,
                lease_seconds=lease_seconds,
                now=now,
            )
        if (outcome := admitted()) is not None:
            if isinstance(outcome, _Refused):
                _agent_waits(db, endpoint_id, outcome, now)
            return _claimed_or_raise(outcome)


def _agent_waits(db: Database, endpoint_id: UUID, refused: _Refused, now: datetime | None) -> None:
    """A refused agent now waits for the queue: its gate rings when it opens (R-REOPEN)."""
    reason = refused.verdict.reason or admission.UNAVAILABLE
    item = DeferredQueue(refused.queue, reason, 1, refused.verdict.next_eligible_at, False)
    with db.statement() as conn:
        doorbells.waiting(conn, endpoint_id=endpoint_id, deferred=[item], now=now)


@metrics.counts_claims
def claim_operator_owned(
    db: Database,
    *,
    id: UUID,
    human: Human,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Claimed:
    """The board's claim, by a human who owns the endpoint (or an admin); admission applies.
    Raises as :func:`claim` does."""
    while True:  # again only if a window is redefined between candidate and lock
        with db.pipelined() as conn:
            todo = operated_todo(conn, id=id, human=human)
            admitted = _claim_by_id(
                conn,
                id=id,
                endpoint_id=todo.endpoint_id,
                queues=None,
                actor=Actor(human_id=human.id),
                lease_seconds=lease_seconds,
                now=now,
            )
        if (outcome := admitted()) is not None:
            return _claimed_or_raise(outcome)


def _claim_by_id(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID,
    queues: Sequence[str] | None,
    actor: Actor,
    lease_seconds: int | None,
    now: datetime | None,
) -> Callable[[], Claimed | _Refused | None]:
    found = todos.claim_todo(
        conn,
        id=id,
        endpoint_id=endpoint_id,
        queues=queues,
        claimant_endpoint_id=actor.endpoint_id,
        claimant_human_id=actor.human_id,
        actor=actor.label,
        lease_seconds=lease_seconds,
        now=now,
    )
    return _admit(conn, found, actor=actor, lease_seconds=lease_seconds)


def _admit(
    conn: Connection[Any], found: Claim | Candidate, *, actor: Actor, lease_seconds: int | None
) -> Callable[[], Claimed | _Refused | None]:
    """Finish a claim by id; the returned function gives the outcome (read it after COMMIT).
    No policy: claimed already. A budgeted candidate: admitted through the gate at the
    candidate's clock, claimed and charged in one statement, or refused with nothing
    written."""
    if isinstance(found, Claim):
        claimed = Claimed(found, None)
        return lambda: claimed
    policy = admission.policy_of(found.policy)
    window = policy.window
    budgets = _place({found.queue: window}, found.now)[2]
    if found.queue not in budgets.queues:  # a zone the embedded tzdata lacks: fail closed
        verdict = admission.decide(
            policy, now=found.now, in_flight=None, used_in=(None, None), earliest_lease_expiry=None
        )
        refused = _Refused(found.queue, verdict)
        return lambda: refused
    result = todos.claim_admitted(
        conn,
        candidate=found,
        budgets=budgets,
        claimant_endpoint_id=actor.endpoint_id,
        claimant_human_id=actor.human_id,
        actor=actor.label,
        lease_seconds=lease_seconds,
    )
    return lambda: _admission_outcome(window, result())


def _admission_outcome(window: Window | None, result: todos.Admission) -> Claimed | _Refused | None:
    """The claim with its headroom, the refusal with the verdict read under the lock, or None
    when the gate found the caller's window assumption stale (start over)."""
    if result.refusal in _STALE:
        return None
    if not result.budgeted:
        assert result.claim is not None  # no policy: the gate admits
        return Claimed(result.claim, None)
    policy = admission.Policy(result.max_in_flight, result.max_claims_per_window, window)
    if result.claim is None:
        refusal = admission.decide(
            policy,
            now=result.now,
            in_flight=result.in_flight,
            used_in=(result.window_start, result.used_before),
            earliest_lease_expiry=result.earliest_lease_expiry,
        )
        return _Refused(result.queue, refusal)
    # Headroom after the claim, from what the gate read under the lock; the window's end was
    # placed with its start, so no window arithmetic runs here.
    used, limit = result.used_after, result.max_claims_per_window
    return Claimed(
        result.claim,
        Headroom(
            result.max_in_flight,
            None if result.in_flight is None else result.in_flight + 1,
            limit,
            used,
            max(limit - used, 0) if limit is not None and used is not None else None,
            result.window_end,
        ),
    )


def _claimed_or_raise(outcome: Claimed | _Refused) -> Claimed:
    if isinstance(outcome, Claimed):
        return outcome
    verdict = outcome.verdict
    details = DeferredQueue(
        outcome.queue,
        verdict.reason or admission.UNAVAILABLE,
        1,
        verdict.next_eligible_at,
        verdict.exact,
    ).as_json()
    if verdict.reason == admission.UNAVAILABLE:
        raise AdmissionUnavailable(
            f"admission for queue {outcome.queue!r} cannot be evaluated (unknown zone)",
            details=details,
        )
    raise Deferred(f"queue {outcome.queue!r} is deferred: {verdict.reason}", details=details)


def get(
    conn: Connection[Any], *, id: UUID, endpoint_id: UUID, granted_queues: Sequence[str] | None
) -> Todo:
    """One of the agent's todos; raises NotFound outside its endpoint or granted queues."""
    todo = todos.get(conn, id=id, endpoint_id=endpoint_id)
    if granted_queues is not None and todo.queue not in granted_queues:
        raise NotFound(f"todo {id} not found")
    return todo


def list_(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    granted_queues: Sequence[str] | None,
    queue: str | None = None,
    state: str | None = None,
    after: tuple[datetime, UUID] | None = None,
    limit: int = 50,
) -> list[Todo]:
    """The agent's todos, newest first; a queue outside its grant lists nothing."""
    if queue is not None and granted_queues is not None and queue not in granted_queues:
        return []
    return todos.list_(
        conn,
        endpoint_ids=[endpoint_id],
        queue=queue,
        state=state,
        queues=granted_queues,
        after=after,
        limit=limit,
    )


def heartbeat(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID,
    attempt: int,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Todo:
    """Extend the current claim's lease; raises NotFound, or Conflict for a stale attempt."""
    return todos.heartbeat(
        conn, id=id, endpoint_id=endpoint_id, attempt=attempt, lease_seconds=lease_seconds, now=now
    )


def complete(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID | None,
    attempt: int,
    actor: Actor,
    result: Any = None,
    now: datetime | None = None,
) -> Todo:
    """Finish the current claim as done; raises NotFound, or Conflict for a stale attempt."""
    return _finish(
        conn,
        action="complete",
        id=id,
        endpoint_id=endpoint_id,
        attempt=attempt,
        actor=actor.label,
        result=result,
        now=now,
    )


def fail(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID | None,
    attempt: int,
    actor: Actor,
    error: str,
    retry: bool = True,
    now: datetime | None = None,
) -> Todo:
    """Fail the current claim (retry_wait with backoff while attempts remain and retry is
    true, else failed); raises NotFound, or Conflict for a stale attempt."""
    return _finish(
        conn,
        action="fail",
        id=id,
        endpoint_id=endpoint_id,
        attempt=attempt,
        actor=actor.label,
        error=error,
        retry=retry,
        now=now,
    )


def release(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID | None,
    attempt: int,
    actor: Actor,
    now: datetime | None = None,
) -> Todo:
    """Give the current claim back (pending); the charge stays. Raises NotFound or Conflict."""
    return _finish(
        conn,
        action="release",
        id=id,
        endpoint_id=endpoint_id,
        attempt=attempt,
        actor=actor.label,
        now=now,
    )


def _finish(conn: Connection[Any], *, now: datetime | None, **fields: Any) -> Todo:
    """End the current claim (the store's fenced finish), then, in the same transaction, its
    doorbells: a freed slot reopens a deferred queue, a released todo rings (R-REOPEN, R-BELL)."""
    todo = todos.finish(conn, now=now, **fields)
    doorbells.after_finish(conn, todo=todo, now=now)
    return todo


def operated_todo(conn: Connection[Any], *, id: UUID, human: Human) -> Todo:
    """A todo the human may operate on (owner of its endpoint, or admin); else NotFound."""
    todo = todos.get(conn, id=id)
    if not human.is_admin:
        endpoint = accounts.get_endpoint(conn, key=str(todo.endpoint_id))
        if endpoint.owner_human_id != human.id:
            raise NotFound(f"todo {id} not found")
    return todo
