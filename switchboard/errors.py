"""Typed domain errors. ``views/errors.py`` is the only place that maps them to wire codes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class SwitchboardError(Exception):
    """Base of every domain error: a stable ``code``, a message and optional details."""

    code: ClassVar[str] = "error"

    def __init__(self, message: str, *, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})


class NotFound(SwitchboardError):
    """The thing does not exist, or is outside the caller's scope (never distinguished)."""

    code = "not_found"


class Conflict(SwitchboardError):
    """The thing exists but is in a state that does not allow the operation."""

    code = "conflict"


class Deferred(SwitchboardError):
    """Admission control refused a claim for now; details say why and until when."""

    code = "deferred"


class Forbidden(SwitchboardError):
    """The caller is known but may not do this."""

    code = "forbidden"


class Unauthorized(SwitchboardError):
    """No valid credential was presented."""

    code = "unauthorized"


class Invalid(SwitchboardError):
    """Input failed validation; ``details["fields"]`` maps each field to its messages."""

    code = "invalid_params"

    def __init__(self, fields: Mapping[str, Any], message: str | None = None) -> None:
        names = ", ".join(sorted(fields))
        super().__init__(message or f"invalid {names}", details={"fields": dict(fields)})
        self.fields = dict(fields)


class AdmissionUnavailable(SwitchboardError):
    """Admission could not be evaluated (e.g. a zone the embedded tzdata lacks): fail closed."""

    code = "admission_unavailable"
