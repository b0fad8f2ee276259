"""The step loop: drives one claimed Run from its committed frontier until it waits or ends.

Every decision starts from committed state (``recovery.next_action``, the seed's decision
table), so the same code serves a fresh run and a run recovered after a crash. Commit points,
in order (DESIGN.md "One Step"): the assistant message with the whole batch as Requested
before anything executes; per call, Executing or Awaiting before the effect or the wait; the
terminal result; then the batch's results in the model's call order.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from django.db import close_old_connections, connections

from runtime import conf, live
from runtime.agents import Agent, get_agent
from runtime.coordinator import Lease, commit, read_head, read_run
from runtime.crash import crash_point
from runtime.domain import recovery as rec
from runtime.domain.commit import CommitDraft, end_cause_reason, ending, publication
from runtime.domain.events import (
    BatchFinalized,
    BatchOpened,
    CallAwaiting,
    CallCompleted,
    CallExecuting,
    CallIndeterminate,
    Event,
    StepCommitted,
)
from runtime.domain.model import (
    CallPhase,
    Disposition,
    EndCause,
    Message,
    Permission,
    RecoveryPolicy,
    ResumeTicket,
    RunState,
    RunView,
    TicketKind,
    ToolCall,
)
from runtime.errors import (
    IllegalTransition,
    InvalidCommit,
    LeaseLost,
    RunEnded,
    UnknownAgent,
    VersionConflict,
)
from runtime.hooks import call_hooks
from runtime.models import LateEvidence, MessageRecord, Run, StreamCheckpoint
from runtime.providers import build_provider
from runtime.providers.base import (
    Delta,
    InferenceContext,
    InferenceRequest,
    InferenceResult,
    ModelError,
    ToolSpec,
)
from runtime.tools import Tool, ToolArgumentsError, ToolContext, ToolError
from runtime.untrusted import UntrustedJSONError, check_schema, parse_object

log = logging.getLogger("runtime.loop")

STRICTNESS = [Permission.ALLOW, Permission.ASK, Permission.DENY]


class Abandon(Exception):
    """The worker stops at this boundary; nothing uncommitted is kept."""


@dataclass
class Outcome:
    """What one executor attempt produced: a result, or an unclassified failure."""

    result: str | None = None
    is_error: bool = False
    failure: str | None = None  # set when the attempt's outcome cannot be classified


class ToolThread:
    """A daemon thread that runs tool calls one at a time and keeps its database connection
    between them. A driver waits on it and may stop waiting (abandon) when the worker stops;
    being a daemon, a call still in flight never holds the process up."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None]
        self.jobs = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="tools", daemon=True).start()

    def _serve(self) -> None:
        try:
            while (item := self.jobs.get()) is not None:
                job, future = item
                close_old_connections()
                try:
                    future.set_result(job())
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            connections.close_all()

    def close(self) -> None:
        """Let the thread end (after any call still in flight) and close its connection."""
        self.jobs.put(None)

    def submit(self, job: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self.jobs.put((job, future))
        return future


class RunDriver:
    """Drives one run for one worker while it holds ``lease``.

    ``should_stop()`` is polled at every boundary; when it turns true the driver returns
    without committing anything more (a replay-safe tool in flight is abandoned).
    """

    def __init__(
        self,
        run_id: str,
        *,
        lease: Lease,
        should_stop: Callable[[], bool],
        tools: ToolThread | None = None,
    ) -> None:
        self.run_id = run_id
        self.owns_tools = tools is None
        self.tools = tools or ToolThread()
        self.lease = lease
        self.worker_id = lease.worker_id
        self.should_stop = should_stop
        self.version = 0
        self.run: RunView | None = None

    # -- committing ------------------------------------------------------------------------

    def reload(self) -> RunView:
        run = read_run(self.run_id)
        assert run is not None
        self.run = run
        self.version = read_head(run.thread_id).version
        return run

    def commit(
        self,
        disposition: Disposition,
        events: tuple[Event, ...] = (),
        messages: tuple[Message, ...] = (),
    ) -> RunView:
        assert self.run is not None
        done = commit(
            CommitDraft(
                thread_id=self.run.thread_id,
                run_id=self.run_id,
                expected_version=self.version,
                disposition=disposition,
                messages=messages,
                events=events,
                actor=f"worker:{self.worker_id}",
            ),
            lease=self.lease,
        )
        assert done.run is not None
        self.version, self.run = done.head.version, done.run
        return done.run

    # -- the loop ---------------------------------------------------------------------------

    def drive(self) -> None:
        """Act on the committed frontier until the run waits, ends, or the worker stops.

        Raises LeaseLost when another worker took the run over; a VersionConflict (an
        operator's command landed first) makes it reload and decide again.
        """
        try:
            self._drive()
        finally:
            if self.owns_tools:
                self.tools.close()

    def _drive(self) -> None:
        run = self.reload()
        try:
            agent = get_agent(run.agent)
        except UnknownAgent as exc:  # the deployment lost the agent: fail, do not loop
            if run.state is RunState.RUNNING:
                self.end(EndCause.FAILED, {"type": exc.code, "message": exc.message})
            return
        while not self.should_stop():
            action = rec.next_action(run, agent.step_limit)
            if isinstance(action, rec.Idle):
                return
            try:
                self.act(agent, action)
            except VersionConflict:
                log.info("run %s: another writer committed first; reloading", self.run_id)
                run = self.reload()
                continue
            except Abandon:
                return
            except (InvalidCommit, IllegalTransition) as exc:
                # The rules refused what this step would commit: trying again would only
                # repeat it (and the model call), so the run fails with the typed error.
                log.error("run %s: commit refused: %s", self.run_id, exc.message)
                self.reload()
                self.end(EndCause.FAILED, {"type": exc.code, "message": exc.message})
                return
            assert self.run is not None
            run = self.run  # each commit returned the state it made

    def act(self, agent: Agent, action: rec.Action) -> None:
        match action:
            case rec.Infer(step=step):
                self.infer(agent, step)
            case rec.StepLimit():
                self.end(EndCause.STEP_LIMIT, None)
            case rec.Gate(call=call):
                self.gate(agent, call)
            case rec.ExecuteApproved(call=call):
                self.execute(agent, call, call.attempt + 1)
            case rec.RecoverExecuting(call=call):
                self.recover(agent, call)
            case rec.Finalize(batch=batch):
                assert self.run is not None
                finalized = BatchFinalized(step=batch.step)
                self.commit(Disposition.running(), (finalized,), publication(batch))
                crash_point("batch_finalized")

    def end(self, cause: EndCause, error: dict[str, Any] | None) -> None:
        assert self.run is not None
        events, messages = ending(self.run, end_cause_reason(cause))
        self.commit(Disposition.ended(cause, error), events, messages)

    # -- one inference ----------------------------------------------------------------------

    def request(self, agent: Agent, run: RunView) -> InferenceRequest:
        """Build the next request from committed messages only (plus request-only hooks)."""
        committed = tuple(
            Message(
                role=m.role,
                content=m.content,
                tool_calls=tuple(m.tool_calls),
                tool_call_id=m.tool_call_id,
                name=m.name,
            )
            for m in MessageRecord.objects.filter(thread_id=run.thread_id).order_by("seq", "idx")
        )
        extra = [
            m
            for answer in call_hooks(agent.plugins, "before_inference", run, committed)
            for m in (answer or ())
        ]
        return InferenceRequest(
            model=agent.provider.model,
            instructions=agent.instructions,
            messages=committed + tuple(extra),
            tools=tuple(
                ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
                for t in agent.tools
            ),
            options=dict(agent.provider.options),
        )

    def infer(self, agent: Agent, step: int) -> None:
        run = self.run
        assert run is not None
        call_hooks(agent.plugins, "step_start", run)
        request = self.request(agent, run)
        metadata = Run.objects.filter(id=self.run_id).values_list("metadata", flat=True).first()
        provider = build_provider(agent.provider, metadata or {})
        try:
            result = self.infer_with_retries(provider, request, step, metadata or {})
        except ModelError as exc:
            log.warning("run %s: inference failed for good: %s", self.run_id, exc)
            self.end(EndCause.FAILED, exc.as_error())
            return
        finally:
            close = getattr(provider, "close", None)
            if close is not None:
                close()
        call_hooks(agent.plugins, "after_inference", run, result)
        # A text-only answer ends the run unless a StepEnd hook asks for another step.
        proceed = any(call_hooks(agent.plugins, "step_end", run, result))
        self.commit_inference(agent, step, request, result, proceed)
        StreamCheckpoint.objects.filter(run_id=self.run_id).delete()

    def infer_with_retries(
        self, provider: Any, request: InferenceRequest, step: int, metadata: dict[str, Any]
    ) -> InferenceResult:
        """Call the provider; retry retryable failures with doubling backoff within budget."""
        backoff = conf.model_backoff_seconds()
        attempt = 0
        while True:
            attempt += 1
            ctx = self.inference_context(step, attempt, metadata)
            try:
                return provider.infer(request, ctx)
            except ModelError as exc:
                if not exc.retryable or attempt > conf.model_retries():
                    raise
                pause = exc.retry_after if exc.retry_after is not None else backoff
                backoff *= 2
                log.info(
                    "run %s: retryable model error (%s); retry in %.2fs",
                    self.run_id,
                    exc.message,
                    pause,
                )
                self.sleep(pause)

    def sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.should_stop():
                raise Abandon()
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))

    def inference_context(
        self, step: int, attempt: int, metadata: dict[str, Any]
    ) -> InferenceContext:
        first = [True]

        def on_delta(delta: Delta) -> None:
            if self.should_stop():
                raise Abandon()
            live.publish_delta(
                self.run_id,
                step=step,
                attempt=attempt,
                delta={
                    "kind": delta.kind,
                    "text": delta.text,
                    "index": delta.index,
                    "name": delta.name,
                    "call_id": delta.call_id,
                },
            )
            if first[0]:
                first[0] = False
                crash_point("inference_streaming")

        checkpoint = (
            StreamCheckpoint.objects.filter(run_id=self.run_id, step=step)
            .values("text", "tool_calls")
            .first()
        )
        return InferenceContext(
            run_id=self.run_id,
            step=step,
            attempt=attempt,
            metadata=metadata,
            on_delta=on_delta,
            checkpoint=lambda text, calls: self.save_checkpoint(step, attempt, text, calls),
            resume_from=checkpoint,
        )

    def save_checkpoint(self, step: int, attempt: int, text: str, calls: list[dict]) -> None:
        """Best effort: a failure to write the checkpoint never fails the run."""
        try:
            StreamCheckpoint.objects.update_or_create(
                run_id=self.run_id,
                defaults={"step": step, "attempt": attempt, "text": text, "tool_calls": calls},
            )
        except Exception:
            log.warning("run %s: checkpoint write failed", self.run_id, exc_info=True)

    def commit_inference(
        self,
        agent: Agent,
        step: int,
        request: InferenceRequest,
        result: InferenceResult,
        proceed: bool,
    ) -> None:
        meta = {
            "request_sha256": request.digest(),
            "finish_reason": result.finish_reason,
            "usage": dict(result.usage),
        }
        blocks = tuple(
            {"id": c.id, "name": c.name, "arguments": c.arguments} for c in result.tool_calls
        )
        message = Message(role="assistant", content=result.text, tool_calls=blocks, meta=meta)
        if not result.tool_calls:
            after = Disposition.running() if proceed else Disposition.ended(EndCause.NATURAL)
            self.commit(after, (StepCommitted(step=step),), (message,))
            return
        calls = tuple(self.pin(agent, index, out) for index, out in enumerate(result.tool_calls))
        events = (StepCommitted(step=step), BatchOpened(step=step, calls=calls))
        self.commit(Disposition.running(), events, (message,))
        crash_point("batch_committed")

    @staticmethod
    def pin(agent: Agent, index: int, out: Any) -> ToolCall:
        """A Requested call with the policy, permission and budget in force now."""
        tool = agent.tool(out.name)
        try:
            arguments: dict[str, Any] | None = parse_object(out.arguments)
        except UntrustedJSONError:
            arguments = None  # kept as raw text; the gate answers the model with the reason
        return ToolCall(
            call_id=uuid.uuid4().hex,
            index=index,
            tool_call_id=out.id,
            name=out.name,
            arguments=arguments,
            arguments_text=out.arguments,
            operation_id=f"op_{uuid.uuid4().hex}",
            policy=tool.policy if tool else RecoveryPolicy.INDETERMINATE,
            permission=agent.permission_for(tool) if tool else Permission.DENY,
            max_attempts=tool.max_attempts if tool else 1,
        )

    # -- one call ---------------------------------------------------------------------------

    def complete(self, call: ToolCall, result: str, is_error: bool) -> None:
        self.commit(
            Disposition.running(),
            (CallCompleted(call_id=call.call_id, result=result, is_error=is_error),),
        )

    def gate(self, agent: Agent, call: ToolCall) -> None:
        """Requested: run the gates, then commit Completed (blocked), Awaiting or Executing."""
        assert self.run is not None
        tool = agent.tool(call.name)
        if tool is None:
            self.complete(call, f"Unknown tool {call.name!r}; it was not run.", True)
            return
        answers = call_hooks(agent.plugins, "gate", self.run, call)
        permission = max((call.permission, *filter(None, answers)), key=STRICTNESS.index)
        if permission is Permission.DENY:
            self.complete(call, f"The tool {call.name} is not permitted; it was not run.", True)
            return
        try:
            arguments = tool.parse(call.arguments_text)
        except ToolArgumentsError as exc:
            self.complete(call, str(exc), True)
            return
        if tool.input_wait is not None:
            request, schema = tool.input_wait.build(arguments)
            try:
                check_schema(schema)
            except UntrustedJSONError as exc:
                self.complete(call, f"No input was asked: {exc}.", True)
                return
            self.wait(call, TicketKind.INPUT, request, schema)
        elif permission is Permission.ASK:
            request = {"tool": call.name, "arguments": arguments, "operation_id": call.operation_id}
            self.wait(call, TicketKind.APPROVAL, request, None)
        else:
            self.execute(agent, call, 1, tool=tool, arguments=arguments)

    def wait(self, call: ToolCall, kind: TicketKind, request: dict[str, Any], schema: Any) -> None:
        ticket = ResumeTicket(
            id=uuid.uuid4().hex,
            run_id=self.run_id,
            call_id=call.call_id,
            kind=kind,
            request=request,
            schema=schema,
        )
        self.commit(
            Disposition.awaiting(ticket),
            (CallAwaiting(call_id=call.call_id, ticket_id=ticket.id),),
        )
        crash_point("ticket_committed")

    def recover(self, agent: Agent, call: ToolCall, cause: str | None = None) -> None:
        """An Executing call without a result (found on a claim, or its attempt failed
        unclassified): the call's pinned ToolRecoveryPolicy decides."""
        decision = rec.executing_decision(call)
        tool = agent.tool(call.name)
        if isinstance(decision, rec.Lookup):
            found = tool.lookup(self.context(call, call.attempt)) if tool and tool.lookup else None
            if found is not None:
                text = found if isinstance(found, str) else json.dumps(found, sort_keys=True)
                self.complete(call, text, False)
                return
            decision = rec.executing_decision(call, looked_up=True)
        if isinstance(decision, rec.Retry):
            self.execute(agent, call, decision.attempt)
        else:
            assert isinstance(decision, rec.Seal)
            self.seal(call, f"{cause}; {decision.reason}" if cause else decision.reason)

    def seal(self, call: ToolCall, reason: str) -> None:
        self.commit(
            Disposition.running(), (CallIndeterminate(call_id=call.call_id, reason=reason),)
        )

    def context(self, call: ToolCall, attempt: int) -> ToolContext:
        return ToolContext(
            run_id=self.run_id,
            call_id=call.call_id,
            operation_id=call.operation_id,
            attempt=attempt,
            worker_id=self.worker_id,
        )

    def execute(
        self,
        agent: Agent,
        call: ToolCall,
        attempt: int,
        *,
        tool: Tool | None = None,
        arguments: dict[str, Any] | None = None,
    ) -> None:
        """Commit Executing{attempt}, run the tool, commit its terminal result."""
        tool = tool or agent.tool(call.name)
        assert tool is not None  # a call without a tool never leaves Requested but by a block
        if arguments is None:
            arguments = tool.parse(call.arguments_text)
        self.commit(
            Disposition.running(),
            (CallExecuting(call_id=call.call_id, attempt=attempt, worker=self.worker_id),),
        )
        crash_point("executing_committed")
        outcome = self.run_tool(tool, self.context(call, attempt), arguments)
        crash_point("effect_applied")
        current = self.run.find_call(call.call_id) if self.run else None
        assert current is not None
        if outcome.failure is None:
            assert outcome.result is not None
            self.finish(agent, current, outcome.result, outcome.is_error)
        else:  # unclassified: the pinned policy decides, as in recovery
            self.recover(agent, current, cause=f"the tool failed: {outcome.failure}")

    def run_tool(self, tool: Tool, ctx: ToolContext, arguments: dict[str, Any]) -> Outcome:
        """Run the tool on the tool thread so that a stopping worker can abandon a
        replay-safe call; any other call is waited for (its effect is in flight)."""

        def attempt() -> Outcome:
            try:
                return Outcome(result=tool.run(ctx, arguments))
            except ToolError as exc:
                return Outcome(result=str(exc) or type(exc).__name__, is_error=True)
            except Exception as exc:  # the tool's own bug or an unknown downstream failure
                log.warning("tool %s raised", tool.name, exc_info=True)
                return Outcome(failure=f"{type(exc).__name__}: {exc}")

        future = self.tools.submit(attempt)
        while True:
            try:
                return future.result(timeout=0.05)
            except FutureTimeout:
                if self.should_stop() and tool.policy is RecoveryPolicy.REPLAY:
                    raise Abandon() from None

    def finish(self, agent: Agent, call: ToolCall, result: str, is_error: bool) -> None:
        """Commit the terminal result; keep it as evidence if the call was sealed meanwhile."""
        assert self.run is not None
        for answer in call_hooks(agent.plugins, "after_tool", self.run, call, result, is_error):
            if answer is not None:
                result = answer
        for _ in range(3):
            try:
                self.complete(call, result, is_error)
                crash_point("call_completed")
                return
            except (VersionConflict, RunEnded, LeaseLost) as exc:
                fenced = isinstance(exc, LeaseLost)
                current = None if fenced else self.reload().find_call(call.call_id)
                still_ours = (
                    current is not None
                    and current.phase is CallPhase.EXECUTING
                    and current.attempt == call.attempt
                    and self.run is not None
                    and self.run.state is RunState.RUNNING
                )
                if not still_ours:
                    LateEvidence.objects.create(
                        call_id=call.call_id,
                        result=result,
                        is_error=is_error,
                        worker=self.worker_id,
                    )
                    log.info(
                        "run %s: late result for %s kept as evidence", self.run_id, call.call_id
                    )
                    if fenced:
                        raise
                    return
        raise VersionConflict(run_id=self.run_id)


def drive(
    run_id: str,
    *,
    lease: Lease,
    should_stop: Callable[[], bool],
    tools: ToolThread | None = None,
) -> None:
    """Drive ``run_id`` from its committed frontier (see RunDriver)."""
    close_old_connections()
    RunDriver(run_id, lease=lease, should_stop=should_stop, tools=tools).drive()
