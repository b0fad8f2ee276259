"""The delegation and timer rules of the pure domain: no database.

A delegate call parks on its child with a delegation ticket that does not hold later calls
back; the run waits (Awaiting) on a child's ticket only when nothing else can proceed; a
child's terminus answers its ticket whether the run is Running or Awaiting on something else;
an ending run consumes every open ticket. Limits are typed refusals.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.domain import recovery as rec
from runtime.domain.commit import CommitDraft, stage
from runtime.domain.delegation import check_limits, settle
from runtime.domain.events import CallResumed, ChildStarted
from runtime.domain.model import (
    CallPhase,
    Decision,
    Disposition,
    EndCause,
    Permission,
    ResumeTicket,
    RunState,
    RunView,
    TicketKind,
)
from runtime.errors import (
    DelegationRefused,
    IllegalTransition,
    InvalidCommit,
    KindMismatch,
    NotAwaiting,
    TicketConsumed,
)
from tests.domain import drafts
from tests.domain.drafts import Ids, Log


@pytest.fixture
def ids() -> Ids:
    return Ids("t")


def _batch(ids: Ids, *permissions: Permission) -> tuple[Log, str]:
    log = Log("th")
    log.apply(drafts.activate(log.head, "run"))
    calls = tuple(
        drafts.make_call(i, ids=ids, name="delegate" if i == 0 else "echo", permission=p)
        for i, p in enumerate(permissions)
    )
    log.apply(drafts.infer_tools(log.head, log.run("run"), calls))
    return log, "run"


def _child_started(log: Log, run: RunView, index: int, ids: Ids) -> tuple[CommitDraft, str]:
    batch = run.open_batch
    assert batch is not None
    call = batch.calls[index]
    child = ids("child")
    ticket = ResumeTicket(
        id=ids("tk"),
        run_id=run.run_id,
        call_id=call.call_id,
        kind=TicketKind.DELEGATION,
        request={"child_run_id": child},
    )
    event = ChildStarted(
        call_id=call.call_id, child_run_id=child, child_thread_id="other", ticket=ticket
    )
    draft = CommitDraft(
        thread_id=log.head.thread_id,
        run_id=run.run_id,
        expected_version=log.head.version,
        disposition=settle(stage(run, (event,))),
        events=(event,),
    )
    return draft, ticket.id


def _deliver(log: Log, run: RunView, ticket_id: str, decision=Decision.INPUT) -> CommitDraft:
    ticket = run.wait(ticket_id)
    assert ticket is not None
    event = CallResumed(
        call_id=ticket.call_id,
        ticket_id=ticket_id,
        decision=decision,
        input={"answer": "found it"} if decision is Decision.INPUT else None,
        reason="The child run x ended failed.",
    )
    return CommitDraft(
        thread_id=log.head.thread_id,
        run_id=run.run_id,
        expected_version=log.head.version,
        disposition=settle(stage(run, (event,))),
        events=(event,),
        actor="child:x",
    )


def test_a_child_starts_only_from_executing(ids):
    log, run_id = _batch(ids, Permission.ALLOW)
    with pytest.raises(IllegalTransition, match="requested -> awaiting"):
        _child_started(log, log.run(run_id), 0, ids)  # planning its disposition applies it


def test_delegated_call_does_not_block_later_calls_and_answers_while_running(ids):
    log, run_id = _batch(ids, Permission.ALLOW, Permission.ALLOW)
    delegate, ordinary = log.run(run_id).open_batch.calls
    log.apply(drafts.execute(log.head, log.run(run_id), delegate.call_id))
    draft, ticket_id = _child_started(log, log.run(run_id), 0, ids)
    assert draft.disposition == Disposition.running()  # the next call can proceed
    run = log.apply(draft)
    assert run.find_call(delegate.call_id).detached
    assert rec.next_action(run, 10) == rec.Gate(run.find_call(ordinary.call_id))
    run = log.apply(drafts.execute(log.head, run, ordinary.call_id))
    # The child ends while the ordinary call runs: its ticket is answered, the run stays put.
    run = log.apply(_deliver(log, run, ticket_id))
    assert (run.state, run.find_call(delegate.call_id).result) == (RunState.RUNNING, "found it")
    assert run.waits == () and ticket_id in run.consumed_tickets
    run = log.apply(drafts.complete(log.head, run, ordinary.call_id))
    assert isinstance(rec.next_action(run, 10), rec.Finalize)


def test_run_parks_on_the_child_when_nothing_else_can_proceed(ids):
    log, run_id = _batch(ids, Permission.ALLOW, Permission.ALLOW)
    delegate, ordinary = log.run(run_id).open_batch.calls
    log.apply(drafts.execute(log.head, log.run(run_id), delegate.call_id))
    run = log.apply(_child_started(log, log.run(run_id), 0, ids)[0])
    run = log.apply(drafts.execute(log.head, run, ordinary.call_id))
    run = log.apply(drafts.complete(log.head, run, ordinary.call_id))
    action = rec.next_action(run, 10)
    assert action == rec.Park(run.waits[0])
    parked = log.apply(
        CommitDraft(
            thread_id="th",
            run_id=run_id,
            expected_version=log.head.version,
            disposition=Disposition.awaiting(action.ticket),
        )
    )
    assert (parked.state, parked.ticket) == (RunState.AWAITING, action.ticket)
    # The child's end resumes the run from the ticket it waits on.
    done = log.apply(_deliver(log, parked, action.ticket.id, Decision.DENY))
    call = done.find_call(delegate.call_id)
    assert (done.state, call.phase, call.is_error) == (RunState.RUNNING, CallPhase.COMPLETED, True)
    assert call.result == "The child run x ended failed."


def test_delivery_keeps_a_run_awaiting_its_approval(ids):
    log, run_id = _batch(ids, Permission.ALLOW, Permission.ASK)
    delegate, gated = log.run(run_id).open_batch.calls
    log.apply(drafts.execute(log.head, log.run(run_id), delegate.call_id))
    run, child_ticket = log.apply(_child_started(log, log.run(run_id), 0, ids)[0]), None
    child_ticket = run.waits[0].id
    run = log.apply(drafts.wait(log.head, run, gated.call_id, ids("ap")))
    approval = run.ticket
    draft = _deliver(log, run, child_ticket)
    assert draft.disposition == Disposition.awaiting(approval)
    run = log.apply(draft)
    assert (run.state, run.ticket, run.waits) == (RunState.AWAITING, approval, ())
    # Awaiting -> Awaiting on another ticket without any delivery stays refused.
    with pytest.raises(IllegalTransition):
        log.apply(replace(draft, expected_version=log.head.version, events=()))


def test_resume_refusals(ids):
    log, run_id = _batch(ids, Permission.ALLOW, Permission.ALLOW)
    delegate, _ = log.run(run_id).open_batch.calls
    log.apply(drafts.execute(log.head, log.run(run_id), delegate.call_id))
    run = log.apply(_child_started(log, log.run(run_id), 0, ids)[0])
    ticket_id = run.waits[0].id
    wrong_kind = replace(
        _deliver(log, run, ticket_id),
        events=(
            CallResumed(call_id=delegate.call_id, ticket_id=ticket_id, decision=Decision.APPROVE),
        ),
    )
    with pytest.raises(KindMismatch):
        log.apply(wrong_kind)
    first = _deliver(log, run, ticket_id)
    log.apply(first)
    with pytest.raises(TicketConsumed):  # a second delivery of the same terminus
        log.apply(replace(first, expected_version=log.head.version))
    # An approval can never be given to a Running run, delegation or not.
    approval = CallResumed(call_id=delegate.call_id, ticket_id="other", decision=Decision.APPROVE)
    with pytest.raises(NotAwaiting):
        log.apply(replace(first, expected_version=log.head.version, events=(approval,)))


def test_ending_consumes_every_open_ticket(ids):
    log, run_id = _batch(ids, Permission.ALLOW, Permission.ASK)
    delegate, gated = log.run(run_id).open_batch.calls
    log.apply(drafts.execute(log.head, log.run(run_id), delegate.call_id))
    run = log.apply(_child_started(log, log.run(run_id), 0, ids)[0])
    run = log.apply(drafts.wait(log.head, run, gated.call_id, ids("ap")))
    opened = {run.ticket.id, run.waits[0].id}
    run = log.apply(drafts.end(log.head, run, EndCause.CANCELLED))
    assert run.waits == () and run.ticket is None
    assert opened <= set(run.consumed_tickets)
    assert {c.phase for c in run.batches[-1].calls} == {CallPhase.INDETERMINATE}


def test_a_child_ticket_names_its_child(ids):
    log, run_id = _batch(ids, Permission.ALLOW)
    log.apply(
        drafts.execute(log.head, log.run(run_id), log.run(run_id).open_batch.calls[0].call_id)
    )
    draft, _ = _child_started(log, log.run(run_id), 0, ids)
    (event,) = draft.events
    bad = replace(event, ticket=replace(event.ticket, request={"child_run_id": "someone else"}))
    with pytest.raises(InvalidCommit):
        log.apply(replace(draft, events=(bad,)))


@pytest.mark.parametrize(
    ("depth", "position", "refused"),
    [(0, 0, None), (2, 0, "depth"), (0, 1, None), (0, 2, "children")],
)
def test_limits(ids, depth, position, refused):
    log, run_id = _batch(ids, *[Permission.ALLOW] * 3)
    run = replace(log.run(run_id), depth=depth)
    calls = run.open_batch.calls
    delegates = tuple(c.name for c in calls)  # every call is a delegate call here
    if refused is None:
        check_limits(run, calls[position], delegates, max_depth=2, max_children=2)
        return
    with pytest.raises(DelegationRefused) as caught:
        check_limits(run, calls[position], delegates, max_depth=2, max_children=2)
    assert caught.value.detail["limit"] == refused
