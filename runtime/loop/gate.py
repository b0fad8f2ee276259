"""The gates of a Requested call: permission, plugins, argument validation, and waits.

``decide`` returns what the gates decided, as a value; the driver commits it before anything
happens outside (DESIGN.md "One Step"): Completed when the call is blocked, Awaiting with its
ResumeTicket when a person must answer, otherwise Executing right before the effect.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime import delegation
from runtime.agents import Agent
from runtime.domain.model import Permission, TicketKind, ToolCall
from runtime.hooks import call_hooks
from runtime.loop.boundary import Boundary
from runtime.tools import Tool, ToolArgumentsError
from runtime.untrusted import UntrustedJSONError, check_schema

STRICTNESS = [Permission.ALLOW, Permission.ASK, Permission.DENY]


@dataclass(frozen=True, slots=True)
class Block:
    """The call never runs: it completes with ``reason`` as an error result for the model."""

    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    """The call waits on a new ticket of ``kind`` (a person approves or answers)."""

    kind: TicketKind
    request: dict[str, Any]
    schema: Any = None


@dataclass(frozen=True, slots=True)
class Go:
    """The call executes now, with its validated arguments."""

    tool: Tool
    arguments: dict[str, Any]


Decision = Block | Wait | Go


def decide(d: Boundary, agent: Agent, call: ToolCall) -> Decision:
    """What the gates decide for the Requested ``call`` (no commit, no effect)."""
    assert d.run is not None
    tool = agent.tool_for(call)
    if tool is None:
        return Block(f"Unknown tool {call.name!r}; it was not run.")
    answers = call_hooks(agent.plugins, "gate", d.run, call)
    permission = max((call.permission, *filter(None, answers)), key=STRICTNESS.index)
    if permission is Permission.DENY:
        return Block(f"The tool {call.name} is not permitted; it was not run.")
    try:
        arguments = tool.parse(call.arguments_text)
    except ToolArgumentsError as exc:
        return Block(str(exc))
    refused = tool.delegate and delegation.refusal(
        d.run, call, tuple(t.name for t in agent.tools if t.delegate)
    )
    if refused:
        return Block(refused)
    if tool.input_wait is not None:
        request, schema = tool.input_wait.build(arguments)
        try:
            check_schema(schema)
        except UntrustedJSONError as exc:
            return Block(f"No input was asked: {exc}.")
        return Wait(TicketKind.INPUT, request, schema)
    if permission is Permission.ASK:
        request = {"tool": call.name, "arguments": arguments, "operation_id": call.operation_id}
        return Wait(TicketKind.APPROVAL, request)
    return Go(tool, arguments)
