"""The verbs a grant can hold (SPEC §5). One module, so every surface agrees."""

from __future__ import annotations

BASIC_VERBS: tuple[str, ...] = ("whoami", "create_todo", "get_todo", "list_todos")
DRAIN_VERBS: tuple[str, ...] = (
    "claim",
    "claim_next",
    "heartbeat",
    "complete",
    "fail",
    "release",
    "admission_status",
)
# Lets the agent change its own budget: listed by the wizard, never in the default vend.
ADMISSION_VERBS: tuple[str, ...] = ("set_admission_policy", "clear_admission_policy")
ALL_VERBS: tuple[str, ...] = BASIC_VERBS + DRAIN_VERBS + ADMISSION_VERBS
