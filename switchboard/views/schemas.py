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


_TODO = TodoSchema()
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
