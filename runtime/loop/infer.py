"""One inference: StepStart and BeforeInference hooks, the model call with live Deltas and
retries, AfterInference and StepEnd, then the commit (DESIGN.md "One Step").

A text-only answer commits with its continuation or Ended(natural) in one commit; tool calls
commit the assistant message with the whole batch as Requested before anything executes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from runtime import conf, limits, live, metrics
from runtime.agents import Agent
from runtime.crash import crash_point
from runtime.domain.events import BatchOpened, StepCommitted
from runtime.domain.limits import ModelLimit, Wait, outage_retry
from runtime.domain.model import (
    Disposition,
    Effects,
    EndCause,
    Message,
    Permission,
    RecoveryPolicy,
    RunView,
    ToolCall,
)
from runtime.errors import ScriptRefused
from runtime.hooks import call_hooks
from runtime.loop.boundary import Abandon, Boundary, ModelUnavailable, WaitForLimit, first
from runtime.models import StreamCheckpoint
from runtime.providers.base import (
    Delta,
    InferenceContext,
    InferenceRequest,
    InferenceResult,
    ModelError,
    Provider,
    ToolCallOut,
    ToolSpec,
)
from runtime.untrusted import UntrustedJSONError, parse_object

log = logging.getLogger("runtime.loop")

CHECKPOINT_SECONDS = 0.5  # the least time between two stream checkpoints of one attempt


async def request(d: Boundary, agent: Agent, run: RunView) -> InferenceRequest:
    """Build the next request from committed messages only (plus request-only hooks).

    The messages are the ones the driver holds; a fresh worker reads the same ones from the
    log, so the request is byte-identical either way (DESIGN.md decision).
    """
    committed = tuple(await d.thread_messages())
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


async def infer(d: Boundary, agent: Agent, step: int) -> None:
    """Ask the model for Step ``step`` and commit its answer (or end the run failed).

    Raises Abandon when the run halts while the model answers (the request is cancelled)."""
    run = d.run
    assert run is not None
    call_hooks(agent.plugins, "step_start", run)
    req = await request(d, agent, run)
    try:
        provider = _provider(d, agent)
        result = await _with_retries(d, agent, provider, req, step)
    except ModelError as exc:
        log.warning("run %s: inference failed for good: %s", d.run_id, exc)
        await d.end(EndCause.FAILED, exc.as_error())
        return
    call_hooks(agent.plugins, "after_inference", run, result)
    # A text-only answer ends the run unless a StepEnd hook asks for another step.
    proceed = any(call_hooks(agent.plugins, "step_end", run, result))
    await _commit(d, agent, step, req, result, proceed)


def _provider(d: Boundary, agent: Agent) -> Provider:
    """The run's model provider. A script stored before its rules tightened (start_run checks
    new ones), or a provider kind the deployment cannot load (RUNTIME_PROVIDERS), fails the
    run as a model that refuses for good does, not as a crash."""
    try:
        return d.services.providers.get(agent.provider, d.metadata)
    except ScriptRefused as exc:
        raise ModelError(str(exc), provider="scripted", retryable=False) from exc
    except ImproperlyConfigured as exc:  # an unknown kind, a missing extra: fails for good
        raise ModelError(str(exc), provider=agent.provider.kind, retryable=False) from exc


async def _with_retries(
    d: Boundary, agent: Agent, provider: Provider, req: InferenceRequest, step: int
) -> InferenceResult:
    """Call the provider; retry retryable failures with doubling backoff within budget.

    A model with a limit (RUNTIME_MODEL_LIMITS) is asked only with a slot of its budget
    (raises WaitForLimit when there is none); a Retry-After it answers pauses its whole
    budget, for every worker, and this run waits for it like the others."""
    model = limits.model_of(agent)
    limit = limits.model_limit(agent)
    backoff = conf.model_backoff_seconds()
    attempt = 0
    while True:
        attempt += 1
        try:
            return await _limited_answer(d, model, limit, provider, req, step, attempt)
        except ModelError as exc:
            # A limited model's Retry-After was recorded as the slot was given back.
            if not exc.retryable:
                raise
            if attempt > conf.model_retries():
                raise await _outage(d, exc) from exc
            if limit is not None and exc.retry_after is not None:
                continue  # the next attempt waits, released, until the budget's pause ends
            pause = exc.retry_after if exc.retry_after is not None else backoff
            backoff *= 2
            log.info(
                "run %s: retryable model error (%s); retry in %.2fs", d.run_id, exc.message, pause
            )
            await _pause(d, pause)


async def _outage(d: Boundary, exc: ModelError) -> ModelUnavailable | ModelError:
    """The model still fails retryably after the quick retries: an outage. Return the
    decision to release the run and wait (ModelUnavailable), or, once the model has failed
    for RUNTIME_MODEL_OUTAGE_SECONDS since it began to in this step, the error that fails
    the run, saying so (issue 31, item 6)."""
    now = timezone.now()
    since = await d.services.db(limits.model_unavailable_since, d.run_id) or now
    horizon = conf.model_outage()
    wait = outage_retry(since, now, horizon, exc.retry_after)
    if wait is None:
        return ModelError(
            f"{exc.message} (the model failed for {_duration(now - since)}; the run waits up"
            f" to {_duration(horizon)}, RUNTIME_MODEL_OUTAGE_SECONDS)",
            provider=exc.provider,
            retryable=exc.retryable,
            status=exc.status,
        )
    reason = (
        f"waiting for the model: failing since {since:%Y-%m-%d %H:%M:%S} UTC,"
        f" next try in {_duration(wait)}, the run fails after {_duration(horizon)}"
        f" ({exc.message[:150]})"
    )
    return ModelUnavailable(wait, reason, since)


def _duration(span: timedelta) -> str:
    """``span`` as people read it: "45 s", "12 min", "2 h 5 min"."""
    seconds = round(span.total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


async def _limited_answer(
    d: Boundary,
    model: str,
    limit: ModelLimit | None,
    provider: Provider,
    req: InferenceRequest,
    step: int,
    attempt: int,
) -> InferenceResult:
    """One attempt, holding a slot of the model's budget when it has a limit."""
    if limit is None:
        return await _answer(d, provider, req, step, attempt)
    slot = await d.services.db(limits.take_model, model, limit, d.run_id, d.lease.epoch)
    if isinstance(slot, Wait):
        raise WaitForLimit(limits.wait_delta(slot.seconds), slot.reason)
    retry_after = None
    try:
        return await _answer(d, provider, req, step, attempt)
    except ModelError as exc:
        retry_after = exc.retry_after
        raise
    finally:
        # The pause is written with the slot's release (one transaction): freed first, the
        # slot would let another worker's request through before the pause is recorded.
        await d.services.db(limits.give_back, slot, model, retry_after)


async def _answer(
    d: Boundary, provider: Provider, req: InferenceRequest, step: int, attempt: int
) -> InferenceResult:
    """One attempt, given up (and its request cancelled) when the run halts first."""
    checkpoints = Checkpoints(d, step, attempt)
    ctx = await _context(d, step, attempt, checkpoints)
    answer = asyncio.ensure_future(metrics.measure_inference(provider, req, ctx))
    try:
        if not await first(answer, d.until_halted()):
            answer.cancel()
            with contextlib.suppress(BaseException):
                await answer
            raise Abandon()
        return answer.result()
    finally:
        await checkpoints.settle()  # none lands after the step's commit clears it


async def _pause(d: Boundary, seconds: float) -> None:
    """Sleep ``seconds``; raise Abandon as soon as the run halts."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(d.until_halted(), seconds)
        raise Abandon()


async def _context(
    d: Boundary, step: int, attempt: int, checkpoints: Checkpoints
) -> InferenceContext:
    first_delta = [True]
    streamed = [0]  # characters of text this attempt published: the next text delta's offset

    def on_delta(delta: Delta) -> None:
        offset = streamed[0] if delta.kind == "text" else None
        if delta.kind == "text":
            streamed[0] += len(delta.text or "")
        live.publish_delta(
            d.run_id,
            step=step,
            attempt=attempt,
            claim=d.lease.epoch,
            first=first_delta[0],
            delta={
                "kind": delta.kind,
                "text": delta.text,
                "index": delta.index,
                "name": delta.name,
                "call_id": delta.call_id,
                # Where the text goes in the attempt's text: a viewer that started from the
                # checkpoint skips what it already has (issue 22, defect 4).
                "offset": offset,
            },
        )
        if first_delta[0]:
            first_delta[0] = False
            crash_point("inference_streaming")

    # A retry re-sends the identical request (README departure "resume_from means restart");
    # the checkpoint is read only when a provider asks to resume.
    resume_from = await d.services.db(_checkpoint, d.run_id, step) if attempt > 1 else None
    return InferenceContext(
        run_id=d.run_id,
        step=step,
        attempt=attempt,
        metadata=d.metadata,
        on_delta=on_delta,
        checkpoint=checkpoints.save,
        resume_from=resume_from,
    )


def _checkpoint(run_id: str, step: int) -> Mapping[str, Any] | None:
    return (
        StreamCheckpoint.objects.filter(run_id=run_id, step=step)
        .values("text", "tool_calls")
        .first()
    )


class Checkpoints:
    """The stream checkpoints of one attempt, written in the background: ``save`` never waits
    on the database (a stream must not). The first is written at once (a viewer who joins
    late is shown the opening words), later ones at most every CHECKPOINT_SECONDS, each with
    the newest text: a worker streaming a thousand runs writes a few checkpoints a run, not
    one every few deltas.

    Best effort: a failure to write the checkpoint never fails the run (seed).
    """

    def __init__(self, d: Boundary, step: int, attempt: int) -> None:
        self.d = d
        self.step = step
        self.attempt = attempt
        self.latest: tuple[str, list[dict[str, Any]]] | None = None
        self.writer: asyncio.Task[None] | None = None
        self.idle = asyncio.Event()  # no write under way
        self.idle.set()

    def save(self, text: str, calls: list[dict[str, Any]]) -> None:
        self.latest = (text, calls)
        if self.writer is None or self.writer.done():
            self.writer = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        while self.latest is not None:
            (text, calls), self.latest = self.latest, None
            # The claim (lease epoch) tells a late viewer whose stream the text is.
            fields = {"step": self.step, "attempt": self.attempt, "text": text}
            fields["claim"] = self.d.lease.epoch
            self.idle.clear()
            try:
                await self.d.services.db(_save_checkpoint, self.d.run_id, fields, calls)
            except Exception:
                log.warning("run %s: checkpoint write failed", self.d.run_id, exc_info=True)
            finally:
                self.idle.set()
            await asyncio.sleep(CHECKPOINT_SECONDS)

    async def settle(self) -> None:
        """The answer is complete: drop what waits (the step's commit clears the checkpoint)
        and wait for a write under way, so that none lands after that commit."""
        self.latest = None
        if self.writer is not None:
            await self.idle.wait()
            self.writer.cancel()


def _save_checkpoint(run_id: str, fields: dict[str, Any], calls: list[dict[str, Any]]) -> None:
    """One UPDATE while the run's checkpoint exists, an INSERT the first time: a stream writes
    one every few deltas (the scripted model's slow stream, every delta), and
    update_or_create's transaction with a locking read took four statements each, in the
    process that may also serve viewers (issue 12, item 8). The run's lease keeps a second
    writer away; a lost race is an IntegrityError, logged by the caller.
    """
    fields = {**fields, "tool_calls": calls}
    stamped = {**fields, "updated_at": timezone.now()}  # update() skips auto_now
    if not StreamCheckpoint.objects.filter(run_id=run_id).update(**stamped):
        StreamCheckpoint.objects.create(run_id=run_id, **fields)


async def _commit(
    d: Boundary,
    agent: Agent,
    step: int,
    req: InferenceRequest,
    result: InferenceResult,
    proceed: bool,
) -> None:
    blocks, raw = history_blocks(result.tool_calls)
    meta: dict[str, Any] = {
        "request_sha256": req.digest(),
        "finish_reason": result.finish_reason,
        "usage": dict(result.usage),
    }
    if raw:
        meta["raw_arguments"] = raw
    message = Message(role="assistant", content=result.text, tool_calls=blocks, meta=meta)
    if not result.tool_calls:
        after = Disposition.running() if proceed else Disposition.ended(EndCause.NATURAL)
        await d.commit(after, (StepCommitted(step=step),), (message,))
        return
    calls = tuple(pin(agent, index, out) for index, out in enumerate(result.tool_calls))
    events = (StepCommitted(step=step), BatchOpened(step=step, calls=calls))
    await d.commit(Disposition.running(), events, (message,))
    crash_point("batch_committed")


def history_blocks(
    outs: tuple[ToolCallOut, ...] | list[ToolCallOut],
) -> tuple[tuple[dict[str, Any], ...], dict[str, str]]:
    """The assistant's tool-use blocks as the thread's history keeps them, and the raw text of
    arguments that are not a JSON object, by call id.

    The history is sent back to the provider with every later request, so it must stay valid
    for it: unparseable arguments become ``"{}"`` there, while the raw text stays in the
    message's ``meta.raw_arguments`` and the call's ``arguments_text`` for audit (the call
    itself gets an error result that names the problem).
    """
    blocks, raw = [], {}
    for out in outs:
        arguments = out.arguments
        try:
            parse_object(arguments)
        except UntrustedJSONError:
            raw[out.id] = arguments
            arguments = "{}"
        blocks.append({"id": out.id, "name": out.name, "arguments": arguments})
    return tuple(blocks), raw


def pin(agent: Agent, index: int, out: ToolCallOut) -> ToolCall:
    """A Requested call with the policy, permission, budget, source and effects in force now
    (pinned)."""
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
        source=dict(tool.source) if tool else {"kind": "python"},
        effects=tool.effects if tool else Effects.ONCE,
    )
