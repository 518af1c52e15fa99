"""Todo rows and their lifecycle (SPEC §3). Every function runs inside the caller's transaction."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection
from psycopg.rows import class_row, kwargs_row
from psycopg.types.json import Jsonb

from switchboard.errors import Conflict, NotFound
from switchboard.models import Attempt, Claim, Event, Todo
from switchboard.store import load_queries

_Q = load_queries("todos")
# One claim tail (R-CLAIM) spliced into every claim path; claim_next and claim_todo go
# through the admission gate first.
_GATED = _Q["admit"].replace("{claim}", _Q["claim"].replace("{result}", _Q["claim_result"]))
_CLAIM_NEXT = (_Q["claim_next"].replace("{policy_free}", "").replace("{where_free}", "")).replace(
    "{admit}", _GATED
)
_CLAIM_TODO = _Q["claim_todo"].replace("{admit}", _GATED)
# Budgeted paths: the same candidate probes and tail with admission_gate between them.
_GATE = _Q["gate"].replace("{claim}", _Q["claim"].replace("{result}", _Q["gate_result"]))
_CLAIM_NEXT_BUDGETED = (
    _Q["claim_next"]
    .replace("{policy_free}", "\n" + _Q["policy_free"])
    .replace("{where_free}", _Q["where_free"] + "\n")
    .replace("{admit}", _GATE)
)
_CLAIM_ADMITTED = _Q["claim_admitted"].replace("{gate}", _GATE)
_SWEEP_BATCH = 1000
_TODO_FIELDS = tuple(Todo.__dataclass_fields__)
_POLICY_LIMITS = (
    "max_in_flight",
    "max_claims_per_window",
    "window_period",
    "window_tz",
    "window_start",
    "window_weekday",
)


@dataclass(frozen=True)
class PolicyRow:
    """The admission policy row locked together with a candidate."""

    id: UUID
    max_in_flight: int | None
    max_claims_per_window: int | None
    window_period: str | None
    window_tz: str | None
    window_start: str | None
    window_weekday: str | None


@dataclass(frozen=True)
class Candidate:
    """A claimable todo of a budgeted queue, locked with its policy row but not yet claimed."""

    id: UUID
    endpoint_id: UUID
    queue: str
    policy: PolicyRow
    now: datetime  # the statement's clock: windows are placed by the database's time


@dataclass(frozen=True)
class Budgets:
    """What the caller assumes about the asked queues' policies, as the gate's parameters: per
    budgeted queue its window definition and the window [start, end) placed in Python for the
    claim's instant (NULL without a window limit). A queue not listed is assumed unbudgeted."""

    queues: list[str]
    periods: list[str | None]
    tzs: list[str | None]
    starts: list[str | None]
    weekdays: list[str | None]
    window_starts: list[datetime | None]
    window_ends: list[datetime | None]

    @functools.cached_property
    def _params(self) -> dict[str, str]:
        # One two-dimensional array literal, built once per placement: the server parses it;
        # psycopg would inspect and dump seven lists on every claim.
        rows = zip(
            self.queues,
            self.periods,
            self.tzs,
            self.starts,
            self.weekdays,
            (t.isoformat() if t else None for t in self.window_starts),
            (t.isoformat() if t else None for t in self.window_ends),
            strict=True,
        )
        return {"budgets": "{" + ",".join(_array(row) for row in rows) + "}"}

    def params(self) -> dict[str, str]:
        return self._params


def _array(values: Iterable[str | None]) -> str:
    """A PostgreSQL array literal of text values (NULL for None)."""
    quoted = (
        "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    )
    return "{" + ",".join(quoted) + "}"


@dataclass(frozen=True)
class Admission:
    """The outcome of a gated claim: a claim, or the refusal with what was read under lock."""

    claim: Claim | None
    queue: str
    now: datetime  # the statement's clock
    budgeted: bool  # the queue had a policy (else claimed as today, no headroom)
    # also "policy_changed" / "window_moved": the caller's assumption was stale; start over
    refusal: str | None
    window_start: datetime | None  # the window checked (and charged on a claim)
    window_end: datetime | None
    in_flight: int | None  # before this claim, the candidate excluded
    used_before: int | None
    used_after: int | None
    earliest_lease_expiry: datetime | None
    max_in_flight: int | None  # the limits as they are under the lock
    max_claims_per_window: int | None


def _claim(columns: dict[str, Any]) -> Claim:
    return Claim(
        todo=Todo(**{name: columns[name] for name in _TODO_FIELDS}), kind=columns["claim_kind"]
    )


def _gated_row(**columns: Any) -> Claim | Candidate:
    if columns["id"] is not None:
        return _claim(columns)
    policy = columns["policy"]
    return Candidate(
        id=columns["found_id"],
        endpoint_id=columns["found_endpoint"],
        queue=columns["found_queue"],
        policy=PolicyRow(
            id=UUID(policy["id"]),
            **{name: policy[name] for name in _POLICY_LIMITS},
        ),
        now=columns["found_now"],
    )


def _admission_row(**columns: Any) -> Admission:
    return Admission(
        claim=_claim(columns) if columns["id"] is not None else None,
        queue=columns["gate_queue"],
        now=columns["gate_now"],
        budgeted=columns["budgeted"],
        refusal=columns["refusal"],
        window_start=columns["checked_window"],
        window_end=columns["checked_window_end"],
        in_flight=columns["in_flight"],
        used_before=columns["used_before"],
        used_after=columns["used_after"],
        earliest_lease_expiry=columns["earliest_lease_expiry"],
        max_in_flight=columns["current_max_in_flight"],
        max_claims_per_window=columns["current_max_claims"],
    )


def create(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    queue: str,
    title: str,
    body: str,
    payload: dict[str, Any],
    max_attempts: int,
    lease_seconds: int,
    created_by_human_id: UUID | None,
    created_by_endpoint_id: UUID | None,
    actor: str,
    now: datetime | None = None,
) -> Todo:
    """Insert a pending todo (registering its queue) and log ``created``."""
    with conn.cursor(row_factory=class_row(Todo)) as cur:
        cur.execute(
            _Q["create"],
            {
                "endpoint_id": endpoint_id,
                "queue": queue,
                "title": title,
                "body": body,
                "payload": Jsonb(payload),
                "max_attempts": max_attempts,
                "lease_seconds": lease_seconds,
                "created_by_human_id": created_by_human_id,
                "created_by_endpoint_id": created_by_endpoint_id,
                "actor": actor,
                "now": now,
            },
        )
        row = cur.fetchone()
    assert row is not None
    return row


def get(conn: Connection[Any], *, id: UUID, endpoint_id: UUID | None = None) -> Todo:
    """The todo, optionally scoped to one endpoint; raises NotFound outside the scope."""
    with conn.cursor(row_factory=class_row(Todo)) as cur:
        row = cur.execute(_Q["get"], {"id": id, "endpoint_id": endpoint_id}).fetchone()
    if row is None:
        raise NotFound(f"todo {id} not found")
    return row


def list_(
    conn: Connection[Any],
    *,
    endpoint_ids: Sequence[UUID],
    queue: str | None = None,
    state: str | None = None,
    queues: Sequence[str] | None = None,
    after: tuple[datetime, UUID] | None = None,
    limit: int = 50,
) -> list[Todo]:
    """Todos of the given endpoints (and of ``queues`` when given), newest first, after the
    keyset ``(created_at, id)``."""
    with conn.cursor(row_factory=class_row(Todo)) as cur:
        cur.execute(
            _Q["list"],
            {
                "endpoint_ids": list(endpoint_ids),
                "queue": queue,
                "state": state,
                "queues": list(queues) if queues is not None else None,
                "after_created_at": after[0] if after else None,
                "after_id": after[1] if after else None,
                "limit": limit,
            },
        )
        return cur.fetchall()


def claim_next(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    queues: Sequence[str] | None,
    claimant_endpoint_id: UUID | None,
    claimant_human_id: UUID | None,
    actor: str,
    lease_seconds: int | None = None,
    excluded: Sequence[str] = (),
    now: datetime | None = None,
) -> Claim | Candidate | None:
    """Claim the oldest claimable todo across ``queues`` (None: all), skipping ``excluded``.

    Returns the claim; or, when the todo's queue has an admission policy, the locked
    :class:`Candidate` (nothing claimed yet: see :func:`claim_admitted`); or None when idle.
    """
    with conn.cursor(row_factory=kwargs_row(_gated_row)) as cur:
        cur.execute(
            _CLAIM_NEXT,
            {
                "endpoint_id": endpoint_id,
                "queues": list(queues) if queues is not None else None,
                "excluded": list(excluded),
                "lease_seconds": lease_seconds,
                "claimant_endpoint_id": claimant_endpoint_id,
                "claimant_human_id": claimant_human_id,
                "actor": actor,
                "now": now,
            },
        )
        return cur.fetchone()


def claim_todo(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID | None,
    queues: Sequence[str] | None,
    claimant_endpoint_id: UUID | None,
    claimant_human_id: UUID | None,
    actor: str,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Claim | Candidate:
    """Claim one todo by id (waits for its row lock), or return it locked as a Candidate of a
    budgeted queue; raises NotFound or Conflict (not claimable)."""
    with conn.cursor(row_factory=kwargs_row(_gated_row)) as cur:
        cur.execute(
            _CLAIM_TODO,
            {
                "id": id,
                "endpoint_id": endpoint_id,
                "queues": list(queues) if queues is not None else None,
                "lease_seconds": lease_seconds,
                "claimant_endpoint_id": claimant_endpoint_id,
                "claimant_human_id": claimant_human_id,
                "actor": actor,
                "now": now,
            },
        )
        claim = cur.fetchone()
    if claim is None:
        todo = get(conn, id=id, endpoint_id=endpoint_id)
        if queues is not None and todo.queue not in queues:
            raise NotFound(f"todo {id} not found")
        raise Conflict(
            f"todo {id} is not claimable (state {todo.state})",
            details={"state": todo.state, "attempt": todo.attempt},
        )
    return claim


def claim_next_budgeted(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    queues: Sequence[str] | None,
    budgets: Budgets,
    claimant_endpoint_id: UUID | None,
    claimant_human_id: UUID | None,
    actor: str,
    lease_seconds: int | None = None,
    excluded: Sequence[str] = (),
    skip_busy: bool = False,
    now: datetime | None = None,
) -> Admission | None:
    """claim_next for queues that may have admission policies, in one statement: the oldest
    candidate is locked, admitted by its queue's policy (as ``budgets`` assumes it), claimed
    and charged — or refused with nothing written. None when nothing is claimable; with
    ``skip_busy`` queues whose policy another claim holds are passed over, so None may also
    mean "all busy" (wait: call again without it)."""
    with conn.cursor(row_factory=kwargs_row(_admission_row)) as cur:
        cur.execute(
            _CLAIM_NEXT_BUDGETED,
            {
                "endpoint_id": endpoint_id,
                "queues": list(queues) if queues is not None else None,
                "excluded": list(excluded),
                "lease_seconds": lease_seconds,
                "claimant_endpoint_id": claimant_endpoint_id,
                "claimant_human_id": claimant_human_id,
                "actor": actor,
                "now": now,
                "skip_busy": skip_busy,
                **budgets.params(),
            },
        )
        return cur.fetchone()


def claim_admitted(
    conn: Connection[Any],
    *,
    candidate: Candidate,
    budgets: Budgets,
    claimant_endpoint_id: UUID | None,
    claimant_human_id: UUID | None,
    actor: str,
    lease_seconds: int | None = None,
) -> Callable[[], Admission]:
    """Admit, claim and charge a candidate that :func:`claim_todo` locked in this transaction,
    or refuse (R-ADMIT), at the candidate's clock.

    The statement is sent now; the returned function reads the outcome. In a pipelined
    transaction read it after the block: the decision and COMMIT travel in one batch, so the
    policy lock is never held across a client round trip.
    """
    cur = conn.cursor(row_factory=kwargs_row(_admission_row))
    cur.execute(
        _CLAIM_ADMITTED,
        {
            "id": candidate.id,
            "lease_seconds": lease_seconds,
            "claimant_endpoint_id": claimant_endpoint_id,
            "claimant_human_id": claimant_human_id,
            "actor": actor,
            "now": candidate.now,
            **budgets.params(),
        },
    )

    def outcome() -> Admission:
        row = cur.fetchone()
        cur.close()
        assert row is not None
        return row

    return outcome


def heartbeat(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID,
    attempt: int,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Todo:
    """Extend the lease of the current claim; raises NotFound, or Conflict when stale."""
    with conn.cursor(row_factory=class_row(Todo)) as cur:
        row = cur.execute(
            _Q["heartbeat"],
            {
                "id": id,
                "endpoint_id": endpoint_id,
                "attempt": attempt,
                "lease_seconds": lease_seconds,
                "now": now,
            },
        ).fetchone()
    return row if row is not None else _stale(conn, id=id, endpoint_id=endpoint_id, attempt=attempt)


def finish(
    conn: Connection[Any],
    *,
    action: str,
    id: UUID,
    endpoint_id: UUID | None,
    attempt: int,
    actor: str,
    result: Any = None,
    error: str | None = None,
    retry: bool = True,
    now: datetime | None = None,
) -> Todo:
    """``complete``, ``fail`` or ``release`` the current claim; raises NotFound or Conflict."""
    if action not in ("complete", "fail", "release"):
        raise ValueError(f"unknown finish action {action!r}")
    with conn.cursor(row_factory=class_row(Todo)) as cur:
        row = cur.execute(
            _Q["finish"],
            {
                "action": action,
                "id": id,
                "endpoint_id": endpoint_id,
                "attempt": attempt,
                "actor": actor,
                "result": Jsonb(result) if result is not None else None,
                "error": error,
                "retry": retry,
                "now": now,
            },
        ).fetchone()
    return row if row is not None else _stale(conn, id=id, endpoint_id=endpoint_id, attempt=attempt)


def cancel(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID | None,
    actor: str,
    now: datetime | None = None,
) -> Todo:
    """Cancel a pending, claimed or waiting todo; raises NotFound, or Conflict when finished."""
    with conn.cursor(row_factory=class_row(Todo)) as cur:
        row = cur.execute(
            _Q["cancel"], {"id": id, "endpoint_id": endpoint_id, "actor": actor, "now": now}
        ).fetchone()
    if row is None:
        todo = get(conn, id=id, endpoint_id=endpoint_id)
        raise Conflict(f"todo {id} is already {todo.state}", details={"state": todo.state})
    return row


def _stale(conn: Connection[Any], *, id: UUID, endpoint_id: UUID | None, attempt: int) -> Todo:
    """Explain why a fenced update matched nothing: NotFound, or Conflict for a stale attempt."""
    todo = get(conn, id=id, endpoint_id=endpoint_id)
    raise Conflict(
        f"attempt {attempt} of todo {id} is not the current claim "
        f"(state {todo.state}, attempt {todo.attempt})",
        details={"state": todo.state, "attempt": todo.attempt},
    )


def reap_expired(conn: Connection[Any], *, now: datetime | None = None) -> int:
    """Fail lapsed claims with no attempts left (one batch); returns how many."""
    return _count(conn, _Q["reap_expired"], now)


def requeue_due_retries(conn: Connection[Any], *, now: datetime | None = None) -> int:
    """Move due ``retry_wait`` todos to ``pending`` (one batch); returns how many."""
    return _count(conn, _Q["requeue_due_retries"], now)


def _count(conn: Connection[Any], query: Any, now: datetime | None) -> int:
    row = conn.execute(query, {"now": now, "batch": _SWEEP_BATCH}).fetchone()
    assert row is not None
    return int(row[0])


def attempts(conn: Connection[Any], *, todo_id: UUID) -> list[Attempt]:
    """The attempt rows of one todo, oldest first."""
    with conn.cursor(row_factory=class_row(Attempt)) as cur:
        return cur.execute(_Q["attempts"], {"todo_id": todo_id}).fetchall()


def events(conn: Connection[Any], *, todo_id: UUID) -> list[Event]:
    """The lifecycle events of one todo, oldest first."""
    with conn.cursor(row_factory=class_row(Event)) as cur:
        return cur.execute(_Q["events"], {"todo_id": todo_id}).fetchall()
