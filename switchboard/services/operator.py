"""What an operator (a human with an ``sbo_`` token) may see and do through the REST API and CLI.

A human manages the endpoints they own; an admin manages every endpoint. Anything outside that
is NotFound with the same message as something that does not exist, so ids and scopes never
leak. Functions take an open transaction's connection (the claim takes the Database: it owns
its transaction) and return typed views for the API's schemas to dump.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

from psycopg import Connection

from switchboard import doorbells
from switchboard.admission import service as admission
from switchboard.admission.service import Headroom, QueueStatus, TodoAdmission
from switchboard.db import Database
from switchboard.errors import Forbidden, Invalid, NotFound, Unauthorized
from switchboard.models import Actor, Endpoint, Grant, Human, Todo
from switchboard.services import accounts, todos
from switchboard.services.accounts import NewGrant, NewHuman
from switchboard.services.todos import TodoDefaults
from switchboard.store import accounts as accounts_store
from switchboard.store import admission as admission_store
from switchboard.store import operator as store
from switchboard.store import todos as todos_store
from switchboard.store.admission import AuditRecord, PolicyRecord, WindowRecord
from switchboard.store.operator import QueueSummary

T = TypeVar("T")

SCOPE_KINDS = ("endpoint",)  # team:<id> arrives with SPEC-0033


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a keyset listing; ``next`` is the cursor of the following page, or None."""

    items: list[T]
    next: str | None


@dataclass(frozen=True)
class TodoView:
    """A todo with its endpoint's slug and, for a pending todo of a budgeted queue, its
    derived admission block (R-DERIVED)."""

    todo: Todo
    endpoint: str
    admission: TodoAdmission | None


@dataclass(frozen=True)
class ClaimView:
    todo: TodoView
    headroom: Headroom | None


@dataclass(frozen=True)
class EndpointDetail:
    endpoint: Endpoint
    queues: list[str]
    grants: list[Grant]


@dataclass(frozen=True)
class GrantView:
    grant: NewGrant
    endpoint: str


@dataclass(frozen=True)
class StatusView:
    """A queue status (Appendix A) with its endpoint's slug."""

    endpoint: str
    status: QueueStatus


@dataclass(frozen=True)
class QueueView:
    summary: QueueSummary
    admission: QueueStatus | None


@dataclass(frozen=True)
class PolicyDetail:
    """One policy: its status now, its record, the newest windows and the audit tail."""

    status: StatusView
    record: PolicyRecord
    windows: list[WindowRecord]
    audit: list[AuditRecord]


# --- who ------------------------------------------------------------------------------------


def authenticate(conn: Connection[Any], *, token: str | None) -> Human:
    """The human behind an ``sbo_`` token; raises Unauthorized (missing, unknown or revoked)."""
    if token is None:
        raise Unauthorized("an operator token is required: Authorization: Bearer sbo_…")
    human = accounts.authenticate_human(conn, token=token)
    if human is None:
        raise Unauthorized("the token is unknown or revoked")
    return human


def _owner(human: Human) -> UUID | None:
    """The owner filter of the human's reads: None (every endpoint) for an admin."""
    return None if human.is_admin else human.id


def _require_admin(human: Human) -> None:
    if not human.is_admin:
        raise Forbidden("only an admin may manage humans")


def managed_endpoint(conn: Connection[Any], *, human: Human, key: str) -> Endpoint:
    """An endpoint the human manages, by slug or id; raises NotFound (foreign or unknown)."""
    return accounts_store.get_endpoint(conn, key=key, owner_human_id=_owner(human))


def scope_endpoint(conn: Connection[Any], *, human: Human, scope: str) -> Endpoint:
    """The endpoint of an admission scope ``endpoint:<slug-or-id>``; any other, foreign or
    unknown scope raises NotFound."""
    kind, colon, key = scope.partition(":")
    if kind not in SCOPE_KINDS or not colon or not key:
        raise NotFound(f"scope {scope!r} not found")
    return managed_endpoint(conn, human=human, key=key)


def _endpoints(conn: Connection[Any], *, human: Human, key: str | None) -> list[Endpoint]:
    """The one endpoint named by ``key``, else every endpoint the human manages."""
    if key is not None:
        return [managed_endpoint(conn, human=human, key=key)]
    return accounts_store.list_endpoints(conn, owner_human_id=_owner(human))


# --- cursors --------------------------------------------------------------------------------


def encode_cursor(*parts: str) -> str:
    """An opaque keyset cursor of string parts."""
    raw = json.dumps(list(parts), separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str, *, arity: int) -> list[str]:
    """The parts of a cursor from :func:`encode_cursor`; raises Invalid naming ``after``."""
    try:
        parts = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, binascii.Error):  # JSON and UTF-8 errors are ValueErrors
        parts = None
    if not isinstance(parts, list) or len(parts) != arity:
        raise Invalid({"after": ["not a cursor returned by this listing"]})
    # Printable: a forged cursor must not carry NUL or a lone surrogate into a query.
    if not all(isinstance(part, str) and part.isprintable() for part in parts):
        raise Invalid({"after": ["not a cursor returned by this listing"]})
    return parts


def _todo_keyset(cursor: str | None) -> tuple[datetime, UUID] | None:
    if cursor is None:
        return None
    created_at, id = decode_cursor(cursor, arity=2)
    try:
        at, key = datetime.fromisoformat(created_at), UUID(id)
    except ValueError:
        raise Invalid({"after": ["not a cursor returned by this listing"]}) from None
    if at.tzinfo is None:
        raise Invalid({"after": ["not a cursor returned by this listing"]})
    return at, key


def _page(rows: list[T], limit: int, key: Any) -> Page[T]:
    """A page from ``limit + 1`` rows: the extra row only says that there is a next page."""
    items = rows[:limit]
    more = len(rows) > limit
    return Page(items, encode_cursor(*key(items[-1])) if more and items else None)


# --- humans ---------------------------------------------------------------------------------


def list_humans(
    conn: Connection[Any], *, human: Human, after: str | None = None, limit: int = 50
) -> Page[Human]:
    """Every human by email (admins only); raises Forbidden, or Invalid for a bad cursor."""
    _require_admin(human)
    (email,) = decode_cursor(after, arity=1) if after is not None else (None,)
    rows = store.human_page(conn, after=email, limit=limit + 1)
    return _page(rows, limit, lambda row: (row.email.lower(),))


def create_human(conn: Connection[Any], *, human: Human, data: Any) -> NewHuman:
    """A new human and its first API token (admins only); raises Forbidden or Invalid."""
    _require_admin(human)
    return accounts.create_human(conn, data=data)


# --- endpoints and grants -------------------------------------------------------------------


def list_endpoints(
    conn: Connection[Any], *, human: Human, after: str | None = None, limit: int = 50
) -> Page[Endpoint]:
    """The endpoints the human manages, by slug; raises Invalid for a bad cursor."""
    (slug,) = decode_cursor(after, arity=1) if after is not None else (None,)
    rows = store.endpoint_page(conn, owner_human_id=_owner(human), after=slug, limit=limit + 1)
    return _page(rows, limit, lambda row: (row.slug,))


def create_endpoint(conn: Connection[Any], *, human: Human, data: Any) -> Endpoint:
    """A new endpoint owned by the human; raises Invalid, or Conflict when the slug is taken."""
    return accounts.create_endpoint(conn, owner=human, data=data)


def endpoint_detail(conn: Connection[Any], *, human: Human, key: str) -> EndpointDetail:
    """An endpoint with its queue names and grants (no tokens); raises NotFound."""
    found = managed_endpoint(conn, human=human, key=key)
    return EndpointDetail(
        found,
        accounts_store.endpoint_queues(conn, endpoint_id=found.id),
        accounts_store.list_grants(conn, endpoint_id=found.id),
    )


def create_grant(
    conn: Connection[Any],
    *,
    human: Human,
    key: str,
    verbs: Sequence[str] | None,
    queues: Sequence[str] | None,
) -> GrantView:
    """Vend an agent token for one of the human's endpoints; raises NotFound or Invalid."""
    found = managed_endpoint(conn, human=human, key=key)
    vended = accounts.create_grant(
        conn, endpoint=found, granted_by=human, verbs=verbs, queues=queues
    )
    return GrantView(vended, found.slug)


def revoke_grant(conn: Connection[Any], *, human: Human, id: UUID) -> Grant:
    """Revoke a grant of one of the human's endpoints (idempotent); raises NotFound."""
    scope = store.grant_scope(conn, id=id)
    if scope is None or (not human.is_admin and scope.owner_human_id != human.id):
        raise NotFound(f"grant {id} not found")
    return accounts_store.revoke_grant(conn, id=id, endpoint_ids=[scope.endpoint_id])


# --- todos ----------------------------------------------------------------------------------


def _views(conn: Connection[Any], rows: Sequence[Todo], slugs: dict[UUID, str]) -> list[TodoView]:
    blocks = admission.todo_admission(conn, rows)
    return [TodoView(todo, slugs[todo.endpoint_id], blocks.get(todo.id)) for todo in rows]


def _view(conn: Connection[Any], todo: Todo) -> TodoView:
    slug = accounts_store.get_endpoint(conn, key=str(todo.endpoint_id)).slug
    return _views(conn, [todo], {todo.endpoint_id: slug})[0]


def create_todo(
    conn: Connection[Any], *, human: Human, key: str, data: dict[str, Any], defaults: TodoDefaults
) -> TodoView:
    """A new pending todo on one of the human's endpoints (``data`` as the agents'
    create_todo); raises NotFound or Invalid."""
    found = managed_endpoint(conn, human=human, key=key)
    todo = todos.create(
        conn, endpoint_id=found.id, data=data, actor=Actor(human_id=human.id), defaults=defaults
    )
    return _views(conn, [todo], {found.id: found.slug})[0]


def list_todos(
    conn: Connection[Any],
    *,
    human: Human,
    endpoint: str | None = None,
    queue: str | None = None,
    state: str | None = None,
    after: str | None = None,
    limit: int = 50,
) -> Page[TodoView]:
    """Todos of the human's endpoints (or of one), newest first; raises NotFound for a foreign
    or unknown endpoint, Invalid for a bad cursor."""
    keyset = _todo_keyset(after)
    endpoints = _endpoints(conn, human=human, key=endpoint)
    rows = todos_store.list_(
        conn,
        endpoint_ids=[e.id for e in endpoints],
        queue=queue,
        state=state,
        after=keyset,
        limit=limit + 1,
    )
    page = _page(rows, limit, lambda row: (row.created_at.isoformat(), str(row.id)))
    slugs = {e.id: e.slug for e in endpoints}
    return Page(_views(conn, page.items, slugs), page.next)


def show_todo(conn: Connection[Any], *, human: Human, id: UUID) -> TodoView:
    """One todo of the human's endpoints; raises NotFound (foreign or unknown)."""
    return _view(conn, todos.operated_todo(conn, id=id, human=human))


def cancel_todo(conn: Connection[Any], *, human: Human, id: UUID) -> TodoView:
    """Cancel a todo that is not finished; raises NotFound, or Conflict when finished."""
    todo = todos.operated_todo(conn, id=id, human=human)
    cancelled = todos_store.cancel(
        conn, id=id, endpoint_id=todo.endpoint_id, actor=Actor(human_id=human.id).label
    )
    return _view(conn, cancelled)


def claim_todo(
    db: Database, *, human: Human, id: UUID, lease_seconds: int | None = None
) -> ClaimView:
    """The operator's claim of one todo, admission applied; raises NotFound, Conflict,
    Deferred (nothing charged) or AdmissionUnavailable."""
    claimed = todos.claim_operator_owned(db, id=id, human=human, lease_seconds=lease_seconds)
    with db.transaction() as conn:
        return ClaimView(_view(conn, claimed.claim.todo), claimed.headroom)


def finish_todo(
    conn: Connection[Any], *, human: Human, id: UUID, action: str, fields: dict[str, Any]
) -> TodoView:
    """``complete``, ``fail`` or ``release`` a claim as the human. ``fields["attempt"]``
    fences it (default: the current attempt); raises NotFound or Conflict (stale attempt,
    or not claimed)."""
    todo = todos.operated_todo(conn, id=id, human=human)
    attempt = fields.get("attempt")
    common: dict[str, Any] = {
        "id": id,
        "endpoint_id": todo.endpoint_id,
        "attempt": todo.attempt if attempt is None else attempt,
        "actor": Actor(human_id=human.id),
    }
    if action == "complete":
        done = todos.complete(conn, result=fields.get("result"), **common)
    elif action == "fail":
        done = todos.fail(conn, error=fields["error"], retry=fields["retry"], **common)
    elif action == "release":
        done = todos.release(conn, **common)
    else:
        raise ValueError(f"unknown finish action {action!r}")
    return _view(conn, done)


# --- queues and admission -------------------------------------------------------------------


def queues(conn: Connection[Any], *, human: Human, endpoint: str | None = None) -> list[QueueView]:
    """Every queue of the human's endpoints (or of one): counts by state, oldest pending age
    and admission status; raises NotFound for a foreign or unknown endpoint."""
    ids = [e.id for e in _endpoints(conn, human=human, key=endpoint)]
    statuses = {
        (s.endpoint_id, s.queue): s for s in admission.queue_statuses(conn, endpoint_ids=ids)
    }
    return [
        QueueView(summary, statuses.get((summary.endpoint_id, summary.queue)))
        for summary in store.queue_summaries(conn, endpoint_ids=ids)
    ]


def admission_statuses(
    conn: Connection[Any], *, human: Human, endpoint: str | None = None
) -> list[StatusView]:
    """The status of every policy the human may manage (or of one endpoint's); raises
    NotFound for a foreign or unknown endpoint."""
    endpoints = _endpoints(conn, human=human, key=endpoint)
    slugs = {e.id: e.slug for e in endpoints}
    statuses = admission.queue_statuses(conn, endpoint_ids=list(slugs))
    return [StatusView(slugs[s.endpoint_id], s) for s in statuses]


def policy_detail(conn: Connection[Any], *, human: Human, scope: str, queue: str) -> PolicyDetail:
    """One policy with its status, last 30 windows and audit tail; raises NotFound (foreign or
    unknown scope, or no policy on the queue)."""
    found = scope_endpoint(conn, human=human, scope=scope)
    record = store.policy_get(conn, endpoint_id=found.id, queue=queue)
    statuses = admission.queue_statuses(conn, endpoint_ids=[found.id], queues=[queue])
    if record is None or not statuses:
        raise NotFound(f"no admission policy on queue {queue!r}")
    return PolicyDetail(
        StatusView(found.slug, statuses[0]),
        record,
        admission_store.recent_windows(conn, policy_id=record.id, limit=30),
        admission_store.audit_tail(conn, endpoint_id=found.id, queue=queue),
    )


def put_policy(
    conn: Connection[Any], *, human: Human, scope: str, queue: str, data: Any
) -> PolicyDetail:
    """Create or fully replace a queue's policy (audited; the id and usage are kept); raises
    NotFound for the scope, or Invalid naming each bad field with nothing written."""
    found = scope_endpoint(conn, human=human, scope=scope)
    admission.put_policy(conn, endpoint=found, queue=queue, data=data, actor_human_id=human.id)
    doorbells.policy_written(conn, endpoint_id=found.id, queue=queue)
    return policy_detail(conn, human=human, scope=scope, queue=queue)


def delete_policy(conn: Connection[Any], *, human: Human, scope: str, queue: str) -> None:
    """Remove a queue's policy, keeping its audit; raises NotFound (scope or policy)."""
    found = scope_endpoint(conn, human=human, scope=scope)
    admission.delete_policy(conn, endpoint=found, queue=queue, actor_human_id=human.id)
    doorbells.policy_written(conn, endpoint_id=found.id, queue=queue, cleared=True)
