"""Terminal-only child delegation: a delegate call starts a child Run and learns only its end.

Here: the limits a delegate call must pass (``refusal``) and the id of the child it starts.
The child is started by ``runtime.operations.start_child``; its end reaches its parent, and a
parent's end its children, through ``runtime.commits`` (issue 10's guarantees are stated
there and in ``start_child``).
"""

from __future__ import annotations

import uuid

from runtime import conf
from runtime.domain.delegation import check_limits
from runtime.domain.model import RunView, ToolCall
from runtime.errors import DelegationRefused

CHILD_NAMESPACE = uuid.UUID("6f1c8f52-5d2e-4f3e-9a57-0d3c6a1f6b11")


def child_run_id(operation_id: str) -> str:
    """The id of the child Run a delegate call starts: a function of its operation id."""
    return uuid.uuid5(CHILD_NAMESPACE, operation_id).hex


def refusal(run: RunView, call: ToolCall, delegates: tuple[str, ...]) -> str | None:
    """The error result for a delegate call the limits refuse, or None when it may start."""
    try:
        check_limits(
            run, call, delegates, conf.delegation_max_depth(), conf.delegation_max_children()
        )
    except DelegationRefused as exc:
        return f"{exc.message} ({exc.code})"
    return None
