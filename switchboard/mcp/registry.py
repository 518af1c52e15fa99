"""The tool registry: a tool is one function plus an input and an output marshmallow schema.

Adding a tool::

    @tool("frobnicate", title=..., description=..., input=FrobArgs, output=FrobResult)
    def frobnicate(call: Call) -> dict[str, Any]:
        ...

``tools/list`` shows a grant only the tools its verbs grant (by default the verb named like the
tool); calling another is a ``forbidden`` tool error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from marshmallow import Schema

from switchboard.db import Database
from switchboard.errors import Forbidden, Invalid, SwitchboardError
from switchboard.mcp.auth import Agent
from switchboard.mcp.jsonschema import schema_to_jsonschema
from switchboard.schemas import has_nul, load
from switchboard.services.todos import TodoDefaults
from switchboard.views.errors import tool_error


@dataclass(frozen=True)
class Call:
    """What a tool function receives: the caller, its arguments (loaded) and the app's services."""

    agent: Agent
    args: dict[str, Any]
    db: Database
    defaults: TodoDefaults


ToolFunction = Callable[[Call], dict[str, Any]]


@dataclass(frozen=True)
class Tool:
    """One MCP tool and the verbs of a grant that let an agent use it."""

    name: str
    title: str
    description: str
    input: Schema
    output: Schema
    function: ToolFunction
    verbs: frozenset[str]
    annotations: dict[str, Any]
    input_schema: dict[str, Any] = field(init=False, repr=False, compare=False)
    output_schema: dict[str, Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Converted once, at registration: a schema the converter cannot express fails here.
        object.__setattr__(self, "input_schema", schema_to_jsonschema(self.input, mode="load"))
        object.__setattr__(self, "output_schema", schema_to_jsonschema(self.output, mode="dump"))

    def granted(self, verbs: Iterable[str]) -> bool:
        """Whether a grant holding ``verbs`` may use this tool."""
        return not self.verbs.isdisjoint(verbs)

    def listing(self, *, structured: bool) -> dict[str, Any]:
        """The ``tools/list`` entry; ``structured`` revisions also get title and outputSchema."""
        entry: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
            "annotations": self.annotations,
        }
        if structured:
            entry["title"] = self.title
            entry["outputSchema"] = self.output_schema
        return entry


REGISTRY: dict[str, Tool] = {}


def tool(
    name: str,
    *,
    title: str,
    description: str,
    input: type[Schema],
    output: type[Schema],
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    verbs: Iterable[str] | None = None,
) -> Callable[[ToolFunction], ToolFunction]:
    """Register the decorated function as the tool ``name`` (granted by ``verbs``, default
    ``{name}``); raises ValueError for a name registered twice."""

    def register(function: ToolFunction) -> ToolFunction:
        if name in REGISTRY:
            raise ValueError(f"tool {name!r} is registered twice")
        REGISTRY[name] = Tool(
            name=name,
            title=title,
            description=description,
            input=input(),
            output=output(),
            function=function,
            verbs=frozenset(verbs or (name,)),
            annotations=_annotations(
                title, read_only=read_only, destructive=destructive, idempotent=idempotent
            ),
        )
        return function

    return register


def _annotations(
    title: str, *, read_only: bool, destructive: bool, idempotent: bool
) -> dict[str, Any]:
    # Absent hints default to destructive and open-world: say what each tool really is.
    hints: dict[str, Any] = {"title": title, "openWorldHint": False}
    if read_only:
        hints["readOnlyHint"] = True
        return hints
    hints["destructiveHint"] = destructive
    if idempotent:
        hints["idempotentHint"] = True
    return hints


def granted_tools(agent: Agent) -> list[Tool]:
    """The tools the agent's grant may use, in registration order."""
    return [t for t in REGISTRY.values() if t.granted(agent.grant.verbs)]


def run(
    tool: Tool, *, agent: Agent, arguments: dict[str, Any], db: Database, defaults: TodoDefaults
) -> tuple[dict[str, Any], bool]:
    """Call a tool: (structured result, False), or (``{"error": …}``, True) for a domain error
    — an ungranted tool (``forbidden``) and arguments its schema refuses (``invalid_params``)
    included. Other exceptions propagate."""
    try:
        if not tool.granted(agent.grant.verbs):
            raise Forbidden(f"this grant does not hold the verb {tool.name!r}")
        nul = sorted(key for key, value in arguments.items() if has_nul(key) or has_nul(value))
        if nul:  # PostgreSQL text and jsonb cannot hold U+0000
            raise Invalid({key: ["must not contain NUL (U+0000) characters"] for key in nul})
        args = load(tool.input, arguments)
        return tool.function(Call(agent=agent, args=args, db=db, defaults=defaults)), False
    except SwitchboardError as error:
        return tool_error(error), True


def result_content(
    structured: dict[str, Any], *, is_error: bool, with_structure: bool
) -> dict[str, Any]:
    """A ``tools/call`` result: the JSON as text, and as structuredContent where the revision
    has it."""
    result: dict[str, Any] = {
        "content": [{"type": "text", "text": json.dumps(structured, ensure_ascii=False)}],
        "isError": is_error,
    }
    if with_structure:
        result["structuredContent"] = structured
    return result
