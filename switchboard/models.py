"""Typed rows: frozen dataclasses built by psycopg's ``class_row`` (column names = fields)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

TODO_STATES = ("pending", "claimed", "retry_wait", "done", "failed", "cancelled")
TERMINAL_STATES = frozenset({"done", "failed", "cancelled"})


@dataclass(frozen=True)
class Human:
    id: UUID
    email: str
    display_name: str
    password_hash: str | None
    is_admin: bool
    created_at: datetime


@dataclass(frozen=True)
class ApiToken:
    id: UUID
    human_id: UUID
    name: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


@dataclass(frozen=True)
class Endpoint:
    id: UUID
    slug: str
    display_name: str
    owner_human_id: UUID
    notify_url: str | None
    notify_secret: str
    created_at: datetime
    disabled_at: datetime | None


@dataclass(frozen=True)
class Grant:
    id: UUID
    endpoint_id: UUID
    verbs: list[str]
    queues: list[str] | None
    granted_by_human_id: UUID
    created_at: datetime
    revoked_at: datetime | None


@dataclass(frozen=True)
class Todo:
    id: UUID
    endpoint_id: UUID
    queue: str
    title: str
    body: str
    payload: dict[str, Any]
    state: str
    attempt: int
    max_attempts: int
    lease_seconds: int
    lease_expires_at: datetime | None
    claimed_at: datetime | None
    claimed_by_endpoint_id: UUID | None
    claimed_by_human_id: UUID | None
    retry_at: datetime | None
    last_error: str | None
    result: Any
    created_by_human_id: UUID | None
    created_by_endpoint_id: UUID | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class Claim:
    """A committed claim: the todo after the claim and the kind of attempt it opened."""

    todo: Todo
    kind: str  # first | retry | takeover | reclaim


@dataclass(frozen=True)
class Attempt:
    id: int
    todo_id: UUID
    endpoint_id: UUID
    queue: str
    attempt: int
    kind: str
    claimed_at: datetime
    claimed_by_endpoint_id: UUID | None
    claimed_by_human_id: UUID | None
    ended_at: datetime | None
    outcome: str | None


@dataclass(frozen=True)
class Event:
    id: int
    at: datetime
    endpoint_id: UUID
    queue: str
    todo_id: UUID | None
    kind: str
    actor: str
    data: dict[str, Any]


@dataclass(frozen=True)
class Actor:
    """Who acts: an agent (endpoint, via a grant) or a human. Exactly one id is set."""

    endpoint_id: UUID | None = None
    human_id: UUID | None = None

    def __post_init__(self) -> None:
        if (self.endpoint_id is None) == (self.human_id is None):
            raise ValueError("an Actor is exactly one of an endpoint or a human")

    @property
    def label(self) -> str:
        """The events-log form: ``endpoint:<id>`` or ``human:<id>``."""
        if self.endpoint_id is not None:
            return f"endpoint:{self.endpoint_id}"
        return f"human:{self.human_id}"
