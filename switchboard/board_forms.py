"""The board's HTML forms as marshmallow schemas: strings in, typed values out.

Form posts carry strings (an empty field is an empty string); these schemas turn them into
the same bodies the REST API takes, so the services validate both surfaces alike.
"""

from __future__ import annotations

import re
from typing import Any

from marshmallow import EXCLUDE, Schema, fields, pre_load, validate

from switchboard.admission.service import parse_policy
from switchboard.admission.windows import PERIODS, WEEKDAYS
from switchboard.errors import Invalid
from switchboard.schemas import load
from switchboard.verbs import ALL_VERBS


def _blank_to_none(data: Any, names: tuple[str, ...]) -> Any:
    if not isinstance(data, dict):
        return data
    return {k: (None if k in names and not str(v).strip() else v) for k, v in data.items()}


class FormSchema(Schema):
    """A form post also carries ``csrf`` and buttons' names: fields not asked for are dropped."""

    class Meta:
        unknown = EXCLUDE


class LoginForm(FormSchema):
    email = fields.String(required=True, validate=validate.Length(min=1, max=254))
    password = fields.String(required=True, validate=validate.Length(min=1, max=1000))
    next = fields.String(load_default="")


class BudgetForm(FormSchema):
    """The Budget editor. Numbers may be blank (no such limit); no period means no window."""

    max_in_flight = fields.Integer(load_default=None, allow_none=True)
    max_claims_per_window = fields.Integer(load_default=None, allow_none=True)
    period = fields.String(load_default=None, allow_none=True, validate=validate.OneOf(PERIODS))
    tz = fields.String(load_default="UTC")
    start = fields.String(load_default="00:00")
    weekday = fields.String(load_default=None, allow_none=True, validate=validate.OneOf(WEEKDAYS))

    @pre_load
    def _blanks(self, data: Any, **_: Any) -> Any:
        names = ("max_in_flight", "max_claims_per_window", "period", "weekday")
        return _blank_to_none(data, names)


def policy_body(form: dict[str, Any]) -> dict[str, Any]:
    """The policy body (Appendix A) of a loaded BudgetForm; parse_policy validates it."""
    window = None
    if form["period"] is not None:
        window = {
            "period": form["period"],
            "tz": form["tz"].strip(),
            "start": form["start"].strip(),
            "weekday": form["weekday"] if form["period"] == "week" else None,
        }
    return {
        "max_in_flight": form["max_in_flight"],
        "max_claims_per_window": form["max_claims_per_window"],
        "window": window,
    }


def load_budget(form: dict[str, str]) -> dict[str, Any]:
    """The policy body of the Budget editor's fields; raises Invalid naming every bad form
    field at once: a number that is not one, and whatever the policy rules refuse."""
    try:
        loaded, problems = load(BudgetForm(), dict(form)), {}
    except Invalid as error:
        problems = {name: _texts(texts) for name, texts in error.fields.items()}
        rest = {name: value for name, value in form.items() if name not in problems}
        loaded = load(BudgetForm(), rest)
    body = policy_body(loaded)
    try:
        parse_policy(body)
    except Invalid as error:
        for name, texts in field_errors(error).items():
            if name not in problems and not (name == "_schema" and problems):
                problems[name] = texts
    if problems:
        raise Invalid(problems)
    return body


def field_errors(error: Invalid) -> dict[str, list[str]]:
    """A policy's Invalid as messages per form field: ``window.tz`` is the ``tz`` field, a
    message about the window as a whole belongs to ``period``, ``_schema`` to the form."""
    flat: dict[str, list[str]] = {}
    for name, messages in error.fields.items():
        if isinstance(messages, dict):
            for inner, texts in messages.items():
                key = "period" if inner == "_schema" else inner
                flat.setdefault(key, []).extend(_texts(texts))
        else:
            key = "period" if name == "window" else name
            flat.setdefault(key, []).extend(_texts(messages))
    return flat


def _texts(messages: Any) -> list[str]:
    if isinstance(messages, list):
        return [str(m) for m in messages]
    if isinstance(messages, dict):
        return [str(m) for texts in messages.values() for m in _texts(texts)]
    return [str(messages)]


class NewTodoForm(FormSchema):
    title = fields.String(required=True)
    body = fields.String(load_default="")


class AgentForm(FormSchema):
    """The new-agent wizard: an endpoint (new or one of mine), its queues, its verbs."""

    endpoint = fields.String(required=True)
    display_name = fields.String(load_default="")
    queues = fields.String(load_default="")
    verbs = fields.List(fields.String(validate=validate.OneOf(ALL_VERBS)), load_default=list)


def load_agent_form(data: dict[str, Any]) -> dict[str, Any]:
    """The wizard's fields; ``queues`` split on commas and spaces (none: every queue)."""
    form = load(AgentForm(), data)
    names = [q for q in re.split(r"[\s,]+", form["queues"]) if q]
    form["queue_list"] = names or None
    form["endpoint"] = form["endpoint"].strip()
    if not form["verbs"]:
        raise Invalid({"verbs": ["choose at least one verb"]})
    return form
