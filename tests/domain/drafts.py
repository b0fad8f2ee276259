"""Builders of legal CommitDrafts from committed state (pure; shared by domain and DB tests).

Each builder takes the thread's head and the run's committed RunView and returns the one
commit that makes the named move, the way the loop and the operator commands would build it.
They do not validate: ``apply_commit`` (or the coordinator) does, which is what tests test.
"""

from __future__ import annotations

import itertools
import uuid
from typing import Any

from runtime.domain.commit import (
    CommitDraft,
    apply_commit,
    end_cause_reason,
    ending,
    publication,
)
from runtime.domain.events import (
    BatchFinalized,
    BatchOpened,
    CallAwaiting,
    CallCompleted,
    CallExecuting,
    CallIndeterminate,
    CallResumed,
    ReconciliationRecorded,
    RunActivated,
    StepCommitted,
)
from runtime.domain.model import (
    Decision,
    Disposition,
    EndCause,
    Message,
    Permission,
    RecoveryPolicy,
    ResumeTicket,
    RunView,
    ThreadHead,
    TicketKind,
    ToolCall,
)


class Ids:
    """Short unique ids: ``prefix`` + kind + counter (fits the 32-character id columns)."""

    def __init__(self, prefix: str | None = None) -> None:
        self.prefix = prefix if prefix is not None else uuid.uuid4().hex[:10]
        self._count = itertools.count(1)

    def __call__(self, kind: str) -> str:
        return f"{self.prefix}{kind}{next(self._count)}"


def make_call(
    index: int,
    *,
    ids: Ids,
    name: str = "echo",
    permission: Permission = Permission.ALLOW,
    policy: RecoveryPolicy = RecoveryPolicy.REPLAY,
    max_attempts: int = 1,
    arguments: Any = None,
) -> ToolCall:
    """A Requested call at ``index`` of a new batch, with fresh call/operation ids."""
    arguments = {"n": index} if arguments is None else arguments
    return ToolCall(
        call_id=ids("c"),
        index=index,
        tool_call_id=ids("tu"),
        name=name,
        arguments=arguments,
        arguments_text=str(arguments),
        operation_id=ids("op"),
        policy=policy,
        permission=permission,
        max_attempts=max_attempts,
    )


def _draft(head: ThreadHead, run: RunView, disposition: Disposition | None, **kw: Any):
    return CommitDraft(
        thread_id=head.thread_id,
        run_id=run.run_id,
        expected_version=head.version,
        disposition=disposition,
        **kw,
    )


def activate(
    head: ThreadHead,
    run_id: str,
    *,
    agent: str = "demo",
    text: str = "hello",
    system: str | None = None,
    metadata: Any = None,
    actor: str = "",
) -> CommitDraft:
    """RunActivation: the run's first commit, Running, with its input messages."""
    messages = ((Message(role="system", content=system),) if system else ()) + (
        Message(role="user", content=text),
    )
    return CommitDraft(
        thread_id=head.thread_id,
        run_id=run_id,
        expected_version=head.version,
        disposition=Disposition.running(),
        messages=messages,
        events=(RunActivated(run_id=run_id, agent=agent, metadata=metadata),),
        actor=actor,
    )


def infer_text(
    head: ThreadHead, run: RunView, *, text: str = "ok", end: bool = False
) -> CommitDraft:
    """A text-only inference: continue Running, or end naturally in the same commit."""
    disposition = Disposition.ended(EndCause.NATURAL) if end else Disposition.running()
    return _draft(
        head,
        run,
        disposition,
        messages=(Message(role="assistant", content=text),),
        events=(StepCommitted(step=run.step + 1),),
    )


def infer_tools(
    head: ThreadHead, run: RunView, calls: tuple[ToolCall, ...], *, text: str = ""
) -> CommitDraft:
    """An inference that asks for ``calls``: the assistant message and the whole batch."""
    step = run.step + 1
    blocks = tuple(
        {"id": c.tool_call_id, "name": c.name, "arguments": c.arguments_text} for c in calls
    )
    return _draft(
        head,
        run,
        Disposition.running(),
        messages=(Message(role="assistant", content=text, tool_calls=blocks),),
        events=(StepCommitted(step=step), BatchOpened(step=step, calls=calls)),
    )


def _call(run: RunView, call_id: str) -> ToolCall:
    call = run.find_call(call_id)
    assert call is not None, f"no call {call_id} in run {run.run_id}"
    return call


def execute(
    head: ThreadHead, run: RunView, call_id: str, *, attempt: int | None = None
) -> CommitDraft:
    """Commit the call's next executor attempt (Requested/Awaiting-approved/Executing ->
    Executing)."""
    attempt = _call(run, call_id).attempt + 1 if attempt is None else attempt
    return _draft(
        head, run, Disposition.running(), events=(CallExecuting(call_id=call_id, attempt=attempt),)
    )


def complete(
    head: ThreadHead, run: RunView, call_id: str, *, result: str = "done", is_error: bool = False
) -> CommitDraft:
    """Commit the call's terminal result."""
    return _draft(
        head,
        run,
        Disposition.running(),
        events=(CallCompleted(call_id=call_id, result=result, is_error=is_error),),
    )


def seal(head: ThreadHead, run: RunView, call_id: str, *, reason: str = "lost") -> CommitDraft:
    """Mark one call Indeterminate while the run goes on."""
    return _draft(
        head,
        run,
        Disposition.running(),
        events=(CallIndeterminate(call_id=call_id, reason=reason),),
    )


def ticket_for(
    run: RunView, call_id: str, ticket_id: str, kind: TicketKind = TicketKind.APPROVAL
) -> ResumeTicket:
    schema = {"type": "object"} if kind is TicketKind.INPUT else None
    return ResumeTicket(
        id=ticket_id,
        run_id=run.run_id,
        call_id=call_id,
        kind=kind,
        request={"question": f"{kind.value} for {call_id}"},
        schema=schema,
    )


def wait(
    head: ThreadHead,
    run: RunView,
    call_id: str,
    ticket_id: str,
    *,
    kind: TicketKind = TicketKind.APPROVAL,
    ticket: ResumeTicket | None = None,
) -> CommitDraft:
    """Park the call on a new ticket and the run with it (-> Awaiting(ticket))."""
    ticket = ticket or ticket_for(run, call_id, ticket_id, kind)
    return _draft(
        head,
        run,
        Disposition.awaiting(ticket),
        events=(CallAwaiting(call_id=call_id, ticket_id=ticket_id),),
    )


def resume(
    head: ThreadHead,
    run: RunView,
    decision: Decision,
    *,
    input: Any = None,
    reason: str = "",
    actor: str = "operator",
) -> CommitDraft:
    """Answer the run's open ticket (-> Running)."""
    ticket = run.ticket
    assert ticket is not None, f"run {run.run_id} has no open ticket"
    event = CallResumed(
        call_id=ticket.call_id,
        ticket_id=ticket.id,
        decision=decision,
        input=input,
        reason=reason,
    )
    return _draft(head, run, Disposition.running(), events=(event,), actor=actor)


def finalize(head: ThreadHead, run: RunView) -> CommitDraft:
    """Publish the open batch's results in call order (every call must be terminal)."""
    batch = run.open_batch
    assert batch is not None
    return _draft(
        head,
        run,
        Disposition.running(),
        messages=publication(batch),
        events=(BatchFinalized(step=batch.step),),
    )


def end(
    head: ThreadHead,
    run: RunView,
    cause: EndCause = EndCause.CANCELLED,
    *,
    reason: str = "",
    actor: str = "operator",
) -> CommitDraft:
    """End the run, sealing and finalizing its open batch in the same commit."""
    events, messages = ending(run, reason or end_cause_reason(cause))
    return _draft(
        head,
        run,
        Disposition.ended(cause, {"reason": reason} if reason else None),
        messages=messages,
        events=events,
        actor=actor,
    )


def reconcile(
    head: ThreadHead,
    run: RunView,
    call_id: str,
    *,
    outcome: str = "applied",
    evidence: str = "ledger row 7",
    actor: str = "operator",
) -> CommitDraft:
    """A thread note: what the downstream system says of an Indeterminate call."""
    return CommitDraft(
        thread_id=head.thread_id,
        run_id=None,
        expected_version=head.version,
        disposition=None,
        events=(
            ReconciliationRecorded(
                run_id=run.run_id, call_id=call_id, outcome=outcome, evidence=evidence
            ),
        ),
        actor=actor,
    )


class Log:
    """A thread's log in memory: each draft is validated by ``apply_commit`` and appended.

    ``commits`` holds ``(sequence, draft)`` pairs, ready for ``fold`` or the coordinator.
    """

    def __init__(self, thread_id: str) -> None:
        self.head = ThreadHead(thread_id=thread_id)
        self.runs: dict[str, RunView] = {}
        self.commits: list[tuple[int, CommitDraft]] = []

    def apply(self, draft: CommitDraft) -> RunView | None:
        """Validate and append ``draft``; return the run it leaves (raises on refusal)."""
        target = draft.run_id or next(
            (e.run_id for e in draft.events if isinstance(e, ReconciliationRecorded)), None
        )
        self.head, run = apply_commit(self.head, self.runs.get(target or ""), draft)
        if run is not None and draft.run_id is not None:
            self.runs[run.run_id] = run
        self.commits.append((self.head.version, draft))
        return run

    def run(self, run_id: str) -> RunView:
        return self.runs[run_id]
