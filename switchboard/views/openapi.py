"""The OpenAPI 3.1 document of ``/api/v1``, generated from the views' marshmallow schemas.

Each API view declares itself with :func:`operation`; :func:`document` walks the app's URL map,
so a route without a declaration fails the build and every route is described.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, TypeVar

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from apispec.ext.marshmallow.common import resolve_schema_cls
from flask import Flask
from marshmallow import Schema
from marshmallow import fields as ma_fields
from werkzeug.routing import Rule

from switchboard.admission import service as admission
from switchboard.schemas import QUEUE_PATTERN, FullMatch
from switchboard.views.api_schemas import ErrorSchema

BLUEPRINT = "api"
F = TypeVar("F", bound=Callable[..., Any])
SchemaRef = type[Schema] | dict[str, Any] | None


@dataclass(frozen=True)
class Operation:
    """What the document says about one view: its body, query, success and error responses."""

    summary: str
    status: int
    result: SchemaRef
    body: type[Schema] | None = None
    query: type[Schema] | None = None
    errors: tuple[int, ...] = ()
    auth: bool = True
    description: str = ""
    many: bool = False


_OPERATIONS: dict[str, Operation] = {}

# Error responses by status: (component name, description, extra response fields).
_ERRORS: dict[int, tuple[str, str, dict[str, Any]]] = {
    400: (
        "BadRequest",
        "Malformed JSON, a body that is not application/json, or text PostgreSQL cannot store "
        "(NUL, a lone surrogate) in the body, path or query.",
        {},
    ),
    401: (
        "Unauthorized",
        "No operator token, or an unknown or revoked one.",
        {
            "headers": {
                "WWW-Authenticate": {
                    "description": 'Bearer realm="switchboard"',
                    "schema": {"type": "string"},
                }
            }
        },
    ),
    403: ("Forbidden", "Admins only.", {}),
    404: ("NotFound", "Unknown, or not yours (never distinguished).", {}),
    409: ("Conflict", "The thing exists but its state does not allow this.", {}),
    413: ("ContentTooLarge", "The request body exceeds 1 MiB.", {}),
    422: (
        "InvalidParams",
        "Validation failed; details.fields names each bad field. Nothing was written.",
        {},
    ),
    429: (
        "Deferred",
        "Admission control holds the queue back; details is the deferred item.",
        {
            "headers": {
                "Retry-After": {
                    "description": "whole seconds until next_eligible_at (exact times only)",
                    "schema": {"type": "integer", "minimum": 0},
                }
            }
        },
    ),
    503: ("AdmissionUnavailable", "Admission cannot be evaluated (unknown zone): fail closed.", {}),
}

# Two admission input schemas share class names with the REST output shapes.
_NAMES: dict[type[Schema], str] = {
    admission.PolicySchema: "PolicyInput",
    admission.WindowSchema: "WindowInput",
}


def operation(
    summary: str,
    *,
    status: int = 200,
    result: SchemaRef = None,
    body: type[Schema] | None = None,
    query: type[Schema] | None = None,
    errors: tuple[int, ...] = (),
    auth: bool = True,
    description: str = "",
    many: bool = False,
) -> Callable[[F], F]:
    """Declare a view of the API blueprint for the OpenAPI document (the view is unchanged)."""

    def register(view: F) -> F:
        _OPERATIONS[view.__name__] = Operation(
            summary, status, result, body, query, errors, auth, description, many
        )
        return view

    return register


def _schema_name(schema: Any) -> str:
    resolved = resolve_schema_cls(schema)
    cls = resolved[0] if isinstance(resolved, list) else resolved
    if cls in _NAMES:
        return _NAMES[cls]
    name: str = cls.__name__
    return name.removesuffix("Schema") or name


def _pattern(self: Any, field: ma_fields.Field[Any], **_: Any) -> dict[str, Any]:
    """FullMatch validators as JSON Schema patterns (anchored: ``pattern`` is a search)."""
    for validator in field.validators:
        if isinstance(validator, FullMatch):
            return {"pattern": f"^(?:{validator.pattern.removeprefix('^').removesuffix('$')})$"}
    return {}


_CONVERTER = re.compile(r"<(?:(\w+):)?(\w+)>")
# Path parameters: longer ones are never found (404), and a client should not send them.
_PATH_PARAMS: dict[str, dict[str, Any]] = {
    "slug": {"type": "string", "minLength": 1, "maxLength": 63},
    "scope": {"type": "string", "minLength": 1, "maxLength": 100, "example": "endpoint:billing"},
    "queue": {"type": "string", "pattern": QUEUE_PATTERN},
    "id": {"type": "string", "format": "uuid"},
}


def _path(rule: Rule) -> tuple[str, list[dict[str, Any]]]:
    """The OpenAPI path of a Werkzeug rule and its path parameters."""
    params = []
    for _, name in _CONVERTER.findall(rule.rule):
        schema = _PATH_PARAMS[name]  # KeyError: a new path parameter needs its schema here
        params.append({"in": "path", "name": name, "required": True, "schema": dict(schema)})
    return _CONVERTER.sub(r"{\2}", rule.rule), params


def _content(schema: SchemaRef, many: bool) -> dict[str, Any]:
    body: Any = {"type": "array", "items": schema} if many else schema
    return {"application/json": {"schema": body}}


def _operation(name: str, op: Operation) -> dict[str, Any]:
    success: dict[str, Any] = {"description": op.summary}
    if op.result is not None:
        success["content"] = _content(op.result, op.many)
    codes = set(op.errors)
    if op.auth:
        codes |= {400, 401}  # 400: NUL or a lone surrogate in the path or query
    if op.body is not None:
        codes |= {400, 413, 422}
    if op.query is not None:
        codes.add(422)
    doc: dict[str, Any] = {
        "operationId": name,
        "summary": op.summary,
        "responses": {str(op.status): success} | {str(c): _ERRORS[c][0] for c in sorted(codes)},
    }
    if op.description:
        doc["description"] = op.description
    if op.body is not None:
        required = any(f.required for f in op.body().fields.values())
        doc["requestBody"] = {"required": required, "content": _content(op.body, False)}
    if op.query is not None:
        doc["parameters"] = [{"in": "query", "schema": op.query}]
    if not op.auth:
        doc["security"] = []
    return doc


@dataclass
class _Paths:
    operations: dict[str, dict[str, Any]] = field(default_factory=dict)
    parameters: list[dict[str, Any]] = field(default_factory=list)


def _paths(app: Flask) -> dict[str, _Paths]:
    """Every route of the API blueprint; raises LookupError for an undeclared view."""
    paths: dict[str, _Paths] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        blueprint, _, name = rule.endpoint.partition(".")
        if blueprint != BLUEPRINT:
            continue
        if name not in _OPERATIONS:
            raise LookupError(f"API view {rule.endpoint} has no @operation declaration")
        path, params = _path(rule)
        entry = paths.setdefault(path, _Paths(parameters=params))
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            entry.operations[method.lower()] = _operation(name, _OPERATIONS[name])
    return paths


def document(app: Flask) -> dict[str, Any]:
    """The OpenAPI 3.1 document of the app's ``/api/v1`` routes."""
    try:
        version = metadata.version("switchboard")
    except metadata.PackageNotFoundError:
        version = "0.0.0"
    plugin = MarshmallowPlugin(schema_name_resolver=_schema_name)
    spec = APISpec(
        title="Switchboard operator API",
        version=version,
        openapi_version="3.1.0",
        plugins=[plugin],
        info={
            "description": "Operators' REST API: bearer `sbo_` tokens, JSON in and out, one "
            'error shape `{"error": {"code", "message", "details"?}}`. Lists page by keyset: '
            "`limit` (1-200, default 50) and `after` (the previous page's `next`)."
        },
        security=[{"bearer": []}],
    )
    assert plugin.converter is not None  # set by APISpec's init_spec
    plugin.converter.add_attribute_function(_pattern)  # type: ignore[no-untyped-call]
    spec.components.security_scheme(
        "bearer", {"type": "http", "scheme": "bearer", "bearerFormat": "sbo_ operator token"}
    )
    spec.components.schema("Error", schema=ErrorSchema)
    for _, (name, description, extra) in sorted(_ERRORS.items()):
        spec.components.response(
            name, {"description": description, "content": _content(ErrorSchema, False), **extra}
        )
    for path, entry in _paths(app).items():
        spec.path(path=path, operations=entry.operations, parameters=entry.parameters or None)
    return spec.to_dict()
