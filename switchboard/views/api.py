"""``/api/v1``: the operators' REST API (SPEC §6 R-API), bearer ``sbo_`` tokens, JSON in and out.

Views load with a schema, call :mod:`switchboard.services.operator` in one transaction and
dump with a schema; errors are mapped by ``views/errors.py``. Lists page by keyset:
``{"items": [...], "next": cursor|null}``; ``/queues`` and ``/admission`` are plain arrays
(Appendix A), one item per queue.
"""

from __future__ import annotations

import json
import math
from typing import Any
from uuid import UUID

from flask import Blueprint, Response, current_app, g, jsonify, request
from marshmallow import Schema
from werkzeug.exceptions import BadRequest

from switchboard import extensions, schemas
from switchboard.admission.service import PolicySchema
from switchboard.db import Database
from switchboard.models import Human
from switchboard.schemas import NewEndpointSchema, NewHumanSchema
from switchboard.services import operator
from switchboard.views import api_schemas as out
from switchboard.views import openapi
from switchboard.views.api_schemas import (
    ClaimRequestSchema,
    ClaimResultSchema,
    CompleteRequestSchema,
    EmptySchema,
    EndpointDetailSchema,
    EndpointFilterSchema,
    EndpointPageSchema,
    FailRequestSchema,
    HumanPageSchema,
    NewEndpointResultSchema,
    NewGrantResultSchema,
    NewGrantSchema,
    NewHumanResultSchema,
    NewOperatorTodoSchema,
    PageQuerySchema,
    PolicyDetailSchema,
    QueueSummarySchema,
    ReleaseRequestSchema,
    TodoListQuerySchema,
    TodoPageSchema,
)
from switchboard.views.openapi import operation
from switchboard.views.schemas import QueueStatusSchema, TodoSchema

bp = Blueprint("api", __name__, url_prefix="/api/v1")
_OPENAPI_KEY = "switchboard.openapi"
_PUBLIC = frozenset({"api.openapi_document"})
_SCHEMAS: dict[type[Schema], Schema] = {}


# --- plumbing -------------------------------------------------------------------------------


def _db() -> Database:
    return extensions.database(current_app)


def _human() -> Human:
    human: Human = g.operator
    return human


def _bearer(header: str | None) -> str | None:
    scheme, _, token = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


@bp.before_request
def _authenticate() -> None:
    """Refuse text PostgreSQL cannot store in the path or query (400); then every route but
    the OpenAPI document needs a live operator token (401 otherwise)."""
    _storable(request.path, *request.args.keys(), *request.args.values())
    if request.endpoint in _PUBLIC:
        return
    token = _bearer(request.headers.get("Authorization"))
    g.operator_token_presented = token is not None
    with _db().transaction() as conn:
        g.operator = operator.authenticate(conn, token=token)


@bp.after_request
def _challenge(response: Response) -> Response:
    """A 401 names the scheme to use (RFC 6750)."""
    if response.status_code == 401:
        challenge = 'Bearer realm="switchboard"'
        if g.get("operator_token_presented"):
            challenge += ', error="invalid_token"'
        response.headers["WWW-Authenticate"] = challenge
    return response


def _schema(cls: type[Schema]) -> Schema:
    if cls not in _SCHEMAS:
        _SCHEMAS[cls] = cls()
    return _SCHEMAS[cls]


def _body(cls: type[Schema] | None = None) -> Any:
    """The JSON body ({} when empty), loaded with ``cls`` when given; raises BadRequest for a
    body that is not JSON, Invalid naming each bad field."""
    raw = request.get_data(cache=True)  # over MAX_CONTENT_LENGTH: 413
    if not raw.strip():
        data: Any = {}
    elif not request.is_json:
        raise BadRequest("the body must be JSON, sent with Content-Type: application/json")
    else:
        try:
            data = json.loads(raw, parse_constant=_not_json, parse_float=_finite)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise BadRequest(f"the body is not valid JSON: {exc}") from None
        except RecursionError:
            raise BadRequest("the body is not valid JSON: nested too deeply") from None
        _storable(data)
    return data if cls is None else schemas.load(_schema(cls), data)


def _storable(*values: Any) -> None:
    """Raise BadRequest for text PostgreSQL cannot store (NUL, lone surrogates) anywhere in
    ``values``, which are JSON values; walked without recursion."""
    stack = list(values)
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item or (not item.isascii() and not _utf8(item)):
                raise BadRequest("text may not contain NUL characters or lone surrogates")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_json(constant: str) -> Any:
    """NaN and Infinity are Python's extension, not JSON (PostgreSQL's jsonb refuses them)."""
    raise ValueError(f"{constant} is not a JSON value")


def _finite(text: str) -> float:
    """A JSON number that fits a float: 1e400 would be infinity, which jsonb refuses."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value


def _query(cls: type[Schema]) -> dict[str, Any]:
    """The query string loaded with ``cls``; raises Invalid naming each bad parameter."""
    return schemas.load(_schema(cls), request.args.to_dict())


def _json(data: Any, status: int = 200) -> Response:
    response = jsonify(data)
    response.status_code = status
    return response


def _no_content() -> Response:
    return Response(status=204)


# --- the document ---------------------------------------------------------------------------


@bp.get("/openapi.json")
@operation("This OpenAPI 3.1 document", result={"type": "object"}, auth=False)
def openapi_document() -> Response:
    if _OPENAPI_KEY not in current_app.extensions:
        current_app.extensions[_OPENAPI_KEY] = openapi.document(current_app)
    return _json(current_app.extensions[_OPENAPI_KEY])


# --- humans ---------------------------------------------------------------------------------


@bp.get("/humans")
@operation(
    "List humans (admins only)", result=HumanPageSchema, query=PageQuerySchema, errors=(403,)
)
def list_humans() -> Response:
    args = _query(PageQuerySchema)
    with _db().transaction() as conn:
        page = operator.list_humans(conn, human=_human(), **args)
    return _json(out.page([out.human(row) for row in page.items], page.next))


@bp.post("/humans")
@operation(
    "Create a human and its first API token (admins only)",
    status=201,
    result=NewHumanResultSchema,
    body=NewHumanSchema,
    errors=(403,),
)
def create_human() -> Response:
    data = _body()
    with _db().transaction() as conn:
        created = operator.create_human(conn, human=_human(), data=data)
    return _json(out.new_human(created), 201)


# --- endpoints and grants -------------------------------------------------------------------


@bp.get("/endpoints")
@operation("List the endpoints you manage", result=EndpointPageSchema, query=PageQuerySchema)
def list_endpoints() -> Response:
    args = _query(PageQuerySchema)
    with _db().transaction() as conn:
        page = operator.list_endpoints(conn, human=_human(), **args)
    return _json(out.page([out.endpoint(row) for row in page.items], page.next))


@bp.post("/endpoints")
@operation(
    "Create an endpoint you own",
    status=201,
    result=NewEndpointResultSchema,
    body=NewEndpointSchema,
    errors=(409,),
)
def create_endpoint() -> Response:
    data = _body()
    with _db().transaction() as conn:
        created = operator.create_endpoint(conn, human=_human(), data=data)
    return _json(out.new_endpoint(created), 201)


@bp.get("/endpoints/<slug>")
@operation(
    "Show an endpoint with its queues and grants (no tokens)",
    result=EndpointDetailSchema,
    errors=(404,),
)
def show_endpoint(slug: str) -> Response:
    with _db().transaction() as conn:
        detail = operator.endpoint_detail(conn, human=_human(), key=slug)
    return _json(out.endpoint_detail(detail))


@bp.post("/endpoints/<slug>/grants")
@operation(
    "Vend an agent token for the endpoint (shown once)",
    status=201,
    result=NewGrantResultSchema,
    body=NewGrantSchema,
    errors=(404,),
)
def create_grant(slug: str) -> Response:
    args = _body(NewGrantSchema)
    with _db().transaction() as conn:
        view = operator.create_grant(conn, human=_human(), key=slug, **args)
    return _json(out.new_grant(view), 201)


@bp.delete("/grants/<uuid:id>")
@operation("Revoke a grant (idempotent)", status=204, errors=(404,))
def revoke_grant(id: UUID) -> Response:
    with _db().transaction() as conn:
        operator.revoke_grant(conn, human=_human(), id=id)
    return _no_content()


# --- todos ----------------------------------------------------------------------------------


@bp.get("/todos")
@operation(
    "List todos, newest first", result=TodoPageSchema, query=TodoListQuerySchema, errors=(404,)
)
def list_todos() -> Response:
    args = _query(TodoListQuerySchema)
    with _db().transaction() as conn:
        page = operator.list_todos(conn, human=_human(), **args)
    return _json(out.todo_page(page))


@bp.post("/todos")
@operation(
    "Create a pending todo",
    status=201,
    result=TodoSchema,
    body=NewOperatorTodoSchema,
    errors=(404,),
)
def create_todo() -> Response:
    data = _body()
    key = schemas.load(_schema(NewOperatorTodoSchema), data)["endpoint"]
    fields = {name: value for name, value in data.items() if name != "endpoint"}
    defaults = extensions.state(current_app).todo_defaults
    with _db().transaction() as conn:
        view = operator.create_todo(conn, human=_human(), key=key, data=fields, defaults=defaults)
    return _json(out.todo(view), 201)


@bp.get("/todos/<uuid:id>")
@operation("Show a todo", result=TodoSchema, errors=(404,))
def show_todo(id: UUID) -> Response:
    with _db().transaction() as conn:
        view = operator.show_todo(conn, human=_human(), id=id)
    return _json(out.todo(view))


@bp.post("/todos/<uuid:id>/claim")
@operation(
    "Claim a todo as its operator (admission applies)",
    result=ClaimResultSchema,
    body=ClaimRequestSchema,
    errors=(404, 409, 429, 503),
    description="A queue held back by admission control answers 429 `deferred` with "
    "Retry-After when the eligible time is exact; nothing is claimed or charged.",
)
def claim_todo(id: UUID) -> Response:
    args = _body(ClaimRequestSchema)
    view = operator.claim_todo(_db(), human=_human(), id=id, **args)
    return _json(out.claim(view))


def _finish(id: UUID, action: str, schema: type[Schema]) -> Response:
    args = _body(schema)
    with _db().transaction() as conn:
        view = operator.finish_todo(conn, human=_human(), id=id, action=action, fields=args)
    return _json(out.todo(view))


@bp.post("/todos/<uuid:id>/complete")
@operation(
    "Complete the current claim", result=TodoSchema, body=CompleteRequestSchema, errors=(404, 409)
)
def complete_todo(id: UUID) -> Response:
    return _finish(id, "complete", CompleteRequestSchema)


@bp.post("/todos/<uuid:id>/fail")
@operation(
    "Fail the current claim (retry with backoff while attempts remain)",
    result=TodoSchema,
    body=FailRequestSchema,
    errors=(404, 409),
)
def fail_todo(id: UUID) -> Response:
    return _finish(id, "fail", FailRequestSchema)


@bp.post("/todos/<uuid:id>/release")
@operation(
    "Give the current claim back (pending; the charge stays)",
    result=TodoSchema,
    body=ReleaseRequestSchema,
    errors=(404, 409),
)
def release_todo(id: UUID) -> Response:
    return _finish(id, "release", ReleaseRequestSchema)


@bp.post("/todos/<uuid:id>/cancel")
@operation(
    "Cancel a todo that is not finished", result=TodoSchema, body=EmptySchema, errors=(404, 409)
)
def cancel_todo(id: UUID) -> Response:
    _body(EmptySchema)
    with _db().transaction() as conn:
        view = operator.cancel_todo(conn, human=_human(), id=id)
    return _json(out.todo(view))


# --- queues and admission -------------------------------------------------------------------


@bp.get("/queues")
@operation(
    "Queues: todos by state, oldest pending age and admission status",
    result=QueueSummarySchema,
    many=True,
    query=EndpointFilterSchema,
    errors=(404,),
)
def list_queues() -> Response:
    args = _query(EndpointFilterSchema)
    with _db().transaction() as conn:
        views = operator.queues(conn, human=_human(), **args)
    return _json([out.queue_summary(view) for view in views])


@bp.get("/admission")
@operation(
    "The status of every admission policy you may manage",
    result=QueueStatusSchema,
    many=True,
    query=EndpointFilterSchema,
    errors=(404,),
)
def list_admission() -> Response:
    args = _query(EndpointFilterSchema)
    with _db().transaction() as conn:
        views = operator.admission_statuses(conn, human=_human(), **args)
    return _json([out.queue_status(view) for view in views])


_SCOPE = "/admission/<scope>/<queue>"
_SCOPE_NOTE = "`scope` is `endpoint:<slug-or-id>`; foreign and unknown scopes are both 404."


@bp.get(_SCOPE)
@operation(
    "One policy: its status, the last 30 windows and the audit tail",
    result=PolicyDetailSchema,
    errors=(404,),
    description=_SCOPE_NOTE,
)
def show_admission(scope: str, queue: str) -> Response:
    with _db().transaction() as conn:
        detail = operator.policy_detail(conn, human=_human(), scope=scope, queue=queue)
    return _json(out.policy_detail(detail))


@bp.put(_SCOPE)
@operation(
    "Create or fully replace a queue's policy (id and usage kept; audited)",
    result=PolicyDetailSchema,
    body=PolicySchema,
    errors=(404,),
    description=_SCOPE_NOTE,
)
def put_admission(scope: str, queue: str) -> Response:
    data = _body()
    with _db().transaction() as conn:
        detail = operator.put_policy(conn, human=_human(), scope=scope, queue=queue, data=data)
    return _json(out.policy_detail(detail))


@bp.delete(_SCOPE)
@operation(
    "Remove a queue's policy (the audit is kept)",
    status=204,
    errors=(404,),
    description=_SCOPE_NOTE,
)
def delete_admission(scope: str, queue: str) -> Response:
    with _db().transaction() as conn:
        operator.delete_policy(conn, human=_human(), scope=scope, queue=queue)
    return _no_content()
