"""Humans, their API tokens, endpoints and agent grants."""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import Connection
from werkzeug.security import generate_password_hash

from switchboard import tokens
from switchboard.errors import Invalid
from switchboard.models import Endpoint, Grant, Human
from switchboard.schemas import QUEUE_PATTERN, NewEndpointSchema, NewHumanSchema, load
from switchboard.store import accounts
from switchboard.verbs import ALL_VERBS, BASIC_VERBS

_NEW_HUMAN = NewHumanSchema()
_NEW_ENDPOINT = NewEndpointSchema()


@dataclass(frozen=True)
class NewHuman:
    human: Human
    token: str  # shown once


@dataclass(frozen=True)
class NewGrant:
    grant: Grant
    token: str  # shown once


def create_human(conn: Connection[Any], *, data: Any) -> NewHuman:
    """Create a human and its first API token; raises Invalid (bad or taken email)."""
    fields = load(_NEW_HUMAN, data)
    password = fields["password"]
    human = accounts.create_human(
        conn,
        email=fields["email"],
        display_name=fields["display_name"] or fields["email"].split("@")[0],
        password_hash=generate_password_hash(password) if password else None,
        is_admin=fields["is_admin"],
    )
    token, token_hash = tokens.new_token(tokens.HUMAN_PREFIX)
    accounts.create_api_token(conn, human_id=human.id, name="first token", token_hash=token_hash)
    return NewHuman(human=human, token=token)


def bootstrap(conn: Connection[Any], *, email: str, password: str | None) -> NewHuman:
    """Create the first admin; raises Invalid when that human already exists."""
    if accounts.find_human_by_email(conn, email=email) is not None:
        raise Invalid({"email": [f"{email} already exists; bootstrap runs once per admin"]})
    return create_human(conn, data={"email": email, "password": password, "is_admin": True})


def authenticate_human(conn: Connection[Any], *, token: str) -> Human | None:
    """The human behind a live ``sbo_`` token, or None."""
    if not token.startswith(tokens.HUMAN_PREFIX):
        return None
    return accounts.authenticate_api_token(conn, token_hash=tokens.hash_token(token))


def create_endpoint(conn: Connection[Any], *, owner: Human, data: Any) -> Endpoint:
    """Create an endpoint owned by the human; raises Invalid or Conflict (slug taken)."""
    fields = load(_NEW_ENDPOINT, data)
    return accounts.create_endpoint(
        conn,
        slug=fields["slug"],
        display_name=fields["display_name"] or fields["slug"],
        owner_human_id=owner.id,
        notify_url=fields["notify_url"],
        notify_secret=secrets.token_hex(32),
    )


def create_grant(
    conn: Connection[Any],
    *,
    endpoint: Endpoint,
    granted_by: Human,
    verbs: Sequence[str] | None = None,
    queues: Sequence[str] | None = None,
) -> NewGrant:
    """Vend an agent token for the endpoint (default verbs: BASIC_VERBS); raises Invalid."""
    chosen = list(BASIC_VERBS) if verbs is None else list(dict.fromkeys(verbs))
    unknown = [verb for verb in chosen if verb not in ALL_VERBS]
    if unknown or not chosen:
        raise Invalid(
            {
                "verbs": [
                    f"unknown verbs: {', '.join(unknown)}"
                    if unknown
                    else "at least one verb is required"
                ]
            }
        )
    if queues is not None:
        _check_queue_names(queues)
    token, token_hash = tokens.new_token(tokens.AGENT_PREFIX)
    grant = accounts.create_grant(
        conn,
        endpoint_id=endpoint.id,
        token_hash=token_hash,
        verbs=chosen,
        queues=list(dict.fromkeys(queues)) if queues is not None else None,
        granted_by_human_id=granted_by.id,
    )
    return NewGrant(grant=grant, token=token)


def authenticate_grant(conn: Connection[Any], *, token: str) -> Grant | None:
    """The live grant behind an ``sba_`` token, or None."""
    if not token.startswith(tokens.AGENT_PREFIX):
        return None
    return accounts.authenticate_grant(conn, token_hash=tokens.hash_token(token))


def authenticate_agent(conn: Connection[Any], *, token: str) -> tuple[Grant, str] | None:
    """The live grant behind an ``sba_`` token and its endpoint's slug, or None."""
    if not token.startswith(tokens.AGENT_PREFIX):
        return None
    return accounts.authenticate_agent(conn, token_hash=tokens.hash_token(token))


def _check_queue_names(queues: Sequence[str]) -> None:
    bad = [q for q in queues if not isinstance(q, str) or not re.fullmatch(QUEUE_PATTERN, q)]
    if bad or not queues:
        raise Invalid(
            {
                "queues": [
                    f"invalid queue names: {bad}"
                    if bad
                    else "an empty list grants nothing; omit it for every queue"
                ]
            }
        )
