"""Domain input schemas (marshmallow), shared by the service layer and every surface."""

from __future__ import annotations

import re
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate

from switchboard.errors import Invalid

QUEUE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$"
SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
TITLE_MAX = 500
BODY_MAX = 65536


class FullMatch(validate.Validator):
    """The whole value matches ``pattern`` (re.match with ``$`` lets a trailing newline in)."""

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self._regex = re.compile(pattern)

    def __call__(self, value: Any) -> Any:
        if not isinstance(value, str) or self._regex.fullmatch(value) is None:
            raise ValidationError(f"must match {self.pattern}")
        return value


def no_nul(value: Any) -> None:
    """PostgreSQL text and jsonb cannot hold NUL: refuse it anywhere in the value."""
    if has_nul(value):
        raise ValidationError("must not contain NUL characters")


def has_nul(value: Any) -> bool:
    """Whether a string anywhere in the JSON value (keys included) holds U+0000, which
    PostgreSQL text and jsonb cannot store. Iterative: a deeply nested value must not
    exhaust the interpreter's recursion limit."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


class NewTodoSchema(Schema):
    """What a caller may set on a new todo; defaults for attempts and lease come from config."""

    queue = fields.String(required=True, validate=FullMatch(QUEUE_PATTERN))
    title = fields.String(required=True, validate=[validate.Length(min=1, max=TITLE_MAX), no_nul])
    body = fields.String(load_default="", validate=[validate.Length(max=BODY_MAX), no_nul])
    payload = fields.Dict(load_default=dict, validate=no_nul)
    max_attempts = fields.Integer(load_default=None, validate=validate.Range(min=1, max=100))
    lease_seconds = fields.Integer(load_default=None, validate=validate.Range(min=1, max=86400))


class NewEndpointSchema(Schema):
    slug = fields.String(required=True, validate=FullMatch(SLUG_PATTERN))
    display_name = fields.String(load_default="", validate=validate.Length(max=200))
    notify_url = fields.Url(
        load_default=None, allow_none=True, schemes={"http", "https"}, require_tld=False
    )


class NewHumanSchema(Schema):
    email = fields.Email(required=True, validate=validate.Length(max=254))
    display_name = fields.String(load_default="", validate=validate.Length(max=200))
    password = fields.String(load_default=None, allow_none=True, validate=validate.Length(min=8))
    is_admin = fields.Boolean(load_default=False)


def load(schema: Schema, data: Any) -> dict[str, Any]:
    """Validate ``data`` with the schema; raises Invalid naming each bad field."""
    if not isinstance(data, dict):
        raise Invalid({"_schema": ["expected a JSON object"]})
    try:
        loaded: dict[str, Any] = schema.load(data)
    except ValidationError as exc:
        messages = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
        raise Invalid(messages) from None
    return loaded
