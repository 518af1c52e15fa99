"""Todo operations for agents and operators: validation, scoping, then the store.

Every function takes an open transaction's connection; the caller commits.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection

from switchboard.admission import service as admission
from switchboard.admission.service import DeferredQueue, Headroom, Verdict
from switchboard.db import Database
from switchboard.errors import AdmissionUnavailable, Deferred, NotFound
from switchboard.models import Actor, Claim, Human, Todo
from switchboard.schemas import NewTodoSchema, load
from switchboard.store import accounts, todos
from switchboard.store import admission as admission_store
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
    return todos.create(
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


class _PolicyFreeQueues:
    """Which (endpoint, queue set) pairs had no admission policy a moment ago.

    Only a hint: it lets an unbudgeted claim skip the pre-read and run as the single
    autocommit statement it is. Correctness never depends on it — the claim statement itself
    locks and checks the candidate queue's policy, and a policy found there sends the claim
    down the full path.
    """

    def __init__(self, ttl_seconds: float) -> None:
        self.ttl = ttl_seconds
        self._until: dict[tuple[UUID, tuple[str, ...] | None], float] = {}
        self._lock = threading.Lock()

    def fresh(self, key: tuple[UUID, tuple[str, ...] | None]) -> bool:
        with self._lock:
            return self._until.get(key, 0.0) > time.monotonic()

    def remember(self, key: tuple[UUID, tuple[str, ...] | None], policy_free: bool) -> None:
        with self._lock:
            if policy_free:
                if len(self._until) > 10_000:
                    self._until.clear()
                self._until[key] = time.monotonic() + self.ttl
            else:
                self._until.pop(key, None)


_POLICY_FREE = _PolicyFreeQueues(ttl_seconds=1.0)


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
    if _POLICY_FREE.fresh(key):
        with db.statement() as conn:  # R-ZERO: today's one statement, one round trip
            found = claim(conn)
        if found is None or isinstance(found, Claim):
            return Claimed(found, None) if found else Idle([])
        # A policy appeared; the statement claimed nothing and its locks are gone.
    with db.transaction() as conn:
        states = admission_store.states(conn, endpoint_ids=[endpoint_id], queues=queues, now=now)
    _POLICY_FREE.remember(key, policy_free=not states)
    refused = {s.queue: v for s in states if (v := admission.evaluate(s, for_claim=True)).deferred}
    # Bounded: each pass returns, or refuses a queue not yet excluded (len(queues) at most).
    while True:
        with db.transaction() as conn:
            found = claim(conn, excluded=sorted(refused))
            if found is None:
                return Idle(
                    admission.deferred_items(
                        conn, endpoint_id=endpoint_id, verdicts=refused, now=now
                    )
                )
            outcome = _admit(conn, found, actor=actor, lease_seconds=lease_seconds)
        if isinstance(outcome, Claimed):
            return outcome
        refused[outcome.queue] = outcome.verdict


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
    with db.transaction() as conn:
        return _claim_by_id(
            conn,
            id=id,
            endpoint_id=endpoint_id,
            queues=granted_queues,
            actor=actor,
            lease_seconds=lease_seconds,
            now=now,
        )


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
    with db.transaction() as conn:
        todo = operated_todo(conn, id=id, human=human)
        return _claim_by_id(
            conn,
            id=id,
            endpoint_id=todo.endpoint_id,
            queues=None,
            actor=Actor(human_id=human.id),
            lease_seconds=lease_seconds,
            now=now,
        )


def _claim_by_id(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID,
    queues: Sequence[str] | None,
    actor: Actor,
    lease_seconds: int | None,
    now: datetime | None,
) -> Claimed:
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
    return _claimed_or_raise(_admit(conn, found, actor=actor, lease_seconds=lease_seconds))


def _admit(
    conn: Connection[Any], found: Claim | Candidate, *, actor: Actor, lease_seconds: int | None
) -> Claimed | _Refused:
    """Finish a claim: no policy was claimed already; a budgeted candidate is decided under
    its locks and claimed and charged in one statement, or refused with nothing written."""
    if isinstance(found, Claim):
        return Claimed(found, None)
    policy = admission.policy_of(found.policy)
    verdict = admission.decide(
        policy, now=found.now, in_flight=None, used_in=(None, None), earliest_lease_expiry=None
    )
    if verdict.reason == admission.UNAVAILABLE:
        return _Refused(found.queue, verdict)
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
    if result.claim is None:
        refusal = admission.decide(
            policy,
            now=found.now,
            in_flight=result.in_flight,
            used_in=(verdict.window_start, result.used_before),
            earliest_lease_expiry=result.earliest_lease_expiry,
        )
        return _Refused(found.queue, refusal)
    after = admission.decide(
        policy,
        now=found.now,
        in_flight=None if result.in_flight is None else result.in_flight + 1,
        used_in=(verdict.window_start, result.used_after),
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
    return todos.finish(
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
    return todos.finish(
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
    return todos.finish(
        conn,
        action="release",
        id=id,
        endpoint_id=endpoint_id,
        attempt=attempt,
        actor=actor.label,
        now=now,
    )


def operated_todo(conn: Connection[Any], *, id: UUID, human: Human) -> Todo:
    """A todo the human may operate on (owner of its endpoint, or admin); else NotFound."""
    todo = todos.get(conn, id=id)
    if not human.is_admin:
        endpoint = accounts.get_endpoint(conn, key=str(todo.endpoint_id))
        if endpoint.owner_human_id != human.id:
            raise NotFound(f"todo {id} not found")
    return todo
