"""The MCP surface for agents (SPEC §5 R-MCP): JSON-RPC 2.0 over Streamable HTTP at ``/mcp``.

Part of the view layer: ``switchboard/views/mcp.py`` is its Flask glue, and it reuses the wire
schemas (``views/schemas.py``) and the one error mapping (``views/errors.py``).

- ``jsonrpc``: message parsing and JSON-RPC error codes;
- ``protocol``: revisions, era selection, the 2026-07-28 envelope and header checks;
- ``jsonschema``: marshmallow schemas as JSON Schema (``inputSchema`` / ``outputSchema``);
- ``registry`` and ``tools``: the tool registry and the tools;
- ``security``: Origin and Host checks; ``auth``: the bearer grant;
- ``sessions``: legacy sessions (stored in PostgreSQL); ``streams``: SSE streams;
- ``server``: the dispatcher the view calls.
"""
