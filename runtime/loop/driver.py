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

import logging
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from typing import Any

from runtime import logs, staging, tracing
from runtime.agents import Agent, get_agent
from runtime.coordinator import Lease, commit, read_frontier
from runtime.crash import crash_point
from runtime.domain import recovery as rec
from runtime.domain.commit import CommitDraft, end_cause_reason, ending, publication, stage
from runtime.domain.events import BatchFinalized, CallCompleted, Event
from runtime.domain.model import (
    CallPhase,
    Disposition,
    EndCause,
    Message,
    RunState,
    RunView,
    ThreadHead,
)
from runtime.errors import (
    IllegalTransition,
    InvalidCommit,
    LeaseLost,
    McpServerUnavailable,
    UnknownAgent,
    VersionConflict,
)
from runtime.loop import execute, gate, infer
from runtime.loop.tools import ToolThread
from runtime.mcp.tools import attached
from runtime.models import LateEvidence, MessageRecord, Run

log = logging.getLogger("runtime.loop")

NOTE_RETRIES = 10  # commits retried at a new thread version while only notes land before them


class Abandon(Exception):
    """The worker stops at this boundary; nothing uncommitted is kept but staged results."""


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
    """Drives one run for one worker while it holds ``lease``.

    ``should_stop()`` is polled at every boundary; when it turns true the driver commits what it
    has staged and returns. ``released()`` turns true when the run was ended by another writer
    or the lease was lost: a tool still in flight is then abandoned whatever its policy, its
    result kept as late evidence (seed: the run ended first).
    """

    def __init__(
        self,
        run_id: str,
        *,
        lease: Lease,
        should_stop: Callable[[], bool],
        tools: ToolThread | None = None,
        frontier: Frontier | None = None,
        released: Callable[[], bool] = lambda: False,
    ) -> None:
        self.run_id = run_id
        self.owns_tools = tools is None
        self.tools = tools or ToolThread()
        self.lease = lease
        self.worker_id = lease.worker_id
        self.should_stop = should_stop
        self.released = released
        self.committed: RunView | None = None
        self.run: RunView | None = None  # committed view plus staged results
        self.version = 0
        self.metadata: dict[str, Any] = {}
        self.messages: list[Message] | None = None  # the thread's committed messages
        self.staged: list[Staged] = []
        self.claim = ExitStack()  # what lives as long as this claim: the MCP sessions
        self.plugin_stage = staging.Stage()  # plugin state staged since the last commit
        if frontier is not None:
            self._hold(frontier.run, frontier.version)
            self.metadata = frontier.metadata
            self.messages = frontier.messages

    # -- committed state --------------------------------------------------------------------

    def _hold(self, run: RunView, version: int) -> None:
        self.committed = self.run = run
        self.version = version

    def reload(self) -> RunView:
        """Read the committed frontier again (after a conflict, or on a bare driver)."""
        head, run = read_frontier(self.thread_id_of(), self.run_id)
        assert run is not None
        self._hold(run, head.version)
        self.messages = None
        if not self.metadata:
            row = Run.objects.filter(id=self.run_id).values_list("metadata", flat=True).first()
            self.metadata = row or {}
        return run

    def thread_id_of(self) -> str:
        if self.committed is not None:
            return self.committed.thread_id
        thread_id = Run.objects.filter(id=self.run_id).values_list("thread_id", flat=True).first()
        assert thread_id is not None, f"run {self.run_id} does not exist"
        return thread_id

    def thread_messages(self) -> list[Message]:
        """The thread's committed messages, read once per claim and then kept up to date."""
        if self.messages is None:
            thread_id = self.thread_id_of()
            rows = MessageRecord.objects.filter(thread_id=thread_id).order_by("seq", "idx")
            self.messages = [committed_message(row) for row in rows.values_list(*MESSAGE_COLUMNS)]
        return self.messages

    def stage_result(self, event: CallCompleted, attempt: int) -> None:
        """Hold a terminal result for the next commit; act on it meanwhile."""
        assert self.run is not None
        self.staged.append(Staged(event, attempt))
        self.run = stage(self.run, (event,))

    def commit(
        self,
        disposition: Disposition,
        events: tuple[Event, ...] = (),
        messages: tuple[Message, ...] = (),
    ) -> RunView:
        """Commit ``events`` after every staged result; return the committed RunView."""
        assert self.committed is not None
        flushed = tuple(s.event for s in self.staged)
        draft = CommitDraft(
            thread_id=self.committed.thread_id,
            run_id=self.run_id,
            expected_version=self.version,
            disposition=disposition,
            messages=messages,
            # staged plugin state rides the boundary's commit (runtime.staging)
            events=flushed + events + self.plugin_stage.events(),
            actor=f"worker:{self.worker_id}",
        )
        for attempt in range(NOTE_RETRIES):
            head = ThreadHead(
                thread_id=draft.thread_id, version=self.version, active_run_id=self.run_id
            )
            try:
                done = commit(draft, lease=self.lease, head=head, before=self.committed)
                break
            except VersionConflict:
                if attempt == NOTE_RETRIES - 1 or not self.only_notes_landed():
                    raise
                draft = replace(draft, expected_version=self.version)
        assert done.run is not None
        self.staged.clear()
        self.plugin_stage.clear()
        self._hold(done.run, done.head.version)
        if self.messages is not None:  # a request carries no meta (see thread_messages)
            self.messages.extend(replace(m, meta={}) for m in messages)
        if flushed:
            crash_point("call_completed")
        if any(isinstance(e, BatchFinalized) for e in events):
            crash_point("batch_finalized")
        return done.run

    def only_notes_landed(self) -> bool:
        """After a conflict: True when the run itself did not move (only thread notes, such as
        reconciliations of earlier runs, landed), so the same decision still holds; the held
        version is moved to the thread's."""
        assert self.committed is not None
        head, run = read_frontier(self.committed.thread_id, self.run_id)
        if run is None or run.version != self.committed.version:
            return False
        self.version = head.version
        return True

    def flush(self) -> None:
        """Commit staged results on their own (the worker stops before the next boundary)."""
        if self.staged:
            self.commit(Disposition.running())

    # -- the loop ---------------------------------------------------------------------------

    def drive(self) -> RunView | None:
        """Act on the committed frontier until the run waits, ends, or the worker stops;
        return the committed RunView it leaves.

        Raises LeaseLost when another worker took the run over; a VersionConflict (an
        operator's command landed first) makes it reload and decide again.
        """
        try:
            with staging.active(self.plugin_stage):
                self._drive()
            return self.committed
        finally:
            self.claim.close()
            if self.owns_tools:
                self.tools.close()

    def _drive(self) -> None:
        if self.committed is None:
            self.reload()
        assert self.run is not None
        logs.bind(thread_id=self.run.thread_id)
        try:
            agent = get_agent(self.run.agent)
        except UnknownAgent as exc:  # the deployment lost the agent: fail, do not loop
            if self.run.state is RunState.RUNNING:
                self.end(EndCause.FAILED, {"type": exc.code, "message": exc.message})
            return
        try:  # the agent's MCP tools are listed now and offered beside its own
            agent = self.claim.enter_context(attached(agent))
        except McpServerUnavailable as exc:  # fails the run's step, not the worker
            log.warning("run %s: %s", self.run_id, exc.message)
            if self.run.state is RunState.RUNNING:
                self.end(EndCause.FAILED, {"type": exc.code, "message": exc.message})
            return
        stopping = False
        while True:
            try:
                if stopping or self.should_stop():
                    self.flush()
                    return
                action = rec.next_action(self.run, agent.step_limit)
                if isinstance(action, rec.Idle):
                    self.flush()
                    return
                self.act(agent, action)
            except VersionConflict:
                log.info("run %s: another writer committed first; reloading", self.run_id)
                self.after_conflict()
            except Abandon:
                stopping = True  # the next pass commits what is staged, then returns
            except LeaseLost:
                self.keep_late(self.staged)
                raise
            except (InvalidCommit, IllegalTransition) as exc:
                # The rules refused what this step would commit: trying again would only
                # repeat it (and the model call), so the run fails with the typed error.
                log.error("run %s: commit refused: %s", self.run_id, exc.message)
                self.keep_late(self.staged)
                self.staged.clear()
                self.reload()
                self.end(EndCause.FAILED, {"type": exc.code, "message": exc.message})
                return

    def after_conflict(self) -> None:
        """Reload; keep each staged result whose call still waits for it, else keep it as
        late evidence (its call was sealed or superseded meanwhile)."""
        staged, self.staged = self.staged, []
        run = self.reload()
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
        self.keep_late(late)
        for item in keep:
            self.stage_result(item.event, item.attempt)

    def keep_late(self, items: list[Staged]) -> None:
        """A result that can no longer be committed is evidence for reconciliation."""
        for item in items:
            log.info("run %s: late result for %s kept as evidence", self.run_id, item.event.call_id)
            record_late(item.event.call_id, item.attempt, item.event, self.worker_id)

    @tracing.traced_action
    def act(self, agent: Agent, action: rec.Action) -> None:
        match action:
            case rec.Infer(step=step):
                infer.infer(self, agent, step)
            case rec.StepLimit():
                self.end(EndCause.STEP_LIMIT, None)
            case rec.Gate(call=call):
                gate.gate(self, agent, call)
            case rec.ExecuteApproved(call=call):
                execute.execute(self, agent, call, call.attempt + 1)
            case rec.RecoverExecuting(call=call):
                execute.recover(self, agent, call)
            case rec.Park(ticket=ticket):
                self.commit(Disposition.awaiting(ticket))
            case rec.Finalize(batch=batch):
                finalized = BatchFinalized(step=batch.step)
                self.commit(Disposition.running(), (finalized,), publication(batch))

    def end(self, cause: EndCause, error: dict[str, Any] | None) -> None:
        assert self.run is not None
        events, messages = ending(self.run, end_cause_reason(cause))
        self.commit(Disposition.ended(cause, error), events, messages)

    @staticmethod
    def pin(agent: Agent, index: int, out: Any) -> Any:
        """A Requested call with the policy, permission and budget in force now."""
        return infer.pin(agent, index, out)

    def request(self, agent: Agent, run: RunView) -> Any:
        """The next inference request, from committed messages only (see infer.request)."""
        return infer.request(self, agent, run)


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
