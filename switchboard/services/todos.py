"""Todo operations for agents and operators: validation, scoping, then the store.

Every function takes an open transaction's connection; the caller commits.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection

from switchboard import doorbells, metrics
from switchboard.admission import service as admission
from switchboard.admission.service import DeferredQueue, Headroom, Verdict
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


class _PreReadHints:
    """What claim_next's pre-read found a moment ago, per (endpoint, queue set): ``"none"`` (no
    policy: the claim can run as one autocommit statement) or ``"open"`` (policies, none of
    them exhausted: nothing to exclude up front).

    Only a hint. Correctness never depends on it — the claim statement locks and checks the
    candidate queue's policy itself, and a refusal under that lock drops the hint — it only
    spares the hot path a round trip per claim.
    """

    def __init__(self, ttl_seconds: float) -> None:
        self.ttl = ttl_seconds
        self._hints: dict[_HintKey, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def get(self, key: _HintKey) -> str | None:
        with self._lock:
            until, hint = self._hints.get(key, (0.0, ""))
        return hint if until > time.monotonic() else None

    def remember(self, key: _HintKey, hint: str | None) -> None:
        with self._lock:
            if hint is None:
                self._hints.pop(key, None)
                return
            if len(self._hints) > 10_000:
                self._hints.clear()
            self._hints[key] = (time.monotonic() + self.ttl, hint)


_HINTS = _PreReadHints(ttl_seconds=1.0)


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
    """
    queues = drainable_queues(granted_queues, asked_queues)
    if queues == []:
        return Idle([])
    claim = functools.partial(
        todos.claim_next,
        endpoint_id=endpoint_id,
        queues=queues,
        claimant_endpoint_id=actor.endpoint_id,
        claimant_human_id=actor.human_id,
        actor=actor.label,
        lease_seconds=lease_seconds,
        now=now,
    )
    key = (endpoint_id, tuple(queues) if queues is not None else None)
    hint = _HINTS.get(key)
    if hint == "none":
        with db.statement() as conn:  # R-ZERO: today's one statement, one round trip
            found = claim(conn)
        if found is None or isinstance(found, Claim):
            return Claimed(found, None) if found else Idle([])
        # A policy appeared; the statement claimed nothing and its locks are gone.
    refused: dict[str, Verdict] = {}
    if hint != "open":
        refused = _pre_read(db, key, queues, now)
    # Bounded: each pass returns, or refuses a queue not yet excluded (len(queues) at most).
    while True:
        with db.pipelined() as conn:
            found = claim(conn, excluded=sorted(refused))
            if found is None:
                deferred = admission.deferred_items(
                    conn, endpoint_id=endpoint_id, verdicts=refused, now=now
                )
                doorbells.waiting(conn, endpoint_id=endpoint_id, deferred=deferred, now=now)
                return Idle(deferred)
            admitted = _admit(conn, found, actor=actor, lease_seconds=lease_seconds)
        outcome = admitted()  # after COMMIT
        if isinstance(outcome, Claimed):
            return outcome
        _HINTS.remember(key, None)
        if outcome is None:  # the window was redefined meanwhile: read the policies again
            refused = _pre_read(db, key, queues, now)
            continue
        refused[outcome.queue] = outcome.verdict


def _pre_read(
    db: Database, key: _HintKey, queues: Sequence[str] | None, now: datetime | None
) -> dict[str, Verdict]:
    """The queues to exclude up front (unlocked read of their policies), noting the hint."""
    with db.statement() as conn:
        states = admission_store.states(conn, endpoint_ids=[key[0]], queues=queues, now=now)
    refused = {s.queue: v for s in states if (v := admission.evaluate(s, for_claim=True)).deferred}
    _HINTS.remember(key, "none" if not states else None if refused else "open")
    return refused


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
            return _claimed_or_raise(outcome)


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
    """Finish a claim; the returned function gives the outcome (read it after COMMIT). No
    policy: claimed already. A budgeted candidate: decided under its locks, then claimed and
    charged in one statement, or refused with nothing written."""
    if isinstance(found, Claim):
        claimed = Claimed(found, None)
        return lambda: claimed
    policy = admission.policy_of(found.policy)
    verdict = admission.decide(
        policy, now=found.now, in_flight=None, used_in=(None, None), earliest_lease_expiry=None
    )
    if verdict.reason == admission.UNAVAILABLE:
        refused = _Refused(found.queue, verdict)
        return lambda: refused
    result = todos.claim_admitted(
        conn,
        candidate=found,
        window_start=verdict.window_start,
        claimant_endpoint_id=actor.endpoint_id,
        claimant_human_id=actor.human_id,
        actor=actor.label,
        lease_seconds=lease_seconds,
        now=found.now,
    )
    return lambda: _admission_outcome(found, policy, verdict.window_start, result())


def _admission_outcome(
    found: Candidate, seen: admission.Policy, window_start: datetime | None, result: Any
) -> Claimed | _Refused | None:
    """The claim with its headroom, the refusal with the verdict read under the lock, or None
    when the policy's window was redefined since the candidate was found (start over)."""
    if result.refusal == "policy_changed":
        return None
    policy = admission.Policy(result.max_in_flight, result.max_claims_per_window, seen.window)
    if result.claim is None:
        refusal = admission.decide(
            policy,
            now=found.now,
            in_flight=result.in_flight,
            used_in=(window_start, result.used_before),
            earliest_lease_expiry=result.earliest_lease_expiry,
        )
        return _Refused(found.queue, refusal)
    after = admission.decide(
        policy,
        now=found.now,
        in_flight=None if result.in_flight is None else result.in_flight + 1,
        used_in=(window_start, result.used_after),
        earliest_lease_expiry=None,
    )
    return Claimed(result.claim, admission.headroom(after))


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
    return _finished(
        conn,
        now,
        todos.finish(
            conn,
            action="complete",
            id=id,
            endpoint_id=endpoint_id,
            attempt=attempt,
            actor=actor.label,
            result=result,
            now=now,
        ),
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
    return _finished(
        conn,
        now,
        todos.finish(
            conn,
            action="fail",
            id=id,
            endpoint_id=endpoint_id,
            attempt=attempt,
            actor=actor.label,
            error=error,
            retry=retry,
            now=now,
        ),
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
    return _finished(
        conn,
        now,
        todos.finish(
            conn,
            action="release",
            id=id,
            endpoint_id=endpoint_id,
            attempt=attempt,
            actor=actor.label,
            now=now,
        ),
    )


def _finished(conn: Connection[Any], now: datetime | None, todo: Todo) -> Todo:
    """Doorbells of a finished claim, in its transaction (R-REOPEN inline, R-BELL release)."""
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
