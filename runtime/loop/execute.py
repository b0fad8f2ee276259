"""Executing a call: commit Executing{attempt} right before the effect, run the tool, stage
its terminal result; and the pinned ToolRecoveryPolicy for a call found Executing (seed:
"call at Executing": replay, reconnect, or mark Indeterminate).
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime import delegation, timers
from runtime.agents import Agent
from runtime.crash import crash_point
from runtime.domain import recovery as rec
from runtime.domain.events import CallCompleted, CallExecuting, CallIndeterminate
from runtime.domain.model import Disposition, RecoveryPolicy, TicketKind, ToolCall
from runtime.errors import LeaseLost
from runtime.hooks import call_hooks
from runtime.tools import Fenced, Tool, ToolContext, ToolError, WaitRequested

if TYPE_CHECKING:
    from runtime.loop.driver import RunDriver

log = logging.getLogger("runtime.loop")

POLL_SECONDS = 0.05  # how often a driver waiting on a tool looks at its stop signals


@dataclass
class Outcome:
    """What one executor attempt produced: a result, or an unclassified failure."""

    result: str | None = None
    is_error: bool = False
    failure: str | None = None  # set when the attempt's outcome cannot be classified
    wait: WaitRequested | None = None  # the tool asked to wait for a time


def context(d: RunDriver, call: ToolCall, attempt: int) -> ToolContext:
    return ToolContext(
        run_id=d.run_id,
        call_id=call.call_id,
        operation_id=call.operation_id,
        attempt=attempt,
        worker_id=d.worker_id,
        lease_epoch=d.lease.epoch,
        woken_at=call.woken_at,
    )


def execute(
    d: RunDriver,
    agent: Agent,
    call: ToolCall,
    attempt: int,
    *,
    tool: Tool | None = None,
    arguments: dict[str, Any] | None = None,
) -> None:
    """Commit Executing{attempt}, run the tool, stage its terminal result."""
    tool = tool or agent.tool_for(call)
    assert tool is not None  # a call without a tool never leaves Requested but by a block
    if arguments is None:
        arguments = tool.parse(call.arguments_text)
    d.commit(
        Disposition.running(),
        (CallExecuting(call_id=call.call_id, attempt=attempt, worker=d.worker_id),),
    )
    crash_point("executing_committed")
    if tool.delegate is not None:
        delegate(d, call, tool, arguments)
        return
    outcome = run_tool(d, tool, context(d, call, attempt), arguments)
    crash_point("effect_applied")
    assert d.run is not None
    current = d.run.find_call(call.call_id)
    assert current is not None
    if outcome.wait is not None:
        from runtime.loop import gate  # gate starts calls through this module

        gate.wait(d, current, TicketKind.TIMER, timers.ticket_request(outcome.wait), None)
    elif outcome.failure is None:
        assert outcome.result is not None
        finish(d, agent, current, outcome.result, outcome.is_error)
    else:  # unclassified: the pinned policy decides, as in recovery
        recover(d, agent, current, cause=f"the tool failed: {outcome.failure}")


def delegate(d: RunDriver, call: ToolCall, tool: Tool, arguments: dict[str, Any]) -> None:
    """Start the Executing delegate call's child (see runtime.delegation); a child that cannot
    start completes the call with the reason."""
    assert d.run is not None
    current = d.run.find_call(call.call_id)
    assert current is not None
    failed = delegation.start_child(d.run, current, tool, arguments, d.commit)
    if failed is not None:
        d.stage_result(
            CallCompleted(call_id=call.call_id, result=failed, is_error=True), current.attempt
        )


def run_tool(d: RunDriver, tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> Outcome:
    """Run the tool on the tool thread and wait for it.

    The wait is abandoned when the run was ended or taken over meanwhile (the result, when it
    comes, is kept as late evidence), or when the worker stops during a replay-safe call (the
    next worker replays it); any other call in flight is waited for. Raises Abandon, or
    LeaseLost when the tool found itself fenced.
    """
    from runtime.loop.driver import Abandon, record_late

    def attempt() -> Outcome:
        try:
            return Outcome(result=tool.run(ctx, arguments))
        except Fenced:
            raise
        except WaitRequested as wait:
            return Outcome(wait=wait)
        except ToolError as exc:
            return Outcome(result=str(exc) or type(exc).__name__, is_error=True)
        except Exception as exc:  # the tool's own bug or an unknown downstream failure
            log.warning("tool %s raised", tool.name, exc_info=True)
            return Outcome(failure=f"{type(exc).__name__}: {exc}")

    def keep(future: Future[Outcome]) -> None:  # runs on the retiring tool thread
        outcome = None if future.exception() else future.result()
        if outcome is not None and outcome.result is not None:
            event = CallCompleted(
                call_id=ctx.call_id, result=outcome.result, is_error=outcome.is_error
            )
            record_late(ctx.call_id, ctx.attempt, event, d.worker_id)

    future = d.tools.submit(attempt)
    while True:
        try:
            return future.result(timeout=POLL_SECONDS)
        except FutureTimeout:
            released = d.released()
            if released or (d.should_stop() and tool.policy is RecoveryPolicy.REPLAY):
                d.tools.abandon()
                if released:
                    future.add_done_callback(keep)
                raise Abandon() from None
        except Fenced as exc:
            raise LeaseLost(run_id=d.run_id, worker_id=d.worker_id, reason=str(exc)) from exc


def finish(d: RunDriver, agent: Agent, call: ToolCall, result: str, is_error: bool) -> None:
    """Stage the terminal result (after AfterTool hooks) for the next commit."""
    assert d.run is not None
    for answer in call_hooks(agent.plugins, "after_tool", d.run, call, result, is_error):
        if answer is not None:
            result = answer
    d.stage_result(
        CallCompleted(call_id=call.call_id, result=result, is_error=is_error), call.attempt
    )


def recover(d: RunDriver, agent: Agent, call: ToolCall, cause: str | None = None) -> None:
    """An Executing call without a result (found on a claim, or its attempt failed
    unclassified): the call's pinned ToolRecoveryPolicy decides."""
    decision = rec.executing_decision(call)
    tool = agent.tool_for(call)
    if tool is not None and tool.delegate is not None:  # idempotent by operation id
        delegate(d, call, tool, tool.parse(call.arguments_text))
        return
    if isinstance(decision, rec.Lookup):
        try:
            found = tool.lookup(context(d, call, call.attempt)) if tool and tool.lookup else None
        except Fenced as exc:
            raise LeaseLost(run_id=d.run_id, worker_id=d.worker_id, reason=str(exc)) from exc
        except Exception as exc:  # an MCP error result, a lost server, the lookup's own bug
            # Unknown is not "never seen", and a failed claim would learn no more than this
            # one: the call is sealed Indeterminate for a person to reconcile, and the claim
            # goes on instead of counting against the run's poison budget.
            log.warning("tool %s: the lookup of %s raised", call.name, call.operation_id)
            decision = rec.executing_decision(call, lookup_failed=f"{type(exc).__name__}: {exc}")
        else:
            if found is not None:
                text = found if isinstance(found, str) else json.dumps(found, sort_keys=True)
                d.stage_result(CallCompleted(call_id=call.call_id, result=text), call.attempt)
                return
            decision = rec.executing_decision(call, looked_up=True)
    if isinstance(decision, rec.Retry):
        execute(d, agent, call, decision.attempt)
    else:
        assert isinstance(decision, rec.Seal)
        reason = f"{cause}; {decision.reason}" if cause else decision.reason
        d.commit(Disposition.running(), (CallIndeterminate(call_id=call.call_id, reason=reason),))
