"""Table maintenance: keeping the claim indexes free of dead entries."""

from __future__ import annotations

from typing import Any

from psycopg import Connection

from switchboard.store import load_queries

_Q = load_queries("maintenance")


def dead_tuples(conn: Connection[Any]) -> int:
    """Dead row versions in todos according to the statistics collector."""
    row = conn.execute(_Q["dead_tuples"]).fetchone()
    return int(row[0]) if row else 0


def vacuum_todos(conn: Connection[Any]) -> None:
    """VACUUM todos with index cleanup; ``conn`` must be in autocommit."""
    conn.execute(_Q["vacuum_todos"])
