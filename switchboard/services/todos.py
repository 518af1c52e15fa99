"""Todo operations for agents and operators: validation, scoping, then the store.

Every function takes an open transaction's connection; the caller commits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from psycopg import Connection

from switchboard.errors import NotFound
from switchboard.models import Actor, Claim, Human, Todo
from switchboard.schemas import NewTodoSchema, load
from switchboard.store import accounts, todos

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


def claim_next(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    granted_queues: Sequence[str] | None,
    asked_queues: Sequence[str] | None,
    actor: Actor,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Claim | None:
    """An agent claims the oldest claimable todo of its queues; None when idle."""
    queues = drainable_queues(granted_queues, asked_queues)
    if queues == []:
        return None
    return todos.claim_next(
        conn,
        endpoint_id=endpoint_id,
        queues=queues,
        claimant_endpoint_id=actor.endpoint_id,
        claimant_human_id=actor.human_id,
        actor=actor.label,
        lease_seconds=lease_seconds,
        now=now,
    )


def claim(
    conn: Connection[Any],
    *,
    id: UUID,
    endpoint_id: UUID,
    granted_queues: Sequence[str] | None,
    actor: Actor,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Claim:
    """An agent claims one todo by id; raises NotFound or Conflict."""
    return todos.claim_todo(
        conn,
        id=id,
        endpoint_id=endpoint_id,
        queues=granted_queues,
        claimant_endpoint_id=actor.endpoint_id,
        claimant_human_id=actor.human_id,
        actor=actor.label,
        lease_seconds=lease_seconds,
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


def claim_operator_owned(
    conn: Connection[Any],
    *,
    id: UUID,
    human: Human,
    lease_seconds: int | None = None,
    now: datetime | None = None,
) -> Claim:
    """The board's claim, by a human who owns the endpoint (or an admin)."""
    todo = operated_todo(conn, id=id, human=human)
    return todos.claim_todo(
        conn,
        id=id,
        endpoint_id=todo.endpoint_id,
        queues=None,
        claimant_endpoint_id=None,
        claimant_human_id=human.id,
        actor=Actor(human_id=human.id).label,
        lease_seconds=lease_seconds,
        now=now,
    )
