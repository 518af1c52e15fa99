"""The store: the only code that holds SQL. Each module loads its named blocks from a .sql file.

Store functions take a connection first and keyword arguments after it, never commit, and
return typed rows. Callers compose them inside one ``db.transaction()``.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import LiteralString

_BLOCK = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def load_queries(module: str) -> dict[str, LiteralString]:
    """Parse ``<module>.sql`` beside this package into {name: statement} (once, at import)."""
    text = files(__package__).joinpath(f"{module}.sql").read_text(encoding="utf-8")
    parts = _BLOCK.split(text)
    queries: dict[str, LiteralString] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in queries:
            raise RuntimeError(f"duplicate query {name!r} in {module}.sql")
        queries[name] = compact(body)
    return queries


def compact(sql: str) -> str:
    """The statement without comments and indentation. psycopg caches the parse of statements
    up to 4 kB only, and the claim statements are read on every claim."""
    lines = (_strip_comment(line).strip() for line in sql.splitlines())
    return "\n".join(line for line in lines if line)


def _strip_comment(line: str) -> str:
    quoted = False
    for index, char in enumerate(line):
        if char == "'":
            quoted = not quoted
        elif not quoted and line.startswith("--", index):
            return line[:index]
    return line
