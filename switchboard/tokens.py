"""Bearer tokens: ``sbo_`` for humans (REST, CLI), ``sba_`` for agent grants (MCP).

Only the SHA-256 of a token is stored; the token itself is shown once, at creation.
"""

from __future__ import annotations

import hashlib
import secrets

HUMAN_PREFIX = "sbo_"
AGENT_PREFIX = "sba_"


def new_token(prefix: str) -> tuple[str, bytes]:
    """A fresh random token with the prefix, and the hash to store."""
    token = prefix + secrets.token_urlsafe(32)
    return token, hash_token(token)


def hash_token(token: str) -> bytes:
    """The stored form of a token."""
    return hashlib.sha256(token.encode("utf-8")).digest()
