"""marshmallow schemas as JSON Schema (2020-12), for MCP ``inputSchema`` and ``outputSchema``.

Why not apispec's marshmallow plugin: MCP wants self-contained schemas (no ``$ref`` into
``#/components/schemas``, which an MCP client cannot resolve), with ``additionalProperties``
following the schema's ``unknown`` policy, nullable fields as ``anyOf`` a null branch, and our own
validators (``FullMatch``) as ``pattern``; apispec gives the OpenAPI dialect with component
references and needs an ``APISpec`` and a plugin hook for each of those. This converter is the
small, exact subset our schemas use, and fails loudly (TypeError) on a field it does not know,
so a schema never silently advertises less than it checks.
"""

from __future__ import annotations

from typing import Any, Literal

from marshmallow import RAISE, Schema, fields, validate

from switchboard.schemas import FullMatch

Mode = Literal["load", "dump"]

# Checked in order: subclasses before their bases (Email and Url are Strings, AwareDateTime
# is a DateTime, Integer is a Number).
_SIMPLE: tuple[tuple[type[fields.Field[Any]], dict[str, Any]], ...] = (
    (fields.Email, {"type": "string", "format": "email"}),
    (fields.Url, {"type": "string", "format": "uri"}),
    (fields.UUID, {"type": "string", "format": "uuid"}),
    (fields.String, {"type": "string"}),
    (fields.Integer, {"type": "integer"}),
    (fields.Number, {"type": "number"}),
    (fields.Boolean, {"type": "boolean"}),
    (fields.DateTime, {"type": "string", "format": "date-time"}),
    (fields.Date, {"type": "string", "format": "date"}),
)


def schema_to_jsonschema(schema: Schema | type[Schema], *, mode: Mode) -> dict[str, Any]:
    """The JSON Schema of ``schema`` for loading (tool input) or dumping (tool output).

    Input schemas are closed (``additionalProperties: false``) when the schema raises on
    unknown keys; output schemas stay open so that adding a field is not a breaking change.
    Raises TypeError for a field type this converter does not know.
    """
    instance = schema() if isinstance(schema, type) else schema
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, field in instance.fields.items():
        if (mode == "load" and field.dump_only) or (mode == "dump" and field.load_only):
            continue
        key = field.data_key or name
        properties[key] = field_to_jsonschema(field, mode=mode)
        if field.required:
            required.append(key)
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    if mode == "load" and instance.unknown == RAISE:
        result["additionalProperties"] = False
    return result


def field_to_jsonschema(field: fields.Field[Any], *, mode: Mode) -> dict[str, Any]:
    """One field's JSON Schema: its type, its validators, nullability and description."""
    result = _base(field, mode=mode)
    for validator in field.validators:
        result.update(_constraint(validator, result.get("type")))
    if field.allow_none:
        result = _nullable(result)
    description = field.metadata.get("description")
    if description:
        result["description"] = description
    default = field.load_default
    if mode == "load" and isinstance(default, bool | int | float | str):
        result["default"] = default
    return result


def _base(field: fields.Field[Any], *, mode: Mode) -> dict[str, Any]:
    if isinstance(field, fields.Nested):
        nested = schema_to_jsonschema(field.schema, mode=mode)
        return {"type": "array", "items": nested} if field.many else nested
    if isinstance(field, fields.List):
        return {"type": "array", "items": field_to_jsonschema(field.inner, mode=mode)}
    if isinstance(field, fields.Dict):
        result: dict[str, Any] = {"type": "object"}
        if field.value_field is not None:
            result["additionalProperties"] = field_to_jsonschema(field.value_field, mode=mode)
        return result
    for cls, shape in _SIMPLE:
        if isinstance(field, cls):
            return dict(shape)
    if type(field) is fields.Raw:
        return {}  # any JSON value
    raise TypeError(f"no JSON Schema for marshmallow field {type(field).__name__}")


def _constraint(validator: Any, kind: Any) -> dict[str, Any]:
    """The JSON Schema keywords for one validator ({} for one JSON Schema cannot say)."""
    if isinstance(validator, validate.Length):
        low, high = ("minItems", "maxItems") if kind == "array" else ("minLength", "maxLength")
        if validator.equal is not None:
            return {low: validator.equal, high: validator.equal}
        bounds = {low: validator.min, high: validator.max}
        return {key: value for key, value in bounds.items() if value is not None}
    if isinstance(validator, validate.Range):
        result: dict[str, Any] = {}
        if validator.min is not None:
            result["minimum" if validator.min_inclusive else "exclusiveMinimum"] = validator.min
        if validator.max is not None:
            result["maximum" if validator.max_inclusive else "exclusiveMaximum"] = validator.max
        return result
    if isinstance(validator, validate.OneOf):
        return {"enum": list(validator.choices)}
    if isinstance(validator, FullMatch):
        return {"pattern": validator.pattern}
    if isinstance(validator, validate.Regexp):
        return {"pattern": validator.regex.pattern}
    return {}


def _nullable(result: dict[str, Any]) -> dict[str, Any]:
    """Let the value be null too: ``anyOf`` a null branch, each branch of a single type (the
    portable spelling; a ``type`` list trips clients that map schemas to one-type dialects)."""
    if not result:
        return result  # already any value
    return {"anyOf": [result, {"type": "null"}]}
