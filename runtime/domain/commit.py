"""Validation of one ThreadCommit against the committed state, and the fold of a log.

``apply_commit`` is the single rule book: the coordinator calls it before writing anything,
and the log checker folds whole logs with it. It raises a typed RuntimeFault for anything the
seed or DESIGN.md does not allow, and otherwise returns the new head and run state.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from runtime.domain import transitions as t
from runtime.domain.events import (
    BatchFinalized,
    BatchOpened,
    CallAwaiting,
    CallCompleted,
    CallExecuting,
    CallIndeterminate,
    CallResumed,
    ChildStarted,
    Event,
    ReconciliationRecorded,
    RunActivated,
    RunForked,
    RunMoved,
    RunPaused,
    RunResumed,
    StateStaged,
    StepCommitted,
)
from runtime.domain.model import (
    DECISIONS_FOR_KIND,
    JSON,
    OPERATOR_DECISIONS,
    CallPhase,
    Decision,
    Disposition,
    EndCause,
    Message,
    Reconciliation,
    ResumeCommand,
    ResumeTicket,
    RunState,
    RunView,
    ThreadHead,
    TicketKind,
    ToolBatch,
    ToolCall,
)
from runtime.errors import (
    AlreadyPaused,
    IllegalTransition,
    InvalidCommit,
    InvalidDisposition,
    KindMismatch,
    NotActiveRun,
    NotAwaiting,
    NotFound,
    NotPaused,
    RunAlreadyActive,
    RunEnded,
    RunIsPaused,
    TicketConsumed,
    TicketMismatch,
    TicketNotAnswerable,
    VersionConflict,
)

RECONCILIATION_OUTCOMES = ("applied", "not_applied", "unknown")
# What may happen to an Awaiting run: a validated resume, or sealing when it ends, or an
# operator's pause or resume.
AWAITING_EVENTS = (
    CallResumed,
    CallIndeterminate,
    BatchFinalized,
    RunPaused,
    RunResumed,
    RunMoved,
)
# What starts something new: refused while the run is paused (README, "Pause"). A result of a
# call whose effect started, an answer to an open ticket, and the sealing of an ending run
# are still committed.
STARTING_EVENTS = (StepCommitted, BatchOpened, CallExecuting, CallAwaiting, ChildStarted, RunForked)
# An operator's commit of its own that keeps the run's disposition: a pause, a resume, a move.
OPERATOR_EVENTS = (RunPaused, RunResumed, RunMoved)
# The longest reason a pause or a resume records, on every surface (API, console, CLI).
PAUSE_REASON_MAX = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitDraft:
    """One ThreadCommit before it is written.

    ``run_id`` is None only for a thread note (reconciliation facts), which carries no
    disposition. ``expected_version`` is the thread's last commit sequence as the writer saw it.
    ``agent_version`` is the deployed version of the agent whose code wrote it: a worker's
    commits carry it, an operator's and a start's carry "" (issue 34).
    """

    thread_id: str
    run_id: str | None
    expected_version: int
    disposition: Disposition | None
    messages: tuple[Message, ...] = ()
    events: tuple[Event, ...] = ()
    actor: str = ""
    agent_version: str = ""  # the agent's version whose code wrote it (a worker's commit)


# -- run-level rules ---------------------------------------------------------------------------


def _refuse_run(before: RunState | None, to: RunState, why: str) -> IllegalTransition:
    return IllegalTransition("run", before.value if before else "(new)", to.value, why)


def _replace_call(run: RunView, call: ToolCall) -> RunView:
    batch = run.open_batch
    assert batch is not None
    calls = tuple(call if c.call_id == call.call_id else c for c in batch.calls)
    return replace(run, batches=(*run.batches[:-1], replace(batch, calls=calls)))


def _open_call(run: RunView, call_id: str) -> ToolCall:
    batch = run.open_batch
    call = batch.call(call_id) if batch else None
    if call is None:
        raise InvalidCommit(f"call {call_id} is not in the run's open batch", call_id=call_id)
    return call


def _check_in_order(run: RunView, call: ToolCall) -> None:
    """Calls start in the model's order: every earlier call must be terminal first, or
    awaiting its delegated child (terminal-only delegation runs concurrently)."""
    batch = run.open_batch
    assert batch is not None
    earlier = [
        c for c in batch.calls if c.index < call.index and not (c.phase.terminal or c.detached)
    ]
    if earlier and call.phase is CallPhase.REQUESTED:
        raise IllegalTransition(
            "tool call",
            call.phase.value,
            "started",
            f"call {earlier[0].index} must finish first (calls run in order)",
            call_id=call.call_id,
        )


def _apply_event(run: RunView, event: Event) -> RunView:  # noqa: C901 - one branch per event
    if run.pause is not None and isinstance(event, STARTING_EVENTS):
        raise RunIsPaused(
            f"run {run.run_id} is paused: {type(event).__name__} starts something new",
            ticket_id=run.pause.id,
        )
    match event:
        case StepCommitted(step=step):
            if run.open_batch is not None:
                raise InvalidCommit("an open batch must finish before the model is asked again")
            if step != run.step + 1:
                raise InvalidCommit(f"step must be {run.step + 1}, got {step}")
            return replace(run, step=step)
        case BatchOpened(step=step, calls=calls):
            return _open_batch(run, step, calls)
        case CallExecuting(call_id=call_id, attempt=attempt):
            call = _open_call(run, call_id)
            _check_in_order(run, call)
            return _replace_call(run, t.start_attempt(call, attempt))
        case CallAwaiting(call_id=call_id, ticket_id=ticket_id):
            call = _open_call(run, call_id)
            _check_in_order(run, call)
            return _replace_call(run, t.await_ticket(call, ticket_id))
        case ChildStarted():
            return _start_child(run, event)
        case CallResumed():
            return _resume(run, event)
        case CallCompleted(call_id=call_id, result=result, is_error=is_error):
            call = _open_call(run, call_id)
            _check_in_order(run, call)
            # An approval lets the call run, never stand in for its result; but the code that
            # drives the run may no longer be able to run it (a deploy removed its tool or
            # changed its schema, issue 34): then it completes as an error, not run.
            if call.phase is CallPhase.AWAITING and call.approved and not is_error:
                raise t._refuse(call, CallPhase.COMPLETED, "an approved call must execute first")
            return _replace_call(run, t.complete(call, result, is_error=is_error))
        case CallIndeterminate(call_id=call_id, reason=reason):
            return _replace_call(run, t.seal_indeterminate(_open_call(run, call_id), reason))
        case BatchFinalized(step=step):
            batch = run.open_batch
            if batch is None or batch.step != step:
                raise InvalidCommit(f"no open batch for step {step}")
            if not batch.all_terminal:
                waiting = [c.index for c in batch.calls if not c.phase.terminal]
                raise InvalidCommit(f"calls {waiting} are not terminal; the batch stays open")
            return replace(run, batches=(*run.batches[:-1], replace(batch, finalized=True)))
        case StateStaged(key=key, value=value):
            if not key or not isinstance(value, dict):
                raise InvalidCommit("staged state is a JSON object under a plugin's key")
            return replace(run, plugin_state={**run.plugin_state, key: value})
        case RunForked(at_step=at_step):
            if run.open_batch is not None or run.state is not RunState.RUNNING:
                raise InvalidCommit("a run is forked at the end of a step, while Running")
            if at_step != run.step or at_step < 1:
                raise InvalidCommit(f"the fork point ends step {run.step}, not {at_step}")
            return run
        case RunPaused(ticket=ticket):
            return _pause(run, ticket)
        case RunResumed(ticket_id=ticket_id):
            return _unpause(run, ticket_id)
        case RunMoved(from_version=from_version, to_version=to_version):
            if from_version != run.agent_version:
                raise InvalidCommit(
                    f"the run is on version {run.agent_version!r}, not {from_version!r}"
                )
            if not to_version or to_version == from_version:
                raise InvalidCommit("a run moves to another, named version")
            return replace(run, agent_version=to_version)
        case RunActivated() | ReconciliationRecorded():
            raise InvalidCommit(f"{type(event).__name__} cannot appear here")
    raise InvalidCommit(f"unknown event {event!r}")


def stage(run: RunView, events: Iterable[Event]) -> RunView:
    """Return ``run`` with ``events`` applied as a commit would apply them, disposition aside.

    A worker acts on this view while a terminal result waits to be committed together with
    the next boundary (README, "Commits that merge"); the commit validates them again. Raises
    what ``apply_commit`` raises for an illegal event.
    """
    for event in events:
        run = _apply_event(run, event)
    return run


def _open_batch(run: RunView, step: int, calls: tuple[ToolCall, ...]) -> RunView:
    if run.open_batch is not None:
        raise InvalidCommit("the run already has an open batch")
    if step != run.step:
        raise InvalidCommit("a batch opens in the commit of the inference that produced it")
    if not calls:
        raise InvalidCommit("a batch has at least one call")
    for index, call in enumerate(calls):
        if call.index != index or call.phase is not CallPhase.REQUESTED or call.attempt:
            raise InvalidCommit("a new batch lists its calls in order, all Requested")
    if len({c.call_id for c in calls}) != len(calls) or len({c.operation_id for c in calls}) != len(
        calls
    ):
        raise InvalidCommit("call ids and operation ids are unique within a batch")
    # A call id or operation id seen before would request an old call again (even one that
    # was Executing): refuse it here rather than at the projection's unique index.
    earlier = [c for b in run.batches for c in b.calls]
    if {c.call_id for c in calls} & {c.call_id for c in earlier} or {
        c.operation_id for c in calls
    } & {c.operation_id for c in earlier}:
        raise InvalidCommit("a call id or operation id of an earlier batch is never reused")
    return replace(run, batches=(*run.batches, ToolBatch(step=step, calls=calls)))


def _pause(run: RunView, ticket: ResumeTicket) -> RunView:
    """Open the run's pause ticket (README, "Pause"); raises AlreadyPaused, InvalidCommit."""
    if run.pause is not None:
        raise AlreadyPaused(ticket_id=run.pause.id, **pause_detail(run.pause))
    if ticket.kind is not TicketKind.PAUSE or ticket.run_id != run.run_id or ticket.call_id:
        raise InvalidCommit("a pause ticket is of kind pause, names its run and no call")
    if ticket.id in run.consumed_tickets or ticket.id in open_ticket_ids(run):
        raise InvalidDisposition("a ticket is opened once")
    return replace(run, pause=ticket)


def _unpause(run: RunView, ticket_id: str) -> RunView:
    """Consume the run's pause ticket; raises NotPaused, TicketConsumed, TicketMismatch."""
    if run.pause is None:
        if ticket_id in run.consumed_tickets:
            raise TicketConsumed(ticket_id=ticket_id)
        raise NotPaused(state=run.state.value)
    if ticket_id != run.pause.id:
        raise TicketMismatch(open_ticket=run.pause.id, given=ticket_id)
    return replace(run, pause=None, consumed_tickets=(*run.consumed_tickets, ticket_id))


def pause_detail(ticket: ResumeTicket) -> dict[str, JSON]:
    """Who paused the run, when and why, from its pause ticket's request."""
    request = ticket.request if isinstance(ticket.request, dict) else {}
    return {key: request.get(key) for key in ("paused_by", "paused_at", "reason")}


def open_ticket_ids(run: RunView) -> set[str]:
    """The ids of every open ticket of the run: its own, its delegation waits, its pause."""
    ids = {w.id for w in run.waits} | ({run.ticket.id} if run.ticket else set())
    return ids | ({run.pause.id} if run.pause else set())


def _start_child(run: RunView, event: ChildStarted) -> RunView:
    """The delegated wait of an Executing call (DESIGN.md: Executing -> Awaiting, delegated)."""
    ticket = event.ticket
    if (
        ticket.kind is not TicketKind.DELEGATION
        or ticket.call_id != event.call_id
        or ticket.run_id != run.run_id
        or ticket.request.get("child_run_id") != event.child_run_id
    ):
        raise InvalidCommit("a child's ticket is a delegation ticket of its call naming the child")
    if ticket.id in run.consumed_tickets or run.wait(ticket.id) or run.ticket == ticket:
        raise InvalidDisposition("a ticket is opened once")
    call = _open_call(run, event.call_id)
    run = _replace_call(run, t.delegate(call, ticket.id, event.child_run_id))
    return replace(run, waits=(*run.waits, ticket))


def _resume(run: RunView, event: CallResumed) -> RunView:
    ticket = run.wait(event.ticket_id) or run.ticket
    if ticket is None:
        if event.ticket_id in run.consumed_tickets:
            raise TicketConsumed(ticket_id=event.ticket_id)
        raise NotAwaiting(state=run.state.value)
    command = ResumeCommand(
        ticket_id=event.ticket_id,
        kind=ticket.kind,
        decision=event.decision,
        input=event.input,
        call_id=event.call_id,
        arguments=event.arguments,
    )
    check_resume(run, command)
    call = _open_call(run, event.call_id)
    woken_at = ticket.request.get("due_at") if ticket.kind is TicketKind.TIMER else None
    result = resume_result(event, ticket.kind)
    updated = t.resume_call(
        call, event.ticket_id, event.decision, result, event.arguments, woken_at=woken_at
    )
    run = _replace_call(run, updated)
    held = None if run.ticket is not None and run.ticket.id == event.ticket_id else run.ticket
    return replace(
        run,
        ticket=held,
        waits=tuple(w for w in run.waits if w.id != event.ticket_id),
        consumed_tickets=(*run.consumed_tickets, event.ticket_id),
    )


def resume_result(event: CallResumed, kind: TicketKind = TicketKind.APPROVAL) -> str:
    """The result text a deny or an input answer publishes for the model.

    A child's natural end publishes its final answer (``input["answer"]``); any other end is
    an error whose text (``reason``) names the cause and the child.
    """
    if kind is TicketKind.DELEGATION:
        if event.decision is Decision.DENY:
            return event.reason
        answer = event.input.get("answer") if isinstance(event.input, dict) else None
        return answer if isinstance(answer, str) else json.dumps(event.input, sort_keys=True)
    if event.decision is Decision.DENY:
        return "Denied by operator" + (f": {event.reason}" if event.reason else ".")
    if event.decision is Decision.INPUT:
        return json.dumps(event.input, sort_keys=True, ensure_ascii=False)
    if event.decision is Decision.RESPOND:  # the approver's supplied result, as given
        return (
            event.input
            if isinstance(event.input, str)
            else json.dumps(event.input, sort_keys=True, ensure_ascii=False)
        )
    return ""


def check_resume(run: RunView, command: ResumeCommand) -> None:
    """Refuse a ResumeCommand that does not match the committed ticket (seed: call at Awaiting).

    Raises RunEnded, TicketConsumed, NotAwaiting, TicketMismatch or KindMismatch; returns
    None when the command may be committed.
    """
    if run.state is RunState.ENDED:
        raise RunEnded(end_cause=run.end_cause and run.end_cause.value)
    if command.ticket_id in run.consumed_tickets:
        raise TicketConsumed(ticket_id=command.ticket_id)
    # A delegation ticket answers whenever its child ends, whether or not the run waits on it.
    delegated = run.wait(command.ticket_id) if command.kind is TicketKind.DELEGATION else None
    if delegated is None and (run.state is not RunState.AWAITING or run.ticket is None):
        raise NotAwaiting(state=run.state.value)
    ticket = delegated or run.ticket
    assert ticket is not None
    if command.ticket_id != ticket.id or command.call_id not in (None, ticket.call_id):
        raise TicketMismatch(open_ticket=ticket.id, given=command.ticket_id)
    if command.kind is not ticket.kind or command.decision not in DECISIONS_FOR_KIND[ticket.kind]:
        # Name what a person may send (a timer's deny is the runtime's own, on a cancel).
        allowed = OPERATOR_DECISIONS[ticket.kind] or DECISIONS_FOR_KIND[ticket.kind]
        raise KindMismatch(
            ticket_kind=ticket.kind.value,
            given_kind=str(command.kind),
            decision=command.decision.value,
            allowed=sorted(d.value for d in allowed),
        )
    if command.arguments is not None and (
        ticket.kind is not TicketKind.APPROVAL
        or command.decision is not Decision.APPROVE
        or not isinstance(command.arguments, dict)
    ):
        raise InvalidCommit(
            "edited arguments are a JSON object and ride only with an approval ticket's approve"
        )
    if command.decision is Decision.RESPOND and command.input is None:
        raise InvalidCommit("a respond answer carries the supplied result")


def check_operator_decision(
    kind: TicketKind, decision: Decision | str, request: JSON = None
) -> None:
    """Refuse a decision a person may not send on a ticket of ``kind`` (OPERATOR_DECISIONS).

    The one rule for the console, the API and the CLI. ``decision`` may be any text a form
    sent; ``request`` is the ticket's request (the refusal names its child, or its due time).
    Raises TicketNotAnswerable when the runtime answers that ticket itself (anything sent to
    a delegation ticket, a timer's deny), KindMismatch when the decision does not answer that
    kind at all.
    """
    allowed = OPERATOR_DECISIONS[kind]
    if decision in allowed:
        return
    if allowed and decision not in DECISIONS_FOR_KIND[kind]:
        raise KindMismatch(
            ticket_kind=kind.value,
            given_kind=kind.value,
            decision=str(decision),
            allowed=sorted(d.value for d in allowed),
        )
    request = request if isinstance(request, dict) else {}
    detail = {
        "ticket_kind": kind.value,
        "decision": str(decision),
        "allowed": sorted(d.value for d in allowed),
    }
    if kind is TicketKind.DELEGATION:
        child = request.get("child_run_id", "")
        raise TicketNotAnswerable(
            "A delegation ticket is answered by its child run's end, never by a person; "
            f"child run {child} is still working. To stop it, cancel the child run {child}: "
            "its end answers this ticket with an error and the parent run goes on. Cancelling "
            "the parent run cancels its children too.",
            child_run_id=child,
            **detail,
        )
    due = request.get("due_at") or "its due time"
    raise TicketNotAnswerable(
        f"A timer ticket is not answered with {decision}: it fires by itself at {due}, and a "
        "person may only fire it now (approve). To stop the wait, cancel the run.",
        due_at=request.get("due_at"),
        **detail,
    )


def check_operator_resume(run: RunView, command: ResumeCommand) -> None:
    """Refuse a ResumeCommand from a person (console, API, CLI) that does not match the
    committed ticket, or that the ticket's kind leaves to the runtime.

    Raises TicketNotAnswerable when ``command`` names an open delegation or timer ticket with a
    decision a person may not send (whatever kind it claims), then what ``check_resume``
    raises. A child's end is delivered by the runtime (runtime.commits) and is not checked
    here; a due timer fires through ``operations.resume`` with the approve a person may send.
    """
    open_ticket = run.ticket if run.ticket and run.ticket.id == command.ticket_id else None
    ticket = run.wait(command.ticket_id) or open_ticket
    if ticket is not None and ticket.kind in (TicketKind.DELEGATION, TicketKind.TIMER):
        check_operator_decision(ticket.kind, command.decision, ticket.request)
        if command.arguments is not None:
            raise TicketNotAnswerable(
                f"A {ticket.kind.value} ticket takes no edited arguments: only an approval "
                "ticket's approve may change a call's arguments.",
                ticket_kind=ticket.kind.value,
                decision=command.decision.value,
                allowed=sorted(d.value for d in OPERATOR_DECISIONS[ticket.kind]),
            )
    check_resume(run, command)


def _check_messages(run: RunView, draft: CommitDraft, activation: bool) -> None:
    roles = [m.role for m in draft.messages]
    inputs = [r for r in roles if r in ("user", "system")]
    forked = any(isinstance(e, RunForked) for e in draft.events)
    if inputs and not (activation or forked):
        raise InvalidCommit("user and system messages enter only with a new run or its fork")
    stepped = any(isinstance(e, StepCommitted) for e in draft.events)
    assistants = [m for m in draft.messages if m.role == "assistant"]
    if len(assistants) != (1 if stepped else 0):
        raise InvalidCommit("each committed inference carries exactly one assistant message")
    opened = next((e for e in draft.events if isinstance(e, BatchOpened)), None)
    if assistants:
        requested = [c["id"] for c in assistants[0].tool_calls]
        expected = [c.tool_call_id for c in opened.calls] if opened else []
        if requested != expected:
            raise InvalidCommit("the assistant's tool-use blocks must match the batch, in order")
    tools = tuple(m for m in draft.messages if m.role == "tool")
    finalized = any(isinstance(e, BatchFinalized) for e in draft.events)
    published = publication(run.batches[-1]) if finalized else ()
    if tools != published:
        raise InvalidCommit("tool results are published only by finalization, in call order")
    if len(roles) != len(inputs) + len(assistants) + len(tools):
        raise InvalidCommit(f"unknown message role in {roles}")


def publication(batch: ToolBatch) -> tuple[Message, ...]:
    """The tool-result messages a finalized batch publishes, in the model's call order."""
    return tuple(
        Message(role="tool", content=c.result or "", tool_call_id=c.tool_call_id, name=c.name)
        for c in sorted(batch.calls, key=lambda c: c.index)
    )


def _apply_disposition(  # noqa: C901 - one rule per edge
    before: RunState | None,
    run: RunView,
    disposition: Disposition,
    resumed: bool,
    delivered: bool = False,
    pausing: bool = False,
) -> RunView:
    """``resumed``: the ticket the run waited on was consumed by this commit; ``delivered``:
    a delegation ticket the run did not wait on was (DESIGN.md departure: delegation waits);
    ``pausing``: the commit pauses, resumes or moves the run, which keeps its disposition."""
    to = disposition.state
    if pausing and (to is not before or disposition.ticket != run.ticket):
        raise _refuse_run(before, to, "a pause, a resume or a move keeps the run's disposition")
    if run.pause is not None and before is RunState.RUNNING and to is RunState.AWAITING:
        raise RunIsPaused(
            f"run {run.run_id} is paused: it does not park on a ticket", ticket_id=run.pause.id
        )
    if before is None and to is not RunState.RUNNING:
        raise _refuse_run(before, to, "a run activates as Running")
    if before is RunState.AWAITING and to is RunState.RUNNING and not resumed:
        raise _refuse_run(before, to, "only a validated ResumeCommand resumes an Awaiting run")
    if before is RunState.AWAITING and to is RunState.AWAITING:
        same = run.ticket is not None and run.ticket == disposition.ticket
        if not (resumed or ((delivered or pausing) and same)):
            raise _refuse_run(before, to, "an Awaiting run waits on one ticket at a time")
    batch = run.open_batch
    if to is RunState.AWAITING:
        ticket = disposition.ticket
        assert ticket is not None
        call = batch.call(ticket.call_id) if batch else None
        if ticket.run_id != run.run_id:
            raise InvalidDisposition("the ticket belongs to another run")
        if call is None or call.phase is not CallPhase.AWAITING or call.ticket_id != ticket.id:
            raise InvalidDisposition("the ticket must be the wait of a call in the open batch")
        if ticket.id in run.consumed_tickets:
            raise InvalidDisposition("a consumed ticket is never delivered again")
        if run.ticket is not None and run.ticket != ticket:
            raise _refuse_run(before, to, "an Awaiting run waits on one ticket at a time")
        if call.detached and run.wait(ticket.id) != ticket:
            raise InvalidDisposition("a run waits on a child only with the child's own ticket")
        return replace(run, state=to, ticket=ticket)
    if to is RunState.ENDED:
        if batch is not None:
            raise _refuse_run(before, to, "an ending run seals and finalizes its open batch")
        consumed = run.consumed_tickets + tuple(sorted(open_ticket_ids(run)))
        return replace(
            run,
            state=to,
            end_cause=disposition.end_cause,
            error=disposition.error,
            ticket=None,
            waits=(),
            pause=None,
            consumed_tickets=consumed,
        )
    if batch and any(
        c.phase is CallPhase.AWAITING and not (c.approved or c.detached) for c in batch.calls
    ):
        raise _refuse_run(before, to, "a call awaits a ticket, so the run must be Awaiting")
    return replace(run, state=to)


# -- the commit ----------------------------------------------------------------------------------


def apply_commit(
    head: ThreadHead, run: RunView | None, draft: CommitDraft
) -> tuple[ThreadHead, RunView | None]:
    """Validate ``draft`` against the committed head and run; return the new head and run.

    ``run`` is the committed state of ``draft.run_id`` (None for a new run), or, for a thread
    note, of the run the reconciled call belongs to. Raises VersionConflict when the head has
    moved, and a typed RuntimeFault (IllegalTransition, InvalidCommit, InvalidDisposition,
    RunAlreadyActive, NotActiveRun, RunEnded, ticket errors) for anything else; nothing is
    returned half-applied.
    """
    if draft.thread_id != head.thread_id:
        raise InvalidCommit("the commit names another thread")
    if draft.expected_version != head.version:
        raise VersionConflict(expected=draft.expected_version, actual=head.version)
    version = head.version + 1
    if draft.run_id is None:
        run = _apply_note(head, run, draft)
        return replace(head, version=version), run
    activation = bool(draft.events) and isinstance(draft.events[0], RunActivated)
    if activation:
        event = draft.events[0]
        assert isinstance(event, RunActivated)
        if run is not None or event.run_id != draft.run_id:
            raise InvalidCommit("a run activates once, with its own id")
        if head.active_run_id is not None:
            raise RunAlreadyActive(active_run_id=head.active_run_id)
        before: RunState | None = None
        run = RunView(
            run_id=draft.run_id,
            thread_id=head.thread_id,
            agent=event.agent,
            agent_version=event.agent_version,
            parent_run_id=event.parent_run_id,
            parent_call_id=event.parent_call_id,
            depth=event.depth,
        )
        events = draft.events[1:]
    else:
        if run is None:
            raise NotFound(f"run {draft.run_id} has no committed activation")
        if run.run_id != draft.run_id or run.thread_id != head.thread_id:
            raise InvalidCommit("the run does not belong to this thread")
        if run.state is RunState.ENDED:  # Ended is absorbing: name the refused edge too
            raise RunEnded(
                end_cause=run.end_cause and run.end_cause.value,
                machine="run",
                from_state=RunState.ENDED.value,
                to_state=draft.disposition.state.value if draft.disposition else "(none)",
                why="Ended is absorbing; an ended run is never reopened",
            )
        if head.active_run_id != run.run_id:
            raise NotActiveRun(active_run_id=head.active_run_id)
        before = run.state
        events = draft.events
    if draft.disposition is None:
        raise InvalidDisposition("a run's commit carries its RunDisposition")
    draft.disposition.validate()
    held = run.ticket
    delivered = False
    pausing = any(isinstance(e, OPERATOR_EVENTS) for e in events)
    if pausing and (len(events) != 1 or draft.messages):
        raise InvalidCommit("a pause, a resume or a move is a commit of its own")
    for event in events:
        if before is RunState.AWAITING and not isinstance(event, AWAITING_EVENTS):
            raise _refuse_run(
                before, draft.disposition.state, "an Awaiting run changes only by resume or end"
            )
        run = _apply_event(run, event)
        delivered = delivered or isinstance(event, CallResumed)
    resumed = held is not None and held.id in run.consumed_tickets
    _check_messages(run, draft, activation)
    run = _apply_disposition(before, run, draft.disposition, resumed, delivered, pausing)
    run = replace(run, version=version)
    active = None if run.state is RunState.ENDED else run.run_id
    return replace(head, version=version, active_run_id=active), run


def _apply_note(head: ThreadHead, run: RunView | None, draft: CommitDraft) -> RunView | None:
    if draft.disposition is not None or draft.messages or not draft.events:
        raise InvalidCommit("a thread note carries reconciliation facts only")
    for event in draft.events:
        if not isinstance(event, ReconciliationRecorded):
            raise InvalidCommit("a thread note carries reconciliation facts only")
        if run is None or run.run_id != event.run_id or run.thread_id != head.thread_id:
            raise InvalidCommit("the reconciled call's run is not on this thread")
        call = run.find_call(event.call_id)
        if call is None or call.phase is not CallPhase.INDETERMINATE:
            raise InvalidCommit("only an Indeterminate call is reconciled")
        if event.outcome not in RECONCILIATION_OUTCOMES:
            raise InvalidCommit(f"outcome must be one of {RECONCILIATION_OUTCOMES}")
    return run


# -- builders the loop and the operator commands share ------------------------------------------


def ending(run: RunView, reason: str) -> tuple[tuple[Event, ...], tuple[Message, ...]]:
    """The events and messages that seal an ending run's open batch (DESIGN.md decision).

    Every non-terminal call becomes Indeterminate with ``reason`` and the batch is finalized,
    so a follow-up run never sees a tool-use block without a result.
    """
    batch = run.open_batch
    if batch is None:
        return (), ()
    events: list[Event] = [
        CallIndeterminate(call_id=c.call_id, reason=reason)
        for c in batch.calls
        if not c.phase.terminal
    ]
    sealed = batch
    for event in events:
        assert isinstance(event, CallIndeterminate)
        call = sealed.call(event.call_id)
        assert call is not None
        new = t.seal_indeterminate(call, reason)
        sealed = replace(
            sealed, calls=tuple(new if c.call_id == new.call_id else c for c in sealed.calls)
        )
    events.append(BatchFinalized(step=batch.step))
    return tuple(events), publication(sealed)


def end_cause_reason(cause: EndCause) -> str:
    """Why open calls were sealed, in words for the model and the operator."""
    return {
        EndCause.CANCELLED: "the run was cancelled before this call finished",
        EndCause.STOPPED: "the run was stopped before this call finished",
        EndCause.FAILED: "the run failed before this call finished",
        EndCause.STEP_LIMIT: "the run reached its step limit",
        EndCause.INDETERMINATE: "the run ended with an indeterminate outcome",
        EndCause.NATURAL: "the run ended",
    }[cause]


# -- the fold ------------------------------------------------------------------------------------


@dataclass(slots=True)
class FoldedThread:
    """The state a thread's whole log folds to: what the projections must equal."""

    head: ThreadHead
    runs: dict[str, RunView] = field(default_factory=dict)
    messages: list[tuple[int, str | None, Message]] = field(default_factory=list)
    reconciliations: list[tuple[int, Reconciliation]] = field(default_factory=list)


def fold(thread_id: str, commits: Iterable[tuple[int, CommitDraft]]) -> FoldedThread:
    """Fold ``(sequence, commit)`` pairs, oldest first, into the thread's state.

    Raises the first refusal ``apply_commit`` gives, with ``sequence`` in its detail.
    """
    state = FoldedThread(head=ThreadHead(thread_id=thread_id))
    for seq, draft in commits:
        if seq != state.head.version + 1:
            raise InvalidCommit(
                f"sequence {seq} does not follow {state.head.version}", sequence=seq
            )
        target = draft.run_id or next(
            (e.run_id for e in draft.events if isinstance(e, ReconciliationRecorded)), None
        )
        try:
            state.head, run = apply_commit(state.head, state.runs.get(target or ""), draft)
        except Exception as exc:  # annotate with the sequence, keep the type
            if hasattr(exc, "detail"):
                exc.detail["sequence"] = seq
            raise
        if run is not None and draft.run_id is not None:
            state.runs[run.run_id] = run
        state.messages.extend((seq, draft.run_id, m) for m in draft.messages)
        state.reconciliations.extend(
            (
                seq,
                Reconciliation(
                    call_id=e.call_id,
                    run_id=e.run_id,
                    outcome=e.outcome,
                    evidence=e.evidence,
                    actor=draft.actor,
                ),
            )
            for e in draft.events
            if isinstance(e, ReconciliationRecorded)
        )
    return state
