"""A commit and what it owes other Runs, in one transaction: the write path of every layer
above the coordinator (the loop, operations, retention).

The coordinator validates and writes one ThreadCommit and names, as values, what it owes
(``domain.delegation.follow_ups``); this module applies them in the same transaction
(DESIGN.md, "Lower layers never call up"; issue 10's guarantees):

- ``DeliverToParent``: a child's end is delivered to its parent as the matching ResumeCommand
  (actor ``child:<run id>``), exactly once, whatever crashes. A child that ends after its
  parent (or after its call was settled otherwise) changes nothing: an ended parent is never
  reopened.
- ``CancelChild``: a parent's end cancels its live children, each with its own Ended commit
  (actor ``parent:<run id>``), the way an operator's cancel would.

A commit that owes nothing is written on its own: one statement on PostgreSQL, no transaction
of ours around it.
"""

from __future__ import annotations

import logging

from django.db import OperationalError, transaction

from runtime import coordinator, db
from runtime.coordinator import Committed, Lease, read_head, read_run
from runtime.crash import crash_point
from runtime.domain.commit import CommitDraft, ending, stage
from runtime.domain.delegation import (
    CancelChild,
    DeliverToParent,
    FollowUp,
    settle,
    terminus_text,
)
from runtime.domain.events import CallResumed
from runtime.domain.model import (
    CallPhase,
    Decision,
    Disposition,
    EndCause,
    RunState,
    RunView,
    ThreadHead,
)
from runtime.errors import VersionConflict
from runtime.models import MessageRecord

log = logging.getLogger("runtime.delegation")


def commit(
    draft: CommitDraft,
    *,
    lease: Lease | None = None,
    head: ThreadHead | None = None,
    before: RunView | None = None,
    new_thread: bool = False,
) -> Committed:
    """Validate and write ``draft`` with every follow-up it owes; return what was committed.

    Takes and raises what ``coordinator.prepare`` and ``coordinator.write`` do; a deadlock
    between the threads a commit and its follow-ups lock is a VersionConflict (nothing of
    either was written).
    """
    plan = coordinator.prepare(draft, lease=lease, head=head, before=before, new_thread=new_thread)
    if not plan.follow_ups:
        return coordinator.write(plan)
    outermost = not db.connection.in_atomic_block
    try:
        with db.atomic():
            done = coordinator.write(plan)
            for follow_up in plan.follow_ups:
                _apply(follow_up)
    except OperationalError as exc:
        if outermost and coordinator.deadlocked(exc):
            raise VersionConflict(expected=draft.expected_version, reason=str(exc)) from exc
        raise
    return done


def _apply(follow_up: FollowUp) -> None:
    match follow_up:
        case DeliverToParent(child=child):
            _deliver(child)
        case CancelChild(child_run_id=child_id, parent_run_id=parent_id, cause=cause):
            _cancel_child(child_id, parent_id, cause)


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
    coordinator.commit(
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
    transaction.on_commit(lambda: crash_point("delivery_committed"), using=db.alias())


def _cancel_child(child_run_id: str, parent_run_id: str, cause: str) -> None:
    """End a live child Cancelled, as an operator's cancel would (its own children too)."""
    child = read_run(child_run_id)
    if child is None:
        return
    head = read_head(child.thread_id, lock=True)
    child = read_run(child_run_id)  # again, under the thread's lock
    if child is None or child.state is RunState.ENDED:
        return
    reason = f"the parent run {parent_run_id} ended ({cause})"
    events, messages = ending(child, reason)
    commit(
        CommitDraft(
            thread_id=child.thread_id,
            run_id=child.run_id,
            expected_version=head.version,
            disposition=Disposition.ended(EndCause.CANCELLED, {"reason": reason}),
            messages=messages,
            events=events,
            actor=f"parent:{parent_run_id}",
        ),
        head=head,
        before=child,
    )
