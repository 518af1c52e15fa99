"""Humans, API tokens, endpoints and grants. Tokens arrive here already hashed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from uuid import UUID

from psycopg import Connection, errors
from psycopg.rows import class_row, kwargs_row

from switchboard.errors import Conflict, Invalid, NotFound
from switchboard.models import ApiToken, Endpoint, Grant, Human
from switchboard.store import load_queries

_Q = load_queries("accounts")


def create_human(
    conn: Connection[Any],
    *,
    email: str,
    display_name: str,
    password_hash: str | None,
    is_admin: bool,
) -> Human:
    """Insert a human; raises Invalid when the email is taken."""
    try:
        with conn.transaction(), conn.cursor(row_factory=class_row(Human)) as cur:
            row = cur.execute(
                _Q["human_create"],
                {
                    "email": email,
                    "display_name": display_name,
                    "password_hash": password_hash,
                    "is_admin": is_admin,
                },
            ).fetchone()
    except errors.UniqueViolation:
        raise Invalid({"email": ["a human with this email already exists"]}) from None
    assert row is not None
    return row


def get_human(conn: Connection[Any], *, id: UUID) -> Human:
    """The human by id; raises NotFound."""
    with conn.cursor(row_factory=class_row(Human)) as cur:
        row = cur.execute(_Q["human_get"], {"id": id}).fetchone()
    if row is None:
        raise NotFound(f"human {id} not found")
    return row


def find_human_by_email(conn: Connection[Any], *, email: str) -> Human | None:
    """The human with this email (case-insensitive), or None."""
    with conn.cursor(row_factory=class_row(Human)) as cur:
        return cur.execute(_Q["human_get_by_email"], {"email": email}).fetchone()


def create_api_token(
    conn: Connection[Any], *, human_id: UUID, name: str, token_hash: bytes
) -> ApiToken:
    """Store a new API token's hash."""
    with conn.cursor(row_factory=class_row(ApiToken)) as cur:
        row = cur.execute(
            _Q["api_token_create"], {"human_id": human_id, "name": name, "token_hash": token_hash}
        ).fetchone()
    assert row is not None
    return row


def authenticate_api_token(conn: Connection[Any], *, token_hash: bytes) -> Human | None:
    """The human behind a live API token, or None."""
    with conn.cursor(row_factory=class_row(Human)) as cur:
        return cur.execute(_Q["api_token_authenticate"], {"token_hash": token_hash}).fetchone()


def create_endpoint(
    conn: Connection[Any],
    *,
    slug: str,
    display_name: str,
    owner_human_id: UUID,
    notify_url: str | None,
    notify_secret: str,
) -> Endpoint:
    """Insert an endpoint; raises Conflict when the slug is taken."""
    try:
        with conn.transaction(), conn.cursor(row_factory=class_row(Endpoint)) as cur:
            row = cur.execute(
                _Q["endpoint_create"],
                {
                    "slug": slug,
                    "display_name": display_name,
                    "owner_human_id": owner_human_id,
                    "notify_url": notify_url,
                    "notify_secret": notify_secret,
                },
            ).fetchone()
    except errors.UniqueViolation:
        raise Conflict(f"endpoint {slug!r} already exists", details={"field": "slug"}) from None
    assert row is not None
    return row


def get_endpoint(
    conn: Connection[Any], *, key: str, owner_human_id: UUID | None = None
) -> Endpoint:
    """An endpoint by slug or id, optionally only if owned by the human; raises NotFound."""
    with conn.cursor(row_factory=class_row(Endpoint)) as cur:
        row = cur.execute(
            _Q["endpoint_get"],
            {"key": key, "key_id": _uuid_or_none(key), "owner_human_id": owner_human_id},
        ).fetchone()
    if row is None:
        raise NotFound(f"endpoint {key!r} not found")
    return row


def _uuid_or_none(key: str) -> UUID | None:
    try:
        return UUID(key)
    except ValueError:
        return None


def list_endpoints(conn: Connection[Any], *, owner_human_id: UUID | None) -> list[Endpoint]:
    """Endpoints owned by the human (None: all), by slug."""
    with conn.cursor(row_factory=class_row(Endpoint)) as cur:
        return cur.execute(_Q["endpoint_list"], {"owner_human_id": owner_human_id}).fetchall()


def endpoint_queues(conn: Connection[Any], *, endpoint_id: UUID) -> list[str]:
    """The names of the endpoint's queues, sorted."""
    rows = conn.execute(_Q["endpoint_queues"], {"endpoint_id": endpoint_id}).fetchall()
    return [row[0] for row in rows]


def create_grant(
    conn: Connection[Any],
    *,
    endpoint_id: UUID,
    token_hash: bytes,
    verbs: Sequence[str],
    queues: Sequence[str] | None,
    granted_by_human_id: UUID,
) -> Grant:
    """Store an agent grant for one endpoint."""
    with conn.cursor(row_factory=class_row(Grant)) as cur:
        row = cur.execute(
            _Q["grant_create"],
            {
                "endpoint_id": endpoint_id,
                "token_hash": token_hash,
                "verbs": list(verbs),
                "queues": list(queues) if queues is not None else None,
                "granted_by_human_id": granted_by_human_id,
            },
        ).fetchone()
    assert row is not None
    return row


def authenticate_grant(conn: Connection[Any], *, token_hash: bytes) -> Grant | None:
    """The live grant behind an agent token, or None."""
    with conn.cursor(row_factory=class_row(Grant)) as cur:
        return cur.execute(_Q["grant_authenticate"], {"token_hash": token_hash}).fetchone()


def authenticate_agent(conn: Connection[Any], *, token_hash: bytes) -> tuple[Grant, str] | None:
    """The live grant behind an agent token and its endpoint's slug, or None."""
    with conn.cursor(row_factory=kwargs_row(_grant_and_slug)) as cur:
        return cur.execute(_Q["agent_authenticate"], {"token_hash": token_hash}).fetchone()


def _grant_and_slug(*, endpoint_slug: str, **columns: Any) -> tuple[Grant, str]:
    return Grant(**columns), endpoint_slug


def list_grants(conn: Connection[Any], *, endpoint_id: UUID) -> list[Grant]:
    """The endpoint's grants, oldest first (revoked ones included)."""
    with conn.cursor(row_factory=class_row(Grant)) as cur:
        return cur.execute(_Q["grant_list"], {"endpoint_id": endpoint_id}).fetchall()


def revoke_grant(conn: Connection[Any], *, id: UUID, endpoint_ids: Sequence[UUID]) -> Grant:
    """Revoke a grant of one of the given endpoints (idempotent); raises NotFound."""
    with conn.cursor(row_factory=class_row(Grant)) as cur:
        row = cur.execute(
            _Q["grant_revoke"], {"id": id, "endpoint_ids": list(endpoint_ids)}
        ).fetchone()
    if row is None:
        raise NotFound(f"grant {id} not found")
    return row
