"""REST-only wire shapes of the operator API (``/api/v1``), as marshmallow schemas.

The shared shapes (todo, headroom, deferred item, admission block) come from
``views/schemas.py``; these add what only operators see: humans, endpoints, grants, queue
summaries, queue status and policy detail, request bodies and query strings, the pagination
envelope and the error shape. The OpenAPI document is generated from these same classes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from marshmallow import Schema, fields, validate

from switchboard.models import TODO_STATES
from switchboard.schemas import QUEUE_PATTERN, FullMatch, NewTodoSchema
from switchboard.services.accounts import NewHuman
from switchboard.services.operator import (
    ClaimView,
    EndpointDetail,
    GrantView,
    Page,
    PolicyDetail,
    QueueView,
    StatusView,
    TodoView,
)
from switchboard.verbs import ALL_VERBS, BASIC_VERBS
from switchboard.views.schemas import (
    HeadroomSchema,
    PolicySchema,
    QueueStatusSchema,
    TodoSchema,
    UtcDateTime,
    admission_block,
    dump_headroom,
    dump_queue_status,
    dump_todo,
    queue_status_data,
)

PAGE_LIMIT = 200
# Cursors are URL-safe base64 (services.operator.encode_cursor); endpoints are named by slug or
# by id.
CURSOR_PATTERN = r"^[A-Za-z0-9_-]{1,300}$"
ENDPOINT_KEY_PATTERN = (
    r"^(?:[a-z0-9][a-z0-9-]{0,62}|[0-9A-Fa-f]{8}-(?:[0-9A-Fa-f]{4}-){3}[0-9A-Fa-f]{12})$"
)
WINDOW_PERIODS = ("hour", "day", "week")
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def _time(description: str, *, nullable: bool = True) -> UtcDateTime:
    return UtcDateTime(allow_none=nullable, required=True, metadata={"description": description})


def _int(description: str, *, nullable: bool = True) -> fields.Integer:
    return fields.Integer(allow_none=nullable, required=True, metadata={"description": description})


def _attempt() -> fields.Integer:
    return fields.Integer(
        strict=True,
        load_default=None,
        validate=validate.Range(min=1, max=2**31 - 1),
        metadata={"description": "the claim's attempt (fencing token); default: the current one"},
    )


# --- errors and pages -----------------------------------------------------------------------


class ErrorBodySchema(Schema):
    code = fields.String(
        required=True,
        metadata={
            "description": "not_found, conflict, deferred, forbidden, unauthorized, "
            "invalid_params, admission_unavailable, or an HTTP error name (bad_request, …)"
        },
    )
    message = fields.String(required=True)
    details = fields.Dict(
        metadata={
            "description": "invalid_params: {fields: {name: [messages]}}; "
            "deferred: the deferred item {queue, reason, pending, next_eligible_at, exact}"
        }
    )


class ErrorSchema(Schema):
    """Every error: ``{"error": {"code", "message", "details"?}}``."""

    error = fields.Nested(ErrorBodySchema, required=True)


def _next() -> fields.String:
    return fields.String(
        required=True,
        allow_none=True,
        metadata={"description": "pass as `after` for the next page; null on the last page"},
    )


class PageQuerySchema(Schema):
    limit = fields.Integer(load_default=50, validate=validate.Range(min=1, max=PAGE_LIMIT))
    after = fields.String(
        validate=FullMatch(CURSOR_PATTERN),
        metadata={"description": "the `next` of the previous page (an opaque cursor)"},
    )


# --- humans ---------------------------------------------------------------------------------


class HumanSchema(Schema):
    id = fields.UUID(required=True)
    email = fields.String(required=True)
    display_name = fields.String(required=True)
    is_admin = fields.Boolean(required=True)
    created_at = _time("when the human was created", nullable=False)


class NewHumanResultSchema(HumanSchema):
    token = fields.String(
        required=True, metadata={"description": "the human's first API token (sbo_…), shown once"}
    )


class HumanPageSchema(Schema):
    items = fields.List(fields.Nested(HumanSchema), required=True)
    next = _next()


# --- endpoints and grants -------------------------------------------------------------------


class EndpointSchema(Schema):
    id = fields.UUID(required=True)
    slug = fields.String(required=True)
    display_name = fields.String(required=True)
    owner_human_id = fields.UUID(required=True)
    notify_url = fields.String(required=True, allow_none=True)
    created_at = _time("when the endpoint was created", nullable=False)
    disabled_at = _time("when the endpoint was disabled; null while enabled")


class EndpointPageSchema(Schema):
    items = fields.List(fields.Nested(EndpointSchema), required=True)
    next = _next()


class NewEndpointResultSchema(EndpointSchema):
    notify_secret = fields.String(
        required=True,
        metadata={"description": "the HMAC-SHA256 key that signs notify_url deliveries"},
    )


class GrantSchema(Schema):
    """An agent grant as listed: never its token."""

    id = fields.UUID(required=True)
    verbs = fields.List(fields.String(), required=True)
    queues = fields.List(
        fields.String(),
        required=True,
        allow_none=True,
        metadata={"description": "null: every queue of the endpoint"},
    )
    granted_by_human_id = fields.UUID(required=True)
    created_at = _time("when the grant was made", nullable=False)
    revoked_at = _time("when it was revoked; null while live")


class EndpointDetailSchema(NewEndpointResultSchema):
    queues = fields.List(fields.String(), required=True)
    grants = fields.List(fields.Nested(GrantSchema), required=True)


class NewGrantSchema(Schema):
    verbs = fields.List(
        fields.String(validate=validate.OneOf(ALL_VERBS)),
        load_default=None,
        validate=validate.Length(min=1, max=len(ALL_VERBS) * 2),
        metadata={"description": f"default: {', '.join(BASIC_VERBS)}"},
    )
    queues = fields.List(
        fields.String(validate=FullMatch(QUEUE_PATTERN)),
        load_default=None,
        allow_none=True,
        validate=validate.Length(min=1, max=1000),
        metadata={"description": "default (or null): every queue of the endpoint"},
    )


class NewGrantResultSchema(Schema):
    id = fields.UUID(required=True)
    endpoint = fields.String(required=True, metadata={"description": "the endpoint's slug"})
    token = fields.String(
        required=True, metadata={"description": "the agent's token (sba_…), shown once"}
    )
    verbs = fields.List(fields.String(), required=True)
    queues = fields.List(fields.String(), required=True, allow_none=True)
    created_at = _time("when the grant was made", nullable=False)


# --- todos ----------------------------------------------------------------------------------


class NewOperatorTodoSchema(NewTodoSchema):
    """The agents' create_todo, plus the endpoint it goes to."""

    endpoint = fields.String(
        required=True,
        validate=FullMatch(ENDPOINT_KEY_PATTERN),
        metadata={"description": "the endpoint's slug or id"},
    )


class TodoListQuerySchema(PageQuerySchema):
    endpoint = fields.String(
        validate=FullMatch(ENDPOINT_KEY_PATTERN),
        metadata={"description": "slug or id; default: every endpoint you manage"},
    )
    queue = fields.String(validate=FullMatch(QUEUE_PATTERN))
    state = fields.String(validate=validate.OneOf(TODO_STATES))


class TodoPageSchema(Schema):
    items = fields.List(fields.Nested(TodoSchema), required=True)
    next = _next()


class ClaimRequestSchema(Schema):
    lease_seconds = fields.Integer(
        strict=True,
        load_default=None,
        validate=validate.Range(min=1, max=86400),
        metadata={"description": "default: the todo's lease_seconds"},
    )


class ClaimResultSchema(Schema):
    todo = fields.Nested(TodoSchema, required=True)
    admission = fields.Nested(
        HeadroomSchema, metadata={"description": "the queue's headroom; budgeted queues only"}
    )


class CompleteRequestSchema(Schema):
    attempt = _attempt()
    result = fields.Raw(
        load_default=None, allow_none=True, metadata={"description": "any JSON to keep"}
    )


class FailRequestSchema(Schema):
    attempt = _attempt()
    error = fields.String(required=True, validate=validate.Length(min=1, max=10000))
    retry = fields.Boolean(
        load_default=True, metadata={"description": "retry with backoff while attempts remain"}
    )


class ReleaseRequestSchema(Schema):
    attempt = _attempt()


class EmptySchema(Schema):
    """No fields: the body may be omitted, or ``{}``."""


# --- queues and admission -------------------------------------------------------------------


class EndpointFilterSchema(Schema):
    endpoint = fields.String(
        validate=FullMatch(ENDPOINT_KEY_PATTERN),
        metadata={"description": "slug or id; default: every endpoint you manage"},
    )


class WindowUsageSchema(Schema):
    window_start = _time("the window's start (its key)", nullable=False)
    used = fields.Integer(required=True)
    updated_at = _time("the last charge", nullable=False)


class AuditEntrySchema(Schema):
    id = fields.Integer(required=True)
    action = fields.String(required=True, validate=validate.OneOf(("create", "update", "delete")))
    actor_human_id = fields.UUID(required=True, metadata={"description": "the accountable human"})
    actor_endpoint_id = fields.UUID(
        required=True, allow_none=True, metadata={"description": "set when an agent made it"}
    )
    before = fields.Nested(PolicySchema, required=True, allow_none=True)
    after = fields.Nested(PolicySchema, required=True, allow_none=True)
    at = _time("when", nullable=False)


class PolicyDetailSchema(QueueStatusSchema):
    """A queue status plus the policy's identity, newest 30 windows and its audit tail."""

    id = fields.UUID(required=True, metadata={"description": "kept across PUTs"})
    created_at = _time("when the policy was created", nullable=False)
    updated_at = _time("its last change", nullable=False)
    windows = fields.List(fields.Nested(WindowUsageSchema), required=True)
    audit = fields.List(fields.Nested(AuditEntrySchema), required=True)


class QueueCountsSchema(Schema):
    pending = fields.Integer(required=True)
    claimed = fields.Integer(required=True)
    retry_wait = fields.Integer(required=True)
    done = fields.Integer(required=True)
    failed = fields.Integer(required=True)
    cancelled = fields.Integer(required=True)


class QueueSummarySchema(Schema):
    endpoint = fields.String(required=True, metadata={"description": "the endpoint's slug"})
    queue = fields.String(required=True)
    counts = fields.Nested(QueueCountsSchema, required=True)
    oldest_pending_age_s = _int("age in whole seconds of the oldest pending todo")
    admission = fields.Nested(
        QueueStatusSchema,
        required=True,
        allow_none=True,
        metadata={"description": "null: the queue has no admission policy"},
    )


# --- dumping --------------------------------------------------------------------------------

_HUMAN = HumanSchema()
_NEW_HUMAN = NewHumanResultSchema()
_ENDPOINT = EndpointSchema()
_NEW_ENDPOINT = NewEndpointResultSchema()
_ENDPOINT_DETAIL = EndpointDetailSchema()
_NEW_GRANT = NewGrantResultSchema()
_DETAIL = PolicyDetailSchema()
_SUMMARY = QueueSummarySchema()


def _dump(schema: Schema, data: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = schema.dump(data)
    return dumped


def todo(view: TodoView) -> dict[str, Any]:
    """A todo with its admission block (pending todos of budgeted queues only)."""
    return dump_todo(view.todo, endpoint=view.endpoint, admission=admission_block(view.admission))


def todo_page(page: Page[TodoView]) -> dict[str, Any]:
    return {"items": [todo(view) for view in page.items], "next": page.next}


def claim(view: ClaimView) -> dict[str, Any]:
    """``{todo, admission?}``: the headroom only on a budgeted queue (as MCP's claim)."""
    result = {"todo": todo(view.todo)}
    if view.headroom is not None:
        result["admission"] = dump_headroom(view.headroom)
    return result


def human(row: Any) -> dict[str, Any]:
    return _dump(_HUMAN, row)


def new_human(created: NewHuman) -> dict[str, Any]:
    """A created human with its first token."""
    return _dump(_NEW_HUMAN, {**dataclasses.asdict(created.human), "token": created.token})


def page(items: list[dict[str, Any]], next: str | None) -> dict[str, Any]:
    return {"items": items, "next": next}


def endpoint(row: Any) -> dict[str, Any]:
    return _dump(_ENDPOINT, row)


def new_endpoint(row: Any) -> dict[str, Any]:
    return _dump(_NEW_ENDPOINT, row)


def endpoint_detail(detail: EndpointDetail) -> dict[str, Any]:
    data = dataclasses.asdict(detail.endpoint)
    return _dump(_ENDPOINT_DETAIL, {**data, "queues": detail.queues, "grants": detail.grants})


def new_grant(view: GrantView) -> dict[str, Any]:
    grant = view.grant.grant
    return _dump(
        _NEW_GRANT,
        {
            "id": grant.id,
            "endpoint": view.endpoint,
            "token": view.grant.token,
            "verbs": grant.verbs,
            "queues": grant.queues,
            "created_at": grant.created_at,
        },
    )


def queue_status(view: StatusView) -> dict[str, Any]:
    return dump_queue_status(view.endpoint, view.status)


def policy_detail(detail: PolicyDetail) -> dict[str, Any]:
    record = detail.record
    data = queue_status_data(detail.status.endpoint, detail.status.status)
    data.update(
        id=record.id,
        created_at=record.created_at,
        updated_at=record.updated_at,
        windows=detail.windows,
        audit=detail.audit,
    )
    return _dump(_DETAIL, data)


def queue_summary(view: QueueView) -> dict[str, Any]:
    summary = view.summary
    counts = {state: getattr(summary, state) for state in TODO_STATES}
    status = view.admission
    return _dump(
        _SUMMARY,
        {
            "endpoint": summary.endpoint,
            "queue": summary.queue,
            "counts": counts,
            "oldest_pending_age_s": summary.oldest_pending_age_s,
            "admission": None if status is None else queue_status_data(summary.endpoint, status),
        },
    )
