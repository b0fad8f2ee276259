"""The tool-call state machine of the seed and DESIGN.md, applied to one call at a time.

``advance_call`` is the only way a call changes phase; it raises IllegalTransition naming
from, to and why for anything the table does not allow. Executing never returns to Requested.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from runtime.domain.model import CallPhase, Decision, Permission, RecoveryPolicy, ToolCall
from runtime.errors import IllegalTransition

R, X, A, C, I = (
    CallPhase.REQUESTED,
    CallPhase.EXECUTING,
    CallPhase.AWAITING,
    CallPhase.COMPLETED,
    CallPhase.INDETERMINATE,
)

# The seed's tool-call state machine (from, to). Terminal phases leave only by finalization.
LEGAL_CALL_TRANSITIONS: frozenset[tuple[CallPhase, CallPhase]] = frozenset(
    {
        (R, X),  # first executor attempt committed
        (X, X),  # retry under the pinned policy
        (R, A),  # gate or external input
        (X, A),  # delegated or scheduled wait
        (A, X),  # matching typed resume
        (R, C),  # blocked by a gate, or result supplied
        (X, C),  # output committed
        (A, C),  # denied, or completed externally
        (R, I),  # run ended before the call started
        (X, I),  # outcome cannot be classified
        (A, I),  # owning run ended
    }
)


def _refuse(call: ToolCall, to: CallPhase, why: str) -> IllegalTransition:
    return IllegalTransition("tool call", call.phase.value, to.value, why, call_id=call.call_id)


def check_call_transition(call: ToolCall, to: CallPhase) -> None:
    """Raise IllegalTransition unless ``call.phase -> to`` is in the seed's table."""
    if (call.phase, to) not in LEGAL_CALL_TRANSITIONS:
        why = (
            "a terminal call never changes again"
            if call.phase.terminal
            else "Executing is never turned back into Requested"
            if (call.phase, to) == (X, R)
            else "not an edge of the tool-call state machine"
        )
        raise _refuse(call, to, why)


def start_attempt(call: ToolCall, attempt: int) -> ToolCall:
    """Commit an executor attempt (-> Executing{attempt}); the effect may start after it.

    Raises IllegalTransition when the permission pinned in the call forbids running it
    without an approval, when the attempt is not the next one, when a retry is not allowed by
    the pinned policy, or when the attempt budget (``max_attempts``) is spent.
    """
    check_call_transition(call, X)
    if call.permission is Permission.DENY:
        raise _refuse(call, X, "the pinned permission denies this tool")
    if call.phase is R and call.permission is Permission.ASK:
        raise _refuse(call, X, "the pinned permission asks for approval first")
    if call.phase is A and not call.approved:
        raise _refuse(call, X, "no matching resume was committed for the wait")
    if call.phase is X and call.policy is RecoveryPolicy.INDETERMINATE:
        raise _refuse(call, X, "the pinned policy never retries an attempt that may have started")
    if attempt != call.attempt + 1:
        raise _refuse(call, X, f"attempt must be {call.attempt + 1}, got {attempt}")
    # The budget counts attempts whose outcome may be unknown; an attempt that ended in a
    # committed wait (a timer) finished cleanly, so resuming it is not a retry.
    if attempt > call.max_attempts and call.phase is not A:
        raise _refuse(call, X, f"the pinned budget allows {call.max_attempts} attempts")
    return replace(call, phase=X, attempt=attempt, approved=False)


def await_ticket(call: ToolCall, ticket_id: str) -> ToolCall:
    """Park the call on a new ticket (-> Awaiting)."""
    check_call_transition(call, A)
    return replace(call, phase=A, ticket_id=ticket_id, approved=False)


def delegate(call: ToolCall, ticket_id: str, child_run_id: str) -> ToolCall:
    """Park an Executing delegate call on its child (Executing -> Awaiting, delegated wait)."""
    if call.phase is not X:
        raise _refuse(call, A, "a child is started by an Executing delegate call")
    return replace(await_ticket(call, ticket_id), child_run_id=child_run_id)


def resume_call(
    call: ToolCall,
    ticket_id: str,
    decision: Decision,
    result: str,
    arguments: dict[str, Any] | None = None,
    *,
    woken_at: str | None = None,
) -> ToolCall:
    """Apply a validated resume: approve stays Awaiting (approved, with the operator's
    ``arguments`` if edited), deny / input / respond complete. ``woken_at`` is the due time
    of a fired timer, which the next attempt's ToolContext sees.

    An edit replaces ``arguments`` and ``arguments_text`` (what the tool runs with) and keeps
    the model's own in ``model_arguments``. The text is written with sorted keys: the log's
    JSON may come back with its keys in another order (PostgreSQL's jsonb), and a fold of it
    must write the same text again.
    """
    if call.phase is not A or call.ticket_id != ticket_id or call.approved:
        raise _refuse(call, X, f"the call is not awaiting ticket {ticket_id}")
    if decision is Decision.APPROVE:
        woken = woken_at or call.woken_at
        if arguments is not None:
            return replace(
                call,
                approved=True,
                arguments=arguments,
                arguments_text=json.dumps(arguments, sort_keys=True, ensure_ascii=False),
                model_arguments=(
                    call.arguments if call.model_arguments is None else call.model_arguments
                ),
                woken_at=woken,
            )
        return replace(call, approved=True, woken_at=woken)
    return complete(call, result, is_error=decision is Decision.DENY)


def complete(call: ToolCall, result: str, *, is_error: bool) -> ToolCall:
    """Commit the call's terminal result (-> Completed)."""
    check_call_transition(call, C)
    return replace(call, phase=C, result=result, is_error=is_error, approved=False)


def _downstream(call: ToolCall) -> str:
    """Who to ask about the call's operation id: its MCP server when it has one."""
    source = call.source
    if source.get("kind") == "mcp":
        return f"MCP server {source['server']!r} (tool {source['tool']!r})"
    return "the downstream system"


def seal_indeterminate(call: ToolCall, reason: str) -> ToolCall:
    """Mark the call Indeterminate (terminal), publishing an explicit error for the model.

    The effect may have started only if an executor attempt was ever committed and the tool
    declares an external effect (the pinned ``effects``); only such calls need reconciliation
    (DESIGN.md, "Indeterminate is terminal"). A started call of a tool without external
    effects is recorded as "no external effect; nothing to check" (issue 22).
    """
    check_call_transition(call, I)
    started = call.attempt > 0 and call.effects.external
    if call.attempt > 0 and not started:
        text = (
            f"No external effect; nothing to check: {reason}. {call.name} declares no external "
            f"effect, so nothing outside changed (operation id {call.operation_id})."
        )
    elif started:
        text = (
            f"Outcome unknown: this call may have taken effect ({reason}). "
            f"Operation id {call.operation_id}. Verify with {_downstream(call)} before "
            "retrying."
        )
    else:
        text = f"Not executed: {reason}. The call never started (operation id {call.operation_id})."
    return replace(
        call, phase=I, result=text, is_error=True, approved=False, effect_may_have_started=started
    )
