"""The run driver: holds one claimed Run's committed frontier and acts on it until the Run
waits, ends, or the worker stops.

Every decision starts from committed state (``recovery.next_action``, the seed's decision
table), so the same code serves a fresh run and a run recovered after a crash. The driver keeps
what each of its commits returned (head version, RunView, messages), so it reads nothing
between its own commits; it reloads only after a conflict.

A terminal result is *staged*: it is committed together with the next boundary (the next
call's Executing or Awaiting, or the batch's publication), never later than that and never
before its effect returned (README, "Commits that merge"). A stop flushes staged results in a
commit of their own.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from runtime import logs, sources, staging, tracing
from runtime.agents import Agent, get_agent
from runtime.commits import commit
from runtime.coordinator import Committed, Lease, read_frontier
from runtime.crash import crash_point
from runtime.domain import recovery as rec
from runtime.domain.commit import CommitDraft, end_cause_reason, ending, publication, stage
from runtime.domain.events import BatchFinalized, CallAwaiting, CallCompleted, Event
from runtime.domain.model import (
    CallPhase,
    Disposition,
    EndCause,
    Message,
    ResumeTicket,
    RunState,
    RunView,
    ThreadHead,
    TicketKind,
    ToolCall,
)
from runtime.errors import (
    IllegalTransition,
    InvalidCommit,
    LeaseLost,
    RunIsPaused,
    ToolSourceUnavailable,
    UnknownAgent,
    VersionConflict,
)
from runtime.loop import execute, gate, infer
from runtime.loop.boundary import Abandon, CommitParent, Services, WaitForLimit
from runtime.models import LateEvidence, MessageRecord, Run

log = logging.getLogger("runtime.loop")

NOTE_RETRIES = 10  # commits retried at a new thread version while only notes land before them


@dataclass(slots=True)
class Frontier:
    """What a claim read of a run: its committed view, the thread's version and metadata, and
    the thread's committed messages when the claim read them too (None: read when needed)."""

    run: RunView
    version: int
    metadata: dict[str, Any] = field(default_factory=dict)
    messages: list[Message] | None = None


@dataclass(frozen=True, slots=True)
class Staged:
    """A terminal result waiting for the next commit, with the attempt that produced it."""

    event: CallCompleted
    attempt: int


class RunDriver:
    """Drives one run for one worker while it holds ``lease`` (implements ``Boundary``).

    ``halt`` is set by the worker when it stops, and together with ``release`` when the run
    was released (ended by another writer, or the lease lost). The driver looks at
    it at every boundary and wakes on it while it waits on the model, a pause or a tool; it
    then commits what it has staged and returns. A tool still in flight when the run is
    released is abandoned whatever its policy, its result kept as late evidence (seed: the run
    ended first).
    """

    def __init__(
        self,
        run_id: str,
        *,
        lease: Lease,
        services: Services,
        halt: asyncio.Event | None = None,
        release: asyncio.Event | None = None,
        pause: asyncio.Event | None = None,
        frontier: Frontier | None = None,
    ) -> None:
        self.run_id = run_id
        self.lease = lease
        self.worker_id = lease.worker_id
        self.services = services
        self.halt = halt or asyncio.Event()
        self.release = release or asyncio.Event()
        self.pause = pause or asyncio.Event()
        self.committed: RunView | None = None
        self._run: RunView | None = None  # committed view plus staged results
        self.version = 0
        self.agent_version = ""  # the deployed version of the agent driving it, once loaded
        self.metadata: dict[str, Any] = {}
        self.messages: list[Message] | None = None  # the thread's committed messages
        self.staged: list[Staged] = []
        self.plugin_stage = staging.Stage()  # plugin state staged since the last commit
        if frontier is not None:
            self._hold(frontier.run, frontier.version)
            self.metadata = frontier.metadata
            self.messages = frontier.messages

    @property
    def run(self) -> RunView | None:
        return self._run

    def halted(self) -> bool:
        return self.halt.is_set()

    def released(self) -> bool:
        return self.release.is_set()

    def pausing(self) -> bool:
        return self.pause.is_set()

    async def until_halted(self) -> None:
        await self.halt.wait()

    async def until_released(self) -> None:
        await self.release.wait()

    # -- committed state --------------------------------------------------------------------

    def _hold(self, run: RunView, version: int) -> None:
        self.committed = self._run = run
        self.version = version

    async def reload(self) -> RunView:
        """Read the committed frontier again (after a conflict, or on a bare driver)."""
        head, run, metadata = await self.services.db(_read_claimed, self.run_id)
        self._hold(run, head.version)
        self.messages = None
        self.metadata = self.metadata or metadata
        return run

    async def thread_messages(self) -> list[Message]:
        """The thread's committed messages, read once per claim and then kept up to date."""
        if self.messages is None:
            assert self.committed is not None
            self.messages = await self.services.db(read_messages, self.committed.thread_id)
        return self.messages

    def stage_result(self, event: CallCompleted, attempt: int) -> None:
        """Hold a terminal result for the next commit; act on it meanwhile."""
        assert self._run is not None
        self.staged.append(Staged(event, attempt))
        self._run = stage(self._run, (event,))

    def draft(
        self,
        disposition: Disposition,
        events: tuple[Event, ...] = (),
        messages: tuple[Message, ...] = (),
    ) -> CommitDraft:
        """The next commit: every staged result, then ``events`` and the staged plugin state."""
        assert self.committed is not None
        return CommitDraft(
            thread_id=self.committed.thread_id,
            run_id=self.run_id,
            expected_version=self.version,
            disposition=disposition,
            messages=messages,
            events=tuple(s.event for s in self.staged) + events + self.plugin_stage.events(),
            actor=f"worker:{self.worker_id}",
            agent_version=self.agent_version,
        )

    async def commit(
        self,
        disposition: Disposition,
        events: tuple[Event, ...] = (),
        messages: tuple[Message, ...] = (),
    ) -> RunView:
        """Commit ``events`` after every staged result; return the committed RunView."""
        assert self.committed is not None
        draft = self.draft(disposition, events, messages)
        done = await self.services.db(commit_fenced, draft, self.lease, self.committed)
        return self.committed_as(done, draft)

    def committed_as(self, done: Committed, draft: CommitDraft) -> RunView:
        """Hold what a commit of ``draft`` (made of the staged results) returned."""
        assert done.run is not None
        flushed = bool(self.staged)
        self.staged.clear()
        self.plugin_stage.clear()
        self._hold(done.run, done.head.version)
        if self.messages is not None:  # a request carries no meta (see thread_messages)
            self.messages.extend(replace(m, meta={}) for m in draft.messages)
        if flushed:
            crash_point("call_completed")
        if any(isinstance(e, BatchFinalized) for e in draft.events):
            crash_point("batch_finalized")
        return done.run

    async def flush(self) -> None:
        """Commit staged results on their own (the worker stops before the next boundary)."""
        if self.staged:
            await self.commit(Disposition.running())

    async def park(
        self, call: ToolCall, kind: TicketKind, request: dict[str, Any], schema: Any
    ) -> None:
        """Commit the call Awaiting with a new ticket: the run waits for a ResumeCommand."""
        ticket = ResumeTicket(
            id=uuid.uuid4().hex,
            run_id=self.run_id,
            call_id=call.call_id,
            kind=kind,
            request=request,
            schema=schema,
        )
        await self.commit(
            Disposition.awaiting(ticket),
            (CallAwaiting(call_id=call.call_id, ticket_id=ticket.id),),
        )
        crash_point("ticket_committed")

    async def block(self, call: ToolCall, reason: str) -> None:
        await self.commit(
            Disposition.running(),
            (CallCompleted(call_id=call.call_id, result=reason, is_error=True),),
        )

    async def end(self, cause: EndCause, error: dict[str, Any] | None) -> None:
        assert self._run is not None
        events, messages = ending(self._run, end_cause_reason(cause))
        await self.commit(Disposition.ended(cause, error), events, messages)

    async def late(self, call_id: str, attempt: int, event: CallCompleted) -> None:
        log.info("run %s: late result for %s kept as evidence", self.run_id, call_id)
        await self.services.db(record_late, call_id, attempt, event, self.worker_id)

    async def commit_around[T](self, work: Callable[[CommitParent], T]) -> T:
        made: list[tuple[Committed, CommitDraft]] = []

        def commit_parent(disposition: Disposition, events: tuple[Event, ...]) -> RunView:
            assert self.committed is not None
            draft = self.draft(disposition, events)
            done = commit_fenced(draft, self.lease, self.committed)
            made.append((done, draft))
            assert done.run is not None
            return done.run

        value = await self.services.db(work, commit_parent)
        for done, draft in made:
            self.committed_as(done, draft)
        return value

    # -- the loop ---------------------------------------------------------------------------

    async def drive(self) -> RunView | None:
        """Act on the committed frontier until the run waits, ends, or the worker stops;
        return the committed RunView it leaves.

        Raises LeaseLost when another worker took the run over; a VersionConflict (an
        operator's command landed first) makes it reload and decide again.
        """
        with staging.active(self.plugin_stage):
            await self._drive()
        return self.committed

    async def _drive(self) -> None:
        if self.committed is None:
            await self.reload()
        assert self._run is not None
        logs.bind(thread_id=self._run.thread_id)
        try:
            agent = get_agent(self._run.agent)
        except UnknownAgent as exc:  # the deployment lost the agent: fail, do not loop
            if self._run.state is RunState.RUNNING:
                await self.end(EndCause.FAILED, {"type": exc.code, "message": exc.message})
            return
        self.agent_version = agent.deployed_version  # of the definition, before its sources
        try:  # the agent's source tools (MCP) are listed now and offered beside its own
            async with sources.attached(agent) as agent:
                await self._loop(agent)
        except ToolSourceUnavailable as exc:  # fails the run's step, not the worker
            log.warning("run %s: %s", self.run_id, exc.message)
            if self._run.state is RunState.RUNNING:
                await self.end(EndCause.FAILED, {"type": exc.code, "message": exc.message})

    async def _loop(self, agent: Agent) -> None:
        stopping = False
        while True:
            try:
                if stopping or self.halted():
                    await self.flush()
                    return
                assert self._run is not None
                if self._run.pause is not None:  # an operator paused it: nothing new starts
                    log.info("run %s: paused; letting it go", self.run_id)
                    await self.flush()
                    return
                action = rec.next_action(self._run, agent.step_limit)
                if isinstance(action, rec.Idle):
                    await self.flush()
                    return
                await self.act(agent, action)
            except (VersionConflict, RunIsPaused):
                log.info("run %s: another writer committed first; reloading", self.run_id)
                await self.after_conflict()
            except Abandon:
                stopping = True  # the next pass commits what is staged, then returns
            except WaitForLimit:
                await self.flush()  # the worker releases the run to wait for the model
                raise
            except LeaseLost:
                await self.keep_late(self.staged)
                raise
            except (InvalidCommit, IllegalTransition) as exc:
                # The rules refused what this step would commit: trying again would only
                # repeat it (and the model call), so the run fails with the typed error.
                log.error("run %s: commit refused: %s", self.run_id, exc.message)
                await self.keep_late(self.staged)
                self.staged.clear()
                await self.reload()
                await self.end(EndCause.FAILED, {"type": exc.code, "message": exc.message})
                return

    async def after_conflict(self) -> None:
        """Reload; keep each staged result whose call still waits for it, else keep it as
        late evidence (its call was sealed or superseded meanwhile)."""
        staged, self.staged = self.staged, []
        run = await self.reload()
        keep: list[Staged] = []
        late: list[Staged] = []
        for item in staged:
            call = run.find_call(item.event.call_id)
            current = (
                call is not None
                and run.state is RunState.RUNNING
                and call.phase is CallPhase.EXECUTING
                and call.attempt == item.attempt
            )
            (keep if current else late).append(item)
        await self.keep_late(late)
        for item in keep:
            self.stage_result(item.event, item.attempt)

    async def keep_late(self, items: list[Staged]) -> None:
        """A result that can no longer be committed is evidence for reconciliation."""
        for item in items:
            await self.late(item.event.call_id, item.attempt, item.event)

    @tracing.traced_action
    async def act(self, agent: Agent, action: rec.Action) -> None:
        match action:
            case rec.Infer(step=step):
                await infer.infer(self, agent, step)
            case rec.StepLimit():
                await self.end(EndCause.STEP_LIMIT, None)
            case rec.Gate(call=call):
                await self.gate(agent, call)
            case rec.ExecuteApproved(call=call):
                await execute.execute(self, agent, call, call.attempt + 1)
            case rec.RecoverExecuting(call=call):
                await execute.recover(self, agent, call)
            case rec.Park(ticket=ticket):
                await self.commit(Disposition.awaiting(ticket))
            case rec.Finalize(batch=batch):
                finalized = BatchFinalized(step=batch.step)
                await self.commit(Disposition.running(), (finalized,), publication(batch))

    async def gate(self, agent: Agent, call: ToolCall) -> None:
        """Apply what the gates of a Requested call decided (``gate.decide``)."""
        assert self._run is not None
        decision = gate.decide(self, agent, call)
        match decision:
            case gate.Block(reason=reason):
                await self.block(call, reason)
            case gate.Wait(kind=kind, request=request, schema=schema):
                await self.park(call, kind, request, schema)
            case gate.Go(tool=tool, arguments=arguments):
                await execute.execute(self, agent, call, 1, tool=tool, arguments=arguments)

    @staticmethod
    def pin(agent: Agent, index: int, out: Any) -> Any:
        """A Requested call with the policy, permission and budget in force now."""
        return infer.pin(agent, index, out)

    async def request(self, agent: Agent, run: RunView) -> Any:
        """The next inference request, from committed messages only (see infer.request)."""
        return await infer.request(self, agent, run)


def commit_fenced(draft: CommitDraft, lease: Lease, before: RunView) -> Committed:
    """Commit ``draft`` under ``lease`` on the frontier ``before`` (blocking).

    A conflict caused only by thread notes (reconciliations of earlier runs) landing first is
    retried at the thread's new version, up to NOTE_RETRIES times: the run itself did not
    move, so the same decision still holds. Raises what ``runtime.commits.commit`` raises.
    """
    for attempt in range(NOTE_RETRIES):
        head = ThreadHead(
            thread_id=draft.thread_id, version=draft.expected_version, active_run_id=draft.run_id
        )
        try:
            return commit(draft, lease=lease, head=head, before=before)
        except VersionConflict:
            moved, run = read_frontier(draft.thread_id, draft.run_id)
            if attempt == NOTE_RETRIES - 1 or run is None or run.version != before.version:
                raise
            draft = replace(draft, expected_version=moved.version)
    raise AssertionError("unreachable")


def _read_claimed(run_id: str) -> tuple[ThreadHead, RunView, dict[str, Any]]:
    """The committed head and run of ``run_id``, and the run's metadata (blocking)."""
    row = Run.objects.filter(id=run_id).values("thread_id", "metadata").first()
    assert row is not None, f"run {run_id} does not exist"
    head, run = read_frontier(row["thread_id"], run_id)
    assert run is not None
    return head, run, row["metadata"] or {}


def read_messages(thread_id: str) -> list[Message]:
    """The thread's committed messages, oldest first (blocking)."""
    rows = MessageRecord.objects.filter(thread_id=thread_id).order_by("seq", "idx")
    return [committed_message(row) for row in rows.values_list(*MESSAGE_COLUMNS)]


# The columns of a committed message that a request is built from (a request carries no meta).
MESSAGE_COLUMNS = ("role", "content", "tool_calls", "tool_call_id", "name")


def committed_message(row: Sequence[Any]) -> Message:
    """A Message from a row of MESSAGE_COLUMNS (read here, or returned by a claim)."""
    role, content, tool_calls, tool_call_id, name = row
    return Message(
        role=role,
        content=content,
        tool_calls=tuple(tool_calls),
        tool_call_id=tool_call_id,
        name=name,
    )


def record_late(call_id: str, attempt: int, event: CallCompleted, worker_id: str) -> None:
    """Keep a result that arrived after its call was sealed or superseded (never published)."""
    LateEvidence.objects.create(
        call_id=call_id,
        attempt=attempt,
        result=event.result,
        is_error=event.is_error,
        worker=worker_id,
    )
