"""Executing a call: commit Executing{attempt} right before the effect, run the tool, stage
its terminal result; and the pinned ToolRecoveryPolicy for a call found Executing (seed:
"call at Executing": replay, reconnect, or mark Indeterminate).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from runtime import conf, operations, timers
from runtime.agents import Agent
from runtime.crash import crash_point
from runtime.domain import recovery as rec
from runtime.domain.events import CallCompleted, CallExecuting, CallIndeterminate
from runtime.domain.model import Disposition, RecoveryPolicy, TicketKind, ToolCall
from runtime.errors import LeaseLost
from runtime.hooks import call_hooks
from runtime.loop.boundary import Abandon, Boundary, first
from runtime.tools import Fenced, Tool, ToolArgumentsError, ToolContext, ToolError, WaitRequested

log = logging.getLogger("runtime.loop")


@dataclass
class Outcome:
    """What one executor attempt produced: a result, or an unclassified failure."""

    result: str | None = None
    is_error: bool = False
    failure: str | None = None  # set when the attempt's outcome cannot be classified
    wait: WaitRequested | None = None  # the tool asked to wait for a time


def context(d: Boundary, call: ToolCall, attempt: int) -> ToolContext:
    return ToolContext(
        run_id=d.run_id,
        call_id=call.call_id,
        operation_id=call.operation_id,
        attempt=attempt,
        worker_id=d.worker_id,
        lease_epoch=d.lease.epoch,
        woken_at=call.woken_at,
        db=d.services.db,
    )


async def execute(
    d: Boundary,
    agent: Agent,
    call: ToolCall,
    attempt: int,
    *,
    tool: Tool | None = None,
    arguments: dict[str, Any] | None = None,
) -> None:
    """Commit Executing{attempt}, run the tool, stage its terminal result.

    ``tool`` and ``arguments`` are the gates' (a Requested call); without them (an approved
    or woken call, a retry) they are resolved under the code that drives the run now, and a
    call that code cannot run is completed with the reason, before any effect (issue 34).
    """
    if tool is None or arguments is None:
        ready = runnable(agent, call)
        if isinstance(ready, str):
            await d.block(call, f"Not run: {ready}.")
            return
        tool, arguments = ready
    await d.commit(
        Disposition.running(),
        (CallExecuting(call_id=call.call_id, attempt=attempt, worker=d.worker_id),),
    )
    crash_point("executing_committed")
    if tool.delegate is not None:
        await delegate(d, call, tool, arguments)
        return
    outcome = await run_tool(d, tool, context(d, call, attempt), arguments)
    crash_point("effect_applied")
    assert d.run is not None
    current = d.run.find_call(call.call_id)
    assert current is not None
    if outcome.wait is not None:
        await d.park(current, TicketKind.TIMER, timers.ticket_request(outcome.wait), None)
    elif outcome.failure is None:
        assert outcome.result is not None
        finish(d, agent, current, outcome.result, outcome.is_error)
    else:  # unclassified: the pinned policy and the declared effects decide, as in recovery
        await recover(d, agent, current, raised=outcome.failure)


def runnable(agent: Agent, call: ToolCall) -> tuple[Tool, dict[str, Any]] | str:
    """The tool that runs ``call`` under the agent's code now, with the call's arguments as
    its current schema validates them; or why there is none: a deploy removed or renamed
    the tool, or changed its arguments, since the model requested the call (issue 34)."""
    tool = agent.tool_for(call)
    if tool is None:
        return f"the tool {call.name!r} is not in agent {agent.name!r} as deployed now"
    try:
        return tool, tool.parse(call.arguments_text)
    except ToolArgumentsError as exc:
        return f"the tool's current schema refuses the call's arguments ({exc})"


async def delegate(d: Boundary, call: ToolCall, tool: Tool, arguments: dict[str, Any]) -> None:
    """Start the Executing delegate call's child (``operations.start_child``); a child that
    cannot start completes the call with the reason."""
    assert d.run is not None
    current = d.run.find_call(call.call_id)
    assert current is not None
    run = d.run
    failed = await d.commit_around(
        lambda commit_parent: operations.start_child(run, current, tool, arguments, commit_parent)
    )
    if failed is not None:
        d.stage_result(
            CallCompleted(call_id=call.call_id, result=failed, is_error=True), current.attempt
        )


async def attempt(d: Boundary, tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> Outcome:
    """One executor attempt: an ``async def`` tool on the loop, a ``def`` tool on a tool
    thread. Raises Fenced; every other failure is an Outcome."""
    try:
        if tool.is_async:
            result = await tool.arun(ctx, arguments)
        else:
            result = await d.services.tools.run(_run_keeping_lease, tool, ctx, arguments)
        return Outcome(result=result)
    except Fenced:
        raise
    except WaitRequested as wait:
        return Outcome(wait=wait)
    except ToolError as exc:
        return Outcome(result=str(exc) or type(exc).__name__, is_error=True)
    except Exception as exc:  # the tool's own bug or an unknown downstream failure
        log.warning("tool %s raised", tool.name, exc_info=True)
        return Outcome(failure=f"{type(exc).__name__}: {exc}")


def _run_keeping_lease(tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> str:
    """Run a ``def`` tool on its tool thread; when it took a heartbeat or longer, renew the
    lease right there, before its result waits for the loop: a fenced effect may have held
    the run's row locked all along, and the heartbeat skips a locked row (docs/leases.md)."""
    started = time.monotonic()
    try:
        return tool.run(ctx, arguments)
    finally:
        if time.monotonic() - started >= conf.heartbeat_seconds():
            try:
                ctx.keep_lease()
            except Exception:  # the heartbeat renews it at its next beat
                log.warning("run %s: renewing the lease after a slow tool failed", ctx.run_id)


async def run_tool(d: Boundary, tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> Outcome:
    """Run the tool and wait for it.

    The wait is abandoned when the run was ended or taken over meanwhile (the result, when it
    comes, is kept as late evidence), or when the worker stops during a replay-safe call (the
    next worker replays it); any other call in flight, and every call of a paused run, is
    waited for. Raises Abandon, or
    LeaseLost when the tool found itself fenced.
    """
    running = asyncio.ensure_future(attempt(d, tool, ctx, arguments))
    try:
        if not await first(running, d.until_halted()) and not await _outlasts_stop(
            d, tool, running
        ):
            if d.released():
                running.add_done_callback(lambda done: _keep_late(d, ctx, done))
            raise Abandon()
        return running.result()
    except Fenced as exc:
        raise LeaseLost(run_id=d.run_id, worker_id=d.worker_id, reason=str(exc)) from exc


async def _outlasts_stop(d: Boundary, tool: Tool, running: asyncio.Future[Outcome]) -> bool:
    """The run halted while its tool runs: True once a call that must not be left to the next
    worker has finished; False when it is given up (a replay-safe call on a stop, any call of
    a released run). A pause waits for every call in flight: its result is committed before
    the worker lets the run go (README, "Pause")."""
    if d.released() or (tool.policy is RecoveryPolicy.REPLAY and not d.pausing()):
        return False
    return await first(running, d.until_released())


def _keep_late(d: Boundary, ctx: ToolContext, done: asyncio.Future[Outcome]) -> None:
    """Keep the result of an abandoned attempt, when it comes, as late evidence."""
    outcome = None if done.cancelled() or done.exception() else done.result()
    if outcome is not None and outcome.result is not None:
        event = CallCompleted(call_id=ctx.call_id, result=outcome.result, is_error=outcome.is_error)
        asyncio.ensure_future(d.late(ctx.call_id, ctx.attempt, event))


def finish(d: Boundary, agent: Agent, call: ToolCall, result: str, is_error: bool) -> None:
    """Stage the terminal result (after AfterTool hooks) for the next commit."""
    assert d.run is not None
    for answer in call_hooks(agent.plugins, "after_tool", d.run, call, result, is_error):
        if answer is not None:
            result = answer
    d.stage_result(
        CallCompleted(call_id=call.call_id, result=result, is_error=is_error), call.attempt
    )


async def lookup(d: Boundary, tool: Tool, ctx: ToolContext) -> Any:
    """Ask the downstream about ``ctx.operation_id`` (a reconnect tool's ``lookup``)."""
    assert tool.lookup is not None
    if asyncio.iscoroutinefunction(tool.lookup):
        return await tool.lookup(ctx)
    return await d.services.tools.run(tool.lookup, ctx)


async def recover(d: Boundary, agent: Agent, call: ToolCall, raised: str | None = None) -> None:
    """An Executing call without a result (found on a claim, or its attempt raised ``raised``,
    "Type: message"): the call's pinned ToolRecoveryPolicy and declared Effects decide
    (``domain.recovery.executing_decision``)."""
    ready = runnable(agent, call)
    tool: Tool | None
    cannot_run: str | None
    if isinstance(ready, str):  # no Retry, no Lookup: the decision seals or fails it
        tool, cannot_run = None, ready
    else:
        tool, cannot_run = ready[0], None
        if tool.delegate is not None:  # idempotent by operation id
            await delegate(d, call, *ready)
            return
    decision = rec.executing_decision(call, raised=raised, cannot_run=cannot_run)
    if isinstance(decision, rec.Lookup):
        try:
            found = (
                await lookup(d, tool, context(d, call, call.attempt))
                if tool and tool.lookup
                else None
            )
        except Fenced as exc:
            raise LeaseLost(run_id=d.run_id, worker_id=d.worker_id, reason=str(exc)) from exc
        except Exception as exc:  # an MCP error result, a lost server, the lookup's own bug
            # Unknown is not "never seen", and a failed claim would learn no more than this
            # one: the call is sealed Indeterminate for a person to reconcile, and the claim
            # goes on instead of counting against the run's poison budget.
            log.warning("tool %s: the lookup of %s raised", call.name, call.operation_id)
            decision = rec.executing_decision(
                call, lookup_failed=f"{type(exc).__name__}: {exc}", raised=raised
            )
        else:
            if found is not None:
                text = found if isinstance(found, str) else json.dumps(found, sort_keys=True)
                d.stage_result(CallCompleted(call_id=call.call_id, result=text), call.attempt)
                return
            decision = rec.executing_decision(call, looked_up=True, raised=raised)
    if isinstance(decision, rec.Retry):
        await execute(d, agent, call, decision.attempt)
    elif isinstance(decision, rec.Fail):  # as a ToolError's result would be
        finish(d, agent, call, decision.reason, is_error=True)
    else:
        assert isinstance(decision, rec.Seal)
        cause = f"the tool failed: {raised}" if raised else None
        reason = f"{cause}; {decision.reason}" if cause else decision.reason
        await d.commit(
            Disposition.running(), (CallIndeterminate(call_id=call.call_id, reason=reason),)
        )
