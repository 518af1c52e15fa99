"""The caller of an MCP request: the agent grant behind its bearer token."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import Connection

from switchboard.errors import Unauthorized
from switchboard.models import Grant
from switchboard.services import accounts


@dataclass(frozen=True)
class Agent:
    """An authenticated agent: its grant and its endpoint's slug."""

    grant: Grant
    endpoint: str
    token: str  # kept to re-check the grant from a long-lived stream


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer …`` header, or None."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def authenticate(conn: Connection[Any], *, authorization: str | None) -> Agent:
    """The agent behind the header; raises Unauthorized (details say whether a token came)."""
    token = bearer_token(authorization)
    if token is None:
        raise Unauthorized(
            "an agent token is required: Authorization: Bearer sba_…", details={"token": False}
        )
    found = accounts.authenticate_agent(conn, token=token)
    if found is None:
        raise Unauthorized("the token is unknown or revoked", details={"token": True})
    grant, endpoint = found
    return Agent(grant=grant, endpoint=endpoint, token=token)
