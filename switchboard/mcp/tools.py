"""The agent tools (SPEC §5, Appendix A): argument and result schemas, then one function each.

An agent sees and changes only its own endpoint's todos, and only in its grant's queues;
anything outside is ``not_found``. Results use the wire shapes of ``views/schemas.py``.
"""

from __future__ import annotations

import base64
import binascii
from datetime import datetime
from typing import Any
from uuid import UUID

from marshmallow import Schema, fields, validate
from psycopg import Connection

from switchboard import doorbells
from switchboard.admission import service as admission
from switchboard.admission.service import PolicySchema as PolicyInputSchema
from switchboard.errors import Forbidden, Invalid, NotFound
from switchboard.mcp.registry import Call, tool
from switchboard.models import TODO_STATES, Actor, Todo
from switchboard.schemas import QUEUE_PATTERN, SLUG_PATTERN, FullMatch, NewTodoSchema
from switchboard.services import todos
from switchboard.store import accounts as accounts_store
from switchboard.views.schemas import (
    DeferredItemSchema,
    HeadroomSchema,
    PolicySchema,
    QueueStatusSchema,
    TodoSchema,
    admission_block,
    dump_deferred,
    dump_headroom,
    dump_queue_status,
    dump_todo,
)

LIST_LIMIT = 200


def _lease() -> fields.Integer:
    return fields.Integer(
        strict=True,
        validate=validate.Range(min=1, max=86400),
        metadata={"description": "lease in seconds (default: the todo's lease_seconds)"},
    )


def _id() -> fields.UUID:
    return fields.UUID(required=True, metadata={"description": "the todo's id"})


def _attempt() -> fields.Integer:
    return fields.Integer(
        required=True,
        strict=True,
        validate=validate.Range(min=1),
        metadata={"description": "the attempt your claim returned (the fencing token)"},
    )


# --- arguments --------------------------------------------------------------------------------


class NoArgs(Schema):
    pass


class CreateTodoArgs(NewTodoSchema):
    endpoint = fields.String(
        validate=FullMatch(SLUG_PATTERN),
        metadata={"description": "your endpoint's slug (or id); no other endpoint is accepted"},
    )


class TodoIdArgs(Schema):
    id = _id()


class ListTodosArgs(Schema):
    queue = fields.String(validate=FullMatch(QUEUE_PATTERN))
    state = fields.String(validate=validate.OneOf(TODO_STATES))
    limit = fields.Integer(strict=True, load_default=50, validate=validate.Range(1, LIST_LIMIT))
    after = fields.String(
        validate=validate.Length(max=200),
        metadata={"description": "the `next` of the previous page"},
    )


class ClaimArgs(Schema):
    id = _id()
    lease_seconds = _lease()


class ClaimNextArgs(Schema):
    queues = fields.List(
        fields.String(validate=FullMatch(QUEUE_PATTERN)),
        validate=validate.Length(min=1, max=100),
        metadata={"description": "claim from these of your queues only (default: all)"},
    )
    lease_seconds = _lease()


class HeartbeatArgs(Schema):
    id = _id()
    attempt = _attempt()
    lease_seconds = _lease()


class CompleteArgs(Schema):
    id = _id()
    attempt = _attempt()
    result = fields.Raw(allow_none=True, metadata={"description": "any JSON to keep with it"})


class FailArgs(Schema):
    id = _id()
    attempt = _attempt()
    error = fields.String(required=True, validate=validate.Length(min=1, max=10000))
    retry = fields.Boolean(
        load_default=True, metadata={"description": "retry with backoff while attempts remain"}
    )


class ReleaseArgs(Schema):
    id = _id()
    attempt = _attempt()


# --- results ----------------------------------------------------------------------------------


class WhoamiResult(Schema):
    endpoint = fields.String(required=True, metadata={"description": "your endpoint's slug"})
    verbs = fields.List(fields.String(), required=True)
    queues = fields.List(
        fields.String(),
        required=True,
        allow_none=True,
        metadata={"description": "the queues you may use; null means all of your endpoint's"},
    )


class TodoResult(Schema):
    todo = fields.Nested(TodoSchema, required=True)


class TodoListResult(Schema):
    todos = fields.List(fields.Nested(TodoSchema), required=True)
    next = fields.String(
        required=True, allow_none=True, metadata={"description": "pass as `after` for more"}
    )


class ClaimResult(Schema):
    todo = fields.Nested(TodoSchema, required=True)
    admission = fields.Nested(HeadroomSchema, metadata={"description": "budgeted queues only"})


class ClaimNextResult(Schema):
    """A claim (todo, admission?) or the idle answer (empty, deferred?)."""

    todo = fields.Nested(TodoSchema)
    admission = fields.Nested(HeadroomSchema, metadata={"description": "budgeted queues only"})
    empty = fields.Boolean(metadata={"description": "true: nothing to claim now"})
    deferred = fields.List(
        fields.Nested(DeferredItemSchema),
        metadata={"description": "queues with work held back by admission control"},
    )


# --- tools ------------------------------------------------------------------------------------


def _actor(call: Call) -> Actor:
    return Actor(endpoint_id=call.agent.grant.endpoint_id)


def _todo(call: Call, todo: Todo, conn: Connection[Any] | None = None) -> dict[str, Any]:
    """``{"todo": …}``; with ``conn``, a pending todo carries its admission block."""
    return {"todo": _dump_todos(call, [todo], conn)[0]}


def _dump_todos(call: Call, rows: list[Todo], conn: Connection[Any] | None) -> list[dict[str, Any]]:
    """Todos in their wire shape; pending ones of budgeted queues with the admission block
    derived at this read (R-DERIVED), when a connection is given."""
    blocks = admission.todo_admission(conn, rows) if conn is not None else {}
    return [
        dump_todo(
            todo, endpoint=call.agent.endpoint, admission=admission_block(blocks.get(todo.id))
        )
        for todo in rows
    ]


def _claimed(call: Call, claimed: todos.Claimed) -> dict[str, Any]:
    result = _todo(call, claimed.claim.todo)
    if claimed.headroom is not None:
        result["admission"] = dump_headroom(claimed.headroom)
    return result


@tool(
    "whoami",
    title="Who am I",
    description="Your endpoint (slug), the verbs your token grants and the queues it covers.",
    input=NoArgs,
    output=WhoamiResult,
    read_only=True,
)
def whoami(call: Call) -> dict[str, Any]:
    """The caller's endpoint, verbs and queues; raises nothing."""
    grant = call.agent.grant
    return {"endpoint": call.agent.endpoint, "verbs": list(grant.verbs), "queues": grant.queues}


@tool(
    "create_todo",
    title="Create a todo",
    description="Put a new pending todo in one of your queues. Returns the todo.",
    input=CreateTodoArgs,
    output=TodoResult,
)
def create_todo(call: Call) -> dict[str, Any]:
    """A new pending todo; raises NotFound (another endpoint), Forbidden (a queue outside
    the grant) or Invalid."""
    agent, args = call.agent, dict(call.args)
    endpoint = args.pop("endpoint", None)
    if endpoint is not None and endpoint not in (agent.endpoint, str(agent.grant.endpoint_id)):
        raise NotFound(f"endpoint {endpoint!r} not found")  # another's and none look alike
    queues = agent.grant.queues
    if queues is not None and args["queue"] not in queues:
        raise Forbidden(f"this grant does not cover queue {args['queue']!r}")
    with call.db.transaction() as conn:
        todo = todos.create(
            conn,
            endpoint_id=agent.grant.endpoint_id,
            data=args,
            actor=_actor(call),
            defaults=call.defaults,
        )
        return _todo(call, todo, conn)


@tool(
    "get_todo",
    title="Get a todo",
    description="One of your todos by id.",
    input=TodoIdArgs,
    output=TodoResult,
    read_only=True,
)
def get_todo(call: Call) -> dict[str, Any]:
    """One todo; raises NotFound outside the endpoint or the granted queues."""
    grant = call.agent.grant
    with call.db.transaction() as conn:
        todo = todos.get(
            conn, id=call.args["id"], endpoint_id=grant.endpoint_id, granted_queues=grant.queues
        )
        return _todo(call, todo, conn)


@tool(
    "list_todos",
    title="List todos",
    description="Your todos, newest first, optionally of one queue and state. "
    "Pass the result's `next` as `after` for the next page.",
    input=ListTodosArgs,
    output=TodoListResult,
    read_only=True,
)
def list_todos(call: Call) -> dict[str, Any]:
    """A page of todos and the cursor for the next; raises Invalid for a foreign cursor."""
    grant, args = call.agent.grant, call.args
    with call.db.transaction() as conn:
        rows = todos.list_(
            conn,
            endpoint_id=grant.endpoint_id,
            granted_queues=grant.queues,
            queue=args.get("queue"),
            state=args.get("state"),
            after=decode_cursor(args["after"]) if "after" in args else None,
            limit=args["limit"],
        )
        dumped = _dump_todos(call, rows, conn)
    last = rows[-1] if len(rows) == args["limit"] else None
    return {"todos": dumped, "next": None if last is None else encode_cursor(last)}


@tool(
    "claim",
    title="Claim a todo",
    description="Claim one todo by id under a lease. Keep the returned `attempt`: heartbeat, "
    "complete, fail and release need it. A queue held back by admission control answers "
    "with the error `deferred` and when to try again.",
    input=ClaimArgs,
    output=ClaimResult,
)
def claim(call: Call) -> dict[str, Any]:
    """Claim by id; raises NotFound, Conflict, Deferred or AdmissionUnavailable."""
    grant = call.agent.grant
    claimed = todos.claim(
        call.db,
        id=call.args["id"],
        endpoint_id=grant.endpoint_id,
        granted_queues=grant.queues,
        actor=_actor(call),
        lease_seconds=call.args.get("lease_seconds"),
    )
    return _claimed(call, claimed)


@tool(
    "claim_next",
    title="Claim the next todo",
    description="Claim the oldest claimable todo of your queues (or of `queues`) under a lease. "
    "Returns {todo, admission?}; keep todo.attempt. Nothing to do: {empty: true}, with "
    "`deferred` listing queues whose work admission control holds back, and until when.",
    input=ClaimNextArgs,
    output=ClaimNextResult,
)
def claim_next(call: Call) -> dict[str, Any]:
    """The next claim, or the idle answer (an answer, not an error); raises nothing else."""
    grant = call.agent.grant
    outcome = todos.claim_next(
        call.db,
        endpoint_id=grant.endpoint_id,
        granted_queues=grant.queues,
        asked_queues=call.args.get("queues"),
        actor=_actor(call),
        lease_seconds=call.args.get("lease_seconds"),
    )
    if isinstance(outcome, todos.Claimed):
        return _claimed(call, outcome)
    idle: dict[str, Any] = {"empty": True}
    if outcome.deferred:
        idle["deferred"] = [dump_deferred(item) for item in outcome.deferred]
    return idle


@tool(
    "heartbeat",
    title="Extend the lease",
    description="Extend the lease of your current claim (before lease_expires_at).",
    input=HeartbeatArgs,
    output=TodoResult,
    idempotent=True,
)
def heartbeat(call: Call) -> dict[str, Any]:
    """Extend the lease; raises NotFound, or Conflict for a stale attempt."""
    args = call.args
    with call.db.transaction() as conn:
        _granted(call, conn, args["id"])
        todo = todos.heartbeat(
            conn,
            id=args["id"],
            endpoint_id=call.agent.grant.endpoint_id,
            attempt=args["attempt"],
            lease_seconds=args.get("lease_seconds"),
        )
    return _todo(call, todo)


@tool(
    "complete",
    title="Complete a todo",
    description="Finish your current claim as done, optionally with a JSON result.",
    input=CompleteArgs,
    output=TodoResult,
    destructive=True,
)
def complete(call: Call) -> dict[str, Any]:
    """Finish as done; raises NotFound, or Conflict for a stale attempt."""
    args = call.args
    with call.db.transaction() as conn:
        _granted(call, conn, args["id"])
        todo = todos.complete(
            conn,
            id=args["id"],
            endpoint_id=call.agent.grant.endpoint_id,
            attempt=args["attempt"],
            actor=_actor(call),
            result=args.get("result"),
        )
    return _todo(call, todo)


@tool(
    "fail",
    title="Fail a todo",
    description="Give up your current claim with an error. With retry (default) and attempts "
    "left it waits in retry_wait with backoff; otherwise it fails for good.",
    input=FailArgs,
    output=TodoResult,
    destructive=True,
)
def fail(call: Call) -> dict[str, Any]:
    """Fail (retry_wait or failed); raises NotFound, or Conflict for a stale attempt."""
    args = call.args
    with call.db.transaction() as conn:
        _granted(call, conn, args["id"])
        todo = todos.fail(
            conn,
            id=args["id"],
            endpoint_id=call.agent.grant.endpoint_id,
            attempt=args["attempt"],
            actor=_actor(call),
            error=args["error"],
            retry=args["retry"],
        )
    return _todo(call, todo)


@tool(
    "release",
    title="Release a todo",
    description="Hand your current claim back: the todo is pending again for anyone.",
    input=ReleaseArgs,
    output=TodoResult,
)
def release(call: Call) -> dict[str, Any]:
    """Give the claim back (pending); raises NotFound, or Conflict for a stale attempt."""
    args = call.args
    with call.db.transaction() as conn:
        _granted(call, conn, args["id"])
        todo = todos.release(
            conn,
            id=args["id"],
            endpoint_id=call.agent.grant.endpoint_id,
            attempt=args["attempt"],
            actor=_actor(call),
        )
        return _todo(call, todo, conn)


def _granted(call: Call, conn: Connection[Any], id: UUID) -> None:
    """A queue-scoped grant reaches only its queues' claims: NotFound otherwise, as get_todo
    answers (unscoped grants skip the read)."""
    grant = call.agent.grant
    if grant.queues is not None:
        todos.get(conn, id=id, endpoint_id=grant.endpoint_id, granted_queues=grant.queues)


# --- list cursors -----------------------------------------------------------------------------


def encode_cursor(todo: Todo) -> str:
    """The opaque keyset cursor after ``todo``: (created_at, id)."""
    raw = f"{todo.created_at.isoformat()}|{todo.id}".encode()
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, UUID]:
    """The keyset of a cursor; raises Invalid naming ``after`` when it is not one of ours."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, _, id = raw.partition("|")
        at = datetime.fromisoformat(created_at)
        if at.tzinfo is None:
            raise ValueError("naive cursor time")
        return at, UUID(id)
    except (ValueError, binascii.Error):  # UnicodeDecodeError is a ValueError
        raise Invalid({"after": ["not a cursor returned by list_todos"]}) from None


# --- admission (SPEC §4-5) --------------------------------------------------------------------


class AdmissionStatusArgs(Schema):
    queue = fields.String(
        validate=FullMatch(QUEUE_PATTERN),
        metadata={"description": "one of your queues (default: every budgeted queue you drain)"},
    )


class AdmissionStatusResult(Schema):
    queues = fields.List(
        fields.Nested(QueueStatusSchema),
        required=True,
        metadata={"description": "budgeted queues only; a queue without a policy is not listed"},
    )


class SetPolicyArgs(Schema):
    queue = fields.String(required=True, validate=FullMatch(QUEUE_PATTERN))
    policy = fields.Nested(
        PolicyInputSchema,
        required=True,
        metadata={"description": "a full replace: limits left out are unset"},
    )


class PolicyResult(Schema):
    policy = fields.Nested(PolicySchema, required=True)


class ClearPolicyArgs(Schema):
    queue = fields.String(required=True, validate=FullMatch(QUEUE_PATTERN))


class ClearedResult(Schema):
    cleared = fields.Boolean(
        required=True, metadata={"description": "false: the queue had no policy"}
    )


def _own_queue(call: Call, queue: str) -> None:
    granted = call.agent.grant.queues
    if granted is not None and queue not in granted:
        raise Forbidden(f"this grant does not cover queue {queue!r}")


@tool(
    "admission_status",
    title="Admission status",
    description="Budgets of your queues now: limits, used and remaining in the current window, "
    "in flight, whether work is deferred, why, and when it becomes eligible.",
    input=AdmissionStatusArgs,
    output=AdmissionStatusResult,
    read_only=True,
    verbs=("admission_status", "claim", "claim_next"),
)
def admission_status(call: Call) -> dict[str, Any]:
    """Queue statuses of the grant's budgeted queues; raises Forbidden for another queue."""
    grant, queue = call.agent.grant, call.args.get("queue")
    if queue is not None:
        _own_queue(call, queue)
    with call.db.transaction() as conn:
        statuses = admission.queue_statuses(
            conn,
            endpoint_ids=[grant.endpoint_id],
            queues=[queue] if queue is not None else grant.queues,
        )
    return {"queues": [dump_queue_status(call.agent.endpoint, s) for s in statuses]}


@tool(
    "set_admission_policy",
    title="Set a queue budget",
    description="Create or replace the admission policy of one of your queues (this changes your "
    "own budget; the change is audited with you and the human who granted your token).",
    input=SetPolicyArgs,
    output=PolicyResult,
    idempotent=True,
)
def set_admission_policy(call: Call) -> dict[str, Any]:
    """Put the policy (the operator API's service); raises Forbidden or Invalid."""
    queue, grant = call.args["queue"], call.agent.grant
    _own_queue(call, queue)
    with call.db.transaction() as conn:
        policy = admission.put_policy(
            conn,
            endpoint=accounts_store.get_endpoint(conn, key=str(grant.endpoint_id)),
            queue=queue,
            data=call.args["policy"],
            actor_human_id=grant.granted_by_human_id,
            actor_endpoint_id=grant.endpoint_id,
        )
        doorbells.policy_written(conn, endpoint_id=grant.endpoint_id, queue=queue)
    return {"policy": policy.as_json()}


@tool(
    "clear_admission_policy",
    title="Clear a queue budget",
    description="Remove the admission policy of one of your queues: claims run unbudgeted at "
    "once. Audited like set_admission_policy.",
    input=ClearPolicyArgs,
    output=ClearedResult,
    destructive=True,
    idempotent=True,
)
def clear_admission_policy(call: Call) -> dict[str, Any]:
    """Delete the policy; ``cleared: false`` when there was none. Raises Forbidden."""
    queue, grant = call.args["queue"], call.agent.grant
    _own_queue(call, queue)
    try:
        with call.db.transaction() as conn:
            admission.delete_policy(
                conn,
                endpoint=accounts_store.get_endpoint(conn, key=str(grant.endpoint_id)),
                queue=queue,
                actor_human_id=grant.granted_by_human_id,
                actor_endpoint_id=grant.endpoint_id,
            )
            doorbells.policy_written(conn, endpoint_id=grant.endpoint_id, queue=queue, cleared=True)
    except NotFound:
        return {"cleared": False}
    return {"cleared": True}
