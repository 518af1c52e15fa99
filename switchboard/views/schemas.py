"""Wire shapes (SPEC Appendix A) as marshmallow output schemas, shared by MCP and REST.

Times are RFC 3339 UTC strings ending in ``Z``; ids are UUID strings; endpoints are named by
slug. The schemas double as the JSON Schema that MCP tools declare as ``outputSchema``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from marshmallow import Schema, fields, validate

from switchboard.admission.service import QueueStatus
from switchboard.admission.windows import PERIODS, WEEKDAYS
from switchboard.models import TODO_STATES, Todo

DEFERRAL_REASONS = ("window_exhausted", "in_flight_full", "paused", "admission_unavailable")


def rfc3339(value: datetime) -> str:
    """An aware datetime as RFC 3339 in UTC with ``Z``; raises ValueError when naive."""
    if value.tzinfo is None:
        raise ValueError("naive datetimes have no place on the wire")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as RFC 3339 UTC and UUIDs as strings, recursively."""
    if isinstance(value, datetime):
        return rfc3339(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


class UtcDateTime(fields.DateTime):
    """A datetime dumped as RFC 3339 UTC with ``Z`` (JSON Schema ``format: date-time``)."""

    def _serialize(self, value: Any, attr: str | None, obj: Any, **kwargs: Any) -> str | None:
        return None if value is None else rfc3339(value)


def _time(description: str, *, nullable: bool = True, required: bool = True) -> UtcDateTime:
    return UtcDateTime(
        allow_none=nullable, required=required, metadata={"description": description}
    )


def _int(description: str) -> fields.Integer:
    return fields.Integer(allow_none=True, required=True, metadata={"description": description})


class AdmissionBlockSchema(Schema):
    """A pending todo's admission status in a budgeted queue (R-DERIVED)."""

    deferred = fields.Boolean(required=True)
    reason = fields.String(validate=validate.OneOf(DEFERRAL_REASONS))
    next_eligible_at = _time(
        "when the queue admits a claim again; null when unknown", required=False
    )
    exact = fields.Boolean(metadata={"description": "next_eligible_at is exact, not a guess"})


class TodoSchema(Schema):
    """A todo as every surface shows it."""

    id = fields.UUID(required=True)
    endpoint = fields.String(required=True, metadata={"description": "the endpoint's slug"})
    queue = fields.String(required=True)
    title = fields.String(required=True)
    body = fields.String(required=True)
    payload = fields.Dict(required=True)
    state = fields.String(required=True, validate=validate.OneOf(TODO_STATES))
    attempt = fields.Integer(
        required=True,
        metadata={"description": "claims so far; a claim's attempt is its fencing token"},
    )
    max_attempts = fields.Integer(required=True)
    lease_seconds = fields.Integer(required=True)
    lease_expires_at = _time("end of the current claim's lease")
    claimed_at = _time("start of the current or last claim")
    retry_at = _time("when a todo waiting to retry becomes claimable")
    last_error = fields.String(allow_none=True, required=True)
    result = fields.Raw(
        allow_none=True, required=True, metadata={"description": "what complete stored"}
    )
    created_at = _time("creation time", nullable=False)
    updated_at = _time("last change", nullable=False)
    finished_at = _time("when it became done, failed or cancelled")
    admission = fields.Nested(AdmissionBlockSchema)


class HeadroomSchema(Schema):
    """What a budgeted queue has left after a claim (R-HEADROOM); null limits are unset."""

    max_in_flight = fields.Integer(allow_none=True, required=True)
    in_flight = fields.Integer(allow_none=True, required=True)
    max_claims_per_window = fields.Integer(allow_none=True, required=True)
    used = fields.Integer(allow_none=True, required=True)
    remaining = fields.Integer(allow_none=True, required=True)
    window_resets_at = _time("the next window boundary")


class DeferredItemSchema(Schema):
    """A queue a claim left out, why, and when it becomes eligible (R-DEFER)."""

    queue = fields.String(required=True)
    reason = fields.String(required=True, validate=validate.OneOf(DEFERRAL_REASONS))
    pending = fields.Integer(required=True)
    next_eligible_at = _time("when the queue admits a claim again; null when unknown")
    exact = fields.Boolean(required=True)


class WindowSchema(Schema):
    period = fields.String(required=True, validate=validate.OneOf(PERIODS))
    tz = fields.String(required=True, metadata={"description": "IANA zone (embedded tzdata)"})
    start = fields.String(required=True, metadata={"description": "HH:MM local wall time"})
    weekday = fields.String(
        required=True,
        allow_none=True,
        validate=validate.OneOf(WEEKDAYS),
        metadata={"description": "week windows only"},
    )


class PolicySchema(Schema):
    """A policy as read back (Appendix A); null limits are unset."""

    max_in_flight = _int("claimed todos at once (0 pauses the queue)")
    max_claims_per_window = _int("claims per window (0 pauses the queue)")
    window = fields.Nested(WindowSchema, required=True, allow_none=True)


class QueueStatusSchema(Schema):
    """A budgeted queue's admission status now (Appendix A), derived at read time."""

    endpoint = fields.String(required=True, metadata={"description": "the endpoint's slug"})
    queue = fields.String(required=True)
    policy = fields.Nested(PolicySchema, required=True)
    status = fields.String(required=True, validate=validate.OneOf(("open", "deferred")))
    reason = fields.String(
        validate=validate.OneOf(DEFERRAL_REASONS), metadata={"description": "deferred only"}
    )
    in_flight = _int("claimed todos now")
    used = _int("claims charged in the current window")
    remaining = _int("claims left in the current window")
    window_start = _time("start of the current window")
    window_resets_at = _time("the next window boundary")
    next_eligible_at = _time("when a deferred queue admits a claim again; null when unknown")
    exact = fields.Boolean(required=True, metadata={"description": "next_eligible_at is exact"})
    pending = fields.Integer(required=True, metadata={"description": "claimable todos waiting"})


_TODO = TodoSchema()
_STATUS = QueueStatusSchema()
_HEADROOM = HeadroomSchema()
_DEFERRED = DeferredItemSchema()


def dump_todo(
    todo: Todo, *, endpoint: str, admission: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The todo's wire shape; ``endpoint`` is its endpoint's slug, ``admission`` the R-DERIVED
    block of a pending todo in a budgeted queue (omitted when None)."""
    data = {field.name: getattr(todo, field.name) for field in dataclasses.fields(todo)}
    data["endpoint"] = endpoint
    if admission is not None:
        data["admission"] = admission
    dumped: dict[str, Any] = _TODO.dump(data)
    return dumped


def admission_block(block: Any) -> dict[str, Any] | None:
    """A todo's admission block (TodoAdmission) as ``{deferred, reason?, next_eligible_at?,
    exact?}``: the reason and times only when deferred; None passes through."""
    if block is None:
        return None
    if not block.deferred:
        return {"deferred": False}
    return {
        "deferred": True,
        "reason": block.reason,
        "next_eligible_at": block.next_eligible_at,
        "exact": block.exact,
    }


def dump_headroom(headroom: Any) -> dict[str, Any]:
    """A headroom (object or mapping with the Appendix A fields) in its wire shape."""
    dumped: dict[str, Any] = _HEADROOM.dump(headroom)
    return dumped


def dump_deferred(item: Any) -> dict[str, Any]:
    """A deferred item (object or mapping with the Appendix A fields) in its wire shape."""
    dumped: dict[str, Any] = _DEFERRED.dump(item)
    return dumped


def queue_status_data(endpoint: str, status: QueueStatus) -> dict[str, Any]:
    """The queue status (Appendix A) of an admission.service.QueueStatus, before dumping."""
    verdict = status.verdict
    data: dict[str, Any] = {
        "endpoint": endpoint,
        "queue": status.queue,
        "policy": verdict.policy.as_json(),
        "status": "deferred" if verdict.deferred else "open",
        "in_flight": verdict.in_flight,
        "used": verdict.used,
        "remaining": verdict.remaining,
        "window_start": verdict.window_start,
        "window_resets_at": verdict.window_resets_at,
        "next_eligible_at": verdict.next_eligible_at,
        "exact": verdict.exact,
        "pending": status.pending,
    }
    if verdict.deferred:
        data["reason"] = verdict.reason
    return data


def dump_queue_status(endpoint: str, status: QueueStatus) -> dict[str, Any]:
    """A queue's admission status in its wire shape; ``endpoint`` is the slug."""
    dumped: dict[str, Any] = _STATUS.dump(queue_status_data(endpoint, status))
    return dumped
