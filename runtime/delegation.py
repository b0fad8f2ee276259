"""Terminal-only child delegation: a delegate call starts a child Run and learns only its end.

Guarantees (DESIGN.md "One Step"; issue 10):

- A child is started by one database transaction that commits the child's activation on its
  own thread and the parent's ChildStarted (the call Awaiting with a ``delegation`` ticket
  naming the child): a crash leaves both or neither. The child's id is derived from the call's
  operation id, so recovery finds it by that id and never starts a second one.
- A child's end is delivered to its parent as the matching ResumeCommand (actor
  ``child:<run id>``) in the same transaction as the child's Ended commit: exactly once,
  whatever crashes. A child that ends after its parent (or after its call was settled
  otherwise) changes nothing: an ended parent is never reopened.
- A parent's end cancels its live children in the same transaction, each with its own Ended
  commit (actor ``parent:<run id>``), the way an operator's cancel would.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import Any

from django.db import transaction

from runtime import conf
from runtime.coordinator import commit, read_head, read_run
from runtime.crash import crash_point
from runtime.domain.commit import CommitDraft, stage
from runtime.domain.delegation import ChildLink, check_limits, settle, terminus_text
from runtime.domain.events import CallResumed, ChildStarted, Event
from runtime.domain.model import (
    CallPhase,
    Decision,
    Disposition,
    EndCause,
    ResumeTicket,
    RunView,
    TicketKind,
    ToolCall,
)
from runtime.errors import DelegationRefused, RuntimeFault
from runtime.models import MessageRecord
from runtime.tools import Tool

log = logging.getLogger("runtime.delegation")

CHILD_NAMESPACE = uuid.UUID("6f1c8f52-5d2e-4f3e-9a57-0d3c6a1f6b11")

CommitParent = Callable[[Disposition, tuple[Event, ...]], RunView]


def child_run_id(operation_id: str) -> str:
    """The id of the child Run a delegate call starts: a function of its operation id."""
    return uuid.uuid5(CHILD_NAMESPACE, operation_id).hex


def refusal(run: RunView, call: ToolCall, delegates: tuple[str, ...]) -> str | None:
    """The error result for a delegate call the limits refuse, or None when it may start."""
    try:
        check_limits(
            run, call, delegates, conf.delegation_max_depth(), conf.delegation_max_children()
        )
    except DelegationRefused as exc:
        return f"{exc.message} ({exc.code})"
    return None


def start_child(
    run: RunView,
    call: ToolCall,
    tool: Tool,
    arguments: dict[str, Any],
    commit_parent: CommitParent,
) -> str | None:
    """Start the child of an Executing delegate call and park the call on it, atomically.

    ``commit_parent(disposition, events)`` commits on the parent's thread (the driver's
    lease-fenced commit). Returns None, or the error text when the child cannot start (an
    unknown agent, a refused script, bad input): the caller completes the call with it.
    Raises what ``commit_parent`` raises (VersionConflict, LeaseLost), with nothing written.
    """
    from runtime.operations import start_run  # operations imports the coordinator as we do

    assert tool.delegate is not None
    child_id = child_run_id(call.operation_id)
    link = ChildLink(
        run_id=child_id, parent_run_id=run.run_id, parent_call_id=call.call_id, depth=run.depth + 1
    )
    with transaction.atomic():
        existing = read_run(child_id)  # recovery finds the child by the call's operation id
        if existing is None:
            metadata = tool.delegate.metadata(arguments) if tool.delegate.metadata else {}
            try:
                with transaction.atomic():
                    start_run(
                        agent=tool.delegate.agent,
                        input=arguments["input"],
                        metadata=metadata,
                        actor=f"run:{run.run_id}",
                        child=link,
                    )
            except RuntimeFault as exc:
                return f"The child run could not start: {exc.message} ({exc.code})."
        child = read_run(child_id)
        assert child is not None
        ticket = ResumeTicket(
            id=uuid.uuid4().hex,
            run_id=run.run_id,
            call_id=call.call_id,
            kind=TicketKind.DELEGATION,
            request={"child_run_id": child_id, "agent": child.agent, "input": arguments["input"]},
        )
        event = ChildStarted(
            call_id=call.call_id,
            child_run_id=child_id,
            child_thread_id=child.thread_id,
            ticket=ticket,
        )
        commit_parent(settle(stage(run, (event,))), (event,))
    crash_point("child_started")
    return None


def on_run_ended(before: RunView | None, run: RunView, draft: CommitDraft) -> None:
    """Called by the coordinator inside the transaction of ``run``'s Ended commit."""
    if run.parent_run_id is not None:
        _deliver(run)
    if before is not None:
        cause = run.end_cause.value if run.end_cause else "ended"
        for batch in before.batches:
            for call in batch.calls:
                if call.detached and call.child_run_id:
                    _cancel_child(call.child_run_id, run.run_id, cause)


def _final_answer(run_id: str) -> str:
    row = (
        MessageRecord.objects.filter(run_id=run_id, role="assistant")
        .order_by("-seq", "-idx")
        .values_list("content", flat=True)
        .first()
    )
    return row or ""


def _deliver(child: RunView) -> None:
    """Deliver the child's terminus to its parent's call, once (the ticket is consumed)."""
    assert child.parent_run_id is not None and child.end_cause is not None
    parent = read_run(child.parent_run_id)
    if parent is None:
        return
    head = read_head(parent.thread_id, lock=True)
    parent = read_run(child.parent_run_id)  # again, under the thread's lock
    assert parent is not None
    call = parent.find_call(child.parent_call_id or "")
    ticket = parent.wait(call.ticket_id or "") if call else None
    if call is None or ticket is None or call.phase is not CallPhase.AWAITING:
        log.info("run %s ended after its parent's call was settled; nothing to deliver", child)
        return  # a late end never reopens a parent
    crash_point("child_ended_before_delivery")
    if child.end_cause is EndCause.NATURAL:
        answer = _final_answer(child.run_id)
        event = CallResumed(
            call_id=call.call_id,
            ticket_id=ticket.id,
            decision=Decision.INPUT,
            input={"answer": answer, "child_run_id": child.run_id, "end_cause": "natural"},
        )
    else:
        text = terminus_text(child.run_id, child.agent, child.end_cause, child.error)
        event = CallResumed(
            call_id=call.call_id, ticket_id=ticket.id, decision=Decision.DENY, reason=text
        )
    commit(
        CommitDraft(
            thread_id=parent.thread_id,
            run_id=parent.run_id,
            expected_version=head.version,
            disposition=settle(stage(parent, (event,))),
            events=(event,),
            actor=f"child:{child.run_id}",
        ),
        head=head,
        before=parent,
    )
    transaction.on_commit(lambda: crash_point("delivery_committed"))


def _cancel_child(child_run_id: str, parent_run_id: str, cause: str) -> None:
    from runtime.operations import end_run

    end_run(
        child_run_id,
        EndCause.CANCELLED,
        actor=f"parent:{parent_run_id}",
        reason=f"the parent run {parent_run_id} ended ({cause})",
    )
