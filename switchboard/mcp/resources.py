"""Queues as MCP resources (SPEC §7 R-BELL): ``switchboard://queues/{endpoint}/{queue}`` for each
queue a grant may drain and ``switchboard://queues/{endpoint}`` for all of them. Reading one
returns its status JSON; subscribing to one is how an agent hears its doorbell."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from psycopg import Connection

from switchboard.admission import service as admission
from switchboard.doorbells import PENDING_CAP, queue_uri
from switchboard.mcp.auth import Agent
from switchboard.mcp.jsonrpc import INVALID_PARAMS, RpcError
from switchboard.store import accounts as accounts_store
from switchboard.store import doorbells as doorbell_store
from switchboard.store.doorbells import Ring
from switchboard.views.schemas import dump_queue_status

RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for an unknown resource
DRAIN_VERBS = frozenset({"claim", "claim_next"})
MIME = "application/json"


def may_listen(agent: Agent) -> bool:
    """Queues are resources for grants that may drain them."""
    return bool(DRAIN_VERBS & set(agent.grant.verbs))


def _queues(conn: Connection[Any], agent: Agent) -> list[str]:
    names = accounts_store.endpoint_queues(conn, endpoint_id=agent.grant.endpoint_id)
    granted = agent.grant.queues
    return names if granted is None else [name for name in names if name in granted]


def listing(conn: Connection[Any], agent: Agent) -> list[dict[str, Any]]:
    """``resources/list``: the endpoint resource, then one per drainable queue."""
    if not may_listen(agent):
        return []
    slug = agent.endpoint
    resources = [
        {
            "uri": queue_uri(slug),
            "name": slug,
            "title": f"All queues of {slug}",
            "description": "Subscribe to hear todo_ready for every queue you may drain.",
            "mimeType": MIME,
        }
    ]
    for queue in _queues(conn, agent):
        resources.append(
            {
                "uri": queue_uri(slug, queue),
                "name": f"{slug}/{queue}",
                "title": f"Queue {queue}",
                "description": "Pending and claimable counts and the admission status.",
                "mimeType": MIME,
            }
        )
    return resources


def resolve(agent: Agent, uri: Any) -> str | None:
    """The queue a resource URI names (None: the endpoint resource); raises RpcError for a URI
    that is not one of this grant's resources."""
    if not isinstance(uri, str):
        raise RpcError(INVALID_PARAMS, "Invalid params: uri must be a string")
    base = queue_uri(agent.endpoint)
    if not may_listen(agent) or not (uri == base or uri.startswith(base + "/")):
        raise RpcError(RESOURCE_NOT_FOUND, "Resource not found", data={"uri": uri})
    if uri == base:
        return None
    queue = uri[len(base) + 1 :]
    granted = agent.grant.queues
    if not queue or "/" in queue or (granted is not None and queue not in granted):
        raise RpcError(RESOURCE_NOT_FOUND, "Resource not found", data={"uri": uri})
    return queue


def read(
    conn: Connection[Any], agent: Agent, uri: Any, *, now: datetime | None = None
) -> dict[str, Any]:
    """``resources/read``: the queue's (or every drainable queue's) status as JSON text; the
    counts are exact up to 10,000 per state (PENDING_CAP), so a read stays cheap at any depth."""
    queue = resolve(agent, uri)
    at = now or datetime.now(UTC)
    queues = _queues(conn, agent) if queue is None else [queue]
    budgets = {
        status.queue: dump_queue_status(agent.endpoint, status)
        for status in admission.queue_statuses(
            conn, endpoint_ids=[agent.grant.endpoint_id], queues=queues, now=at
        )
    }
    statuses = [_status(conn, agent, name, budgets.get(name), at) for name in queues]
    document: dict[str, Any] = (
        {"endpoint": agent.endpoint, "queues": statuses} if queue is None else statuses[0]
    )
    text = json.dumps(document, default=_json_default, separators=(",", ":"))
    return {"contents": [{"uri": uri, "mimeType": MIME, "text": text}]}


def _status(
    conn: Connection[Any], agent: Agent, queue: str, budget: dict[str, Any] | None, now: datetime
) -> dict[str, Any]:
    endpoint_id = agent.grant.endpoint_id
    pending = doorbell_store.pending_count(
        conn, endpoint_id=endpoint_id, queue=queue, cap=PENDING_CAP
    )
    claimable = doorbell_store.claimable_count(
        conn, endpoint_id=endpoint_id, queue=queue, now=now, cap=PENDING_CAP
    )
    return {
        "endpoint": agent.endpoint,
        "queue": queue,
        "pending": pending,
        "claimable": claimable,
        "admission": budget,
    }


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def honoured(agent: Agent, uris: Iterable[Any]) -> list[str]:
    """The subset of requested URIs that are this grant's resources (what a listen honours)."""
    kept = []
    for uri in uris:
        try:
            resolve(agent, uri)
        except RpcError:
            continue
        if uri not in kept:
            kept.append(uri)
    return kept


def notifications(rings: Iterable[Ring], subscribed: Iterable[str]) -> list[dict[str, Any]]:
    """``notifications/resources/updated`` for each subscribed URI a ring falls under (its
    queue's or its endpoint's), carrying the todo_ready in ``_meta``."""
    uris = set(subscribed)
    out = []
    for ring in rings:
        todo_ready = {
            "endpoint": ring.endpoint,
            "queue": ring.queue,
            "pending": ring.pending,
            "cause": ring.cause,
        }
        for uri in (queue_uri(ring.endpoint, ring.queue), queue_uri(ring.endpoint)):
            if uri in uris:
                out.append(
                    {
                        "jsonrpc": "2.0",
                        "method": "notifications/resources/updated",
                        "params": {"uri": uri, "_meta": {"switchboard/todo_ready": todo_ready}},
                    }
                )
    return out
