"""The gates of a Requested call: permission, plugins, argument validation, and waits.

The outcome is committed before anything happens outside (DESIGN.md "One Step"): Completed
when the call is blocked, Awaiting with its ResumeTicket when a person must answer, otherwise
Executing right before the effect (``execute``).
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from runtime import delegation
from runtime.agents import Agent
from runtime.crash import crash_point
from runtime.domain.events import CallAwaiting, CallCompleted
from runtime.domain.model import Disposition, Permission, ResumeTicket, TicketKind, ToolCall
from runtime.hooks import call_hooks
from runtime.loop import execute
from runtime.tools import ToolArgumentsError
from runtime.untrusted import UntrustedJSONError, check_schema

if TYPE_CHECKING:
    from runtime.loop.driver import RunDriver

STRICTNESS = [Permission.ALLOW, Permission.ASK, Permission.DENY]


def block(d: RunDriver, call: ToolCall, reason: str) -> None:
    """Complete a call that never runs with an error result the model sees."""
    d.commit(
        Disposition.running(),
        (CallCompleted(call_id=call.call_id, result=reason, is_error=True),),
    )


def gate(d: RunDriver, agent: Agent, call: ToolCall) -> None:
    """Requested: run the gates, then commit Completed (blocked), Awaiting or Executing."""
    assert d.run is not None
    tool = agent.tool_for(call)
    if tool is None:
        block(d, call, f"Unknown tool {call.name!r}; it was not run.")
        return
    answers = call_hooks(agent.plugins, "gate", d.run, call)
    permission = max((call.permission, *filter(None, answers)), key=STRICTNESS.index)
    if permission is Permission.DENY:
        block(d, call, f"The tool {call.name} is not permitted; it was not run.")
        return
    try:
        arguments = tool.parse(call.arguments_text)
    except ToolArgumentsError as exc:
        block(d, call, str(exc))
        return
    refused = tool.delegate and delegation.refusal(
        d.run, call, tuple(t.name for t in agent.tools if t.delegate)
    )
    if refused:
        block(d, call, refused)
        return
    if tool.input_wait is not None:
        request, schema = tool.input_wait.build(arguments)
        try:
            check_schema(schema)
        except UntrustedJSONError as exc:
            block(d, call, f"No input was asked: {exc}.")
            return
        wait(d, call, TicketKind.INPUT, request, schema)
    elif permission is Permission.ASK:
        request = {"tool": call.name, "arguments": arguments, "operation_id": call.operation_id}
        wait(d, call, TicketKind.APPROVAL, request, None)
    else:
        execute.execute(d, agent, call, 1, tool=tool, arguments=arguments)


def wait(
    d: RunDriver, call: ToolCall, kind: TicketKind, request: dict[str, Any], schema: Any
) -> None:
    """Commit the call Awaiting with a new ticket: the run waits for a ResumeCommand."""
    ticket = ResumeTicket(
        id=uuid.uuid4().hex,
        run_id=d.run_id,
        call_id=call.call_id,
        kind=kind,
        request=request,
        schema=schema,
    )
    d.commit(
        Disposition.awaiting(ticket),
        (CallAwaiting(call_id=call.call_id, ticket_id=ticket.id),),
    )
    crash_point("ticket_committed")
