"""Terminal-only child delegation, driven in this process by the real Worker.

A delegate call starts a child Run on its own thread and learns only its terminus: a natural
end completes the call with the child's final answer, any other end completes it with an error
naming the cause and the child. Delegate calls do not hold later ordinary calls back; the
batch is published in call order once every call is terminal. Limits refuse with a typed
error; a parent's end cancels its live children; a child's late end never reopens a parent.
"""

from __future__ import annotations

import pytest

from runtime import fsck
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import RunEnded
from runtime.models import MessageRecord, Run, ThreadCommit, Ticket
from runtime.operations import cancel, resume
from tests.runtime.support import (
    applied,
    assert_log_sound,
    calls,
    commit_count,
    run_row,
    text_step,
    tool_step,
)

pytestmark = pytest.mark.django_db(transaction=True)


def child_script(*steps: dict) -> dict:
    return {"steps": list(steps)}


def delegate_call(answer: str = "child answer", *steps: dict) -> tuple[str, dict]:
    script = child_script(*(steps or (text_step(answer),)))
    return ("delegate", {"input": f"find {answer}", "script": script})


def children(parent_id: str) -> list[Run]:
    return list(Run.objects.filter(parent_run_id=parent_id).order_by("created_at"))


def deliveries(parent_id: str) -> list[ThreadCommit]:
    """The parent's commits written by its children's ends."""
    return list(
        ThreadCommit.objects.filter(run_id=parent_id, actor__startswith="child:").order_by("seq")
    )


def test_children_answer_in_call_order(start, work_inline):
    parent_id = start(
        tool_step(
            delegate_call("alpha"),
            ("ledger_once", {"key": "k"}),
            delegate_call("beta"),
        ),
        text_step("all done"),
    )
    work_inline()
    parent = run_row(parent_id)
    assert (parent.state, parent.end_cause, parent.step) == ("ended", "natural", 2)
    kids = children(parent_id)
    assert [(k.state, k.end_cause, k.depth) for k in kids] == [("ended", "natural", 1)] * 2
    delegate_a, ordinary, delegate_b = calls(parent_id)
    assert [k.parent_call_id for k in kids] == [delegate_a.id, delegate_b.id]
    assert (delegate_a.result, delegate_b.result) == ("alpha", "beta")
    assert (delegate_a.phase, delegate_a.attempt, delegate_a.is_error) == ("completed", 1, False)
    assert applied(ordinary) == 1
    published = MessageRecord.objects.filter(run_id=parent_id, role="tool").order_by("seq", "idx")
    assert [m.tool_call_id for m in published] == ["call_1_0", "call_1_1", "call_1_2"]
    assert [m.content for m in published][::2] == ["alpha", "beta"]
    # Each child's terminus was delivered once, by its own Ended transaction.
    assert [c.actor for c in deliveries(parent_id)] == [f"child:{k.id}" for k in kids]
    tickets = Ticket.objects.filter(run_id=parent_id).order_by("opened_seq")
    assert [(t.kind, t.state, t.decision) for t in tickets] == [
        ("delegation", "consumed", "input")
    ] * 2
    assert [t.request["child_run_id"] for t in tickets] == [k.id for k in kids]
    for run_id in (parent_id, *(k.id for k in kids)):
        assert_log_sound(run_id)
    assert fsck.check() == []


def test_child_failure_is_an_error_result_naming_cause_and_child(start, work_inline):
    parent_id = start(
        tool_step(delegate_call("x", {"error": "fatal"})),
        text_step(),
    )
    work_inline()
    (kid,) = children(parent_id)
    assert (kid.state, kid.end_cause) == ("ended", "failed")
    (call,) = calls(parent_id)
    assert call.is_error and call.phase == "completed"
    assert kid.id in call.result and "failed" in call.result
    assert run_row(parent_id).end_cause == "natural"
    assert_log_sound(parent_id)
    assert_log_sound(kid.id)


def test_parent_waits_without_a_worker_and_cancel_ends_all_three(start, work_inline):
    """Two children wait for approval: the parent parks on the first child's ticket (no
    worker holds it); cancelling it ends all three, each with its own Ended commit."""
    gated = tool_step(("ledger_approval", {"key": "g"}))
    parent_id = start(
        tool_step(delegate_call("a", gated, text_step()), delegate_call("b", gated, text_step())),
        text_step(),
    )
    work_inline()
    kids = children(parent_id)
    assert [k.state for k in kids] == ["awaiting", "awaiting"]
    parent = run_row(parent_id)
    assert parent.state == "awaiting"
    open_tickets = Ticket.objects.filter(run_id=parent_id, state="open")
    assert sorted(t.kind for t in open_tickets) == ["delegation", "delegation"]

    cancel(parent_id, actor="alice", reason="stop it")
    assert (run_row(parent_id).state, run_row(parent_id).end_cause) == ("ended", "cancelled")
    for kid in kids:
        row = run_row(kid.id)
        assert (row.state, row.end_cause) == ("ended", "cancelled")
        (ended,) = ThreadCommit.objects.filter(run_id=kid.id, disposition__state="ended")
        assert ended.actor == f"parent:{parent_id}"
        assert parent_id in row.error["reason"] and "cancelled" in row.error["reason"]
    assert deliveries(parent_id) == []  # the children's late ends reopen nothing
    assert {c.phase for c in calls(parent_id)} == {"indeterminate"}
    # A child's ticket can no longer be answered either.
    ticket = Ticket.objects.get(run_id=kids[0].id)
    seen = commit_count(run_row(kids[0].id).thread_id)
    with pytest.raises(RunEnded):
        resume(
            kids[0].id,
            ResumeCommand(ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
        )
    assert commit_count(run_row(kids[0].id).thread_id) == seen
    for run_id in (parent_id, *(k.id for k in kids)):
        assert_log_sound(run_id)


def test_limits_refuse_with_a_typed_error(start, work_inline, settings):
    settings.RUNTIME_DELEGATION_MAX_CHILDREN = 1
    parent_id = start(tool_step(delegate_call("a"), delegate_call("b")), text_step())
    work_inline()
    first, second = calls(parent_id)
    assert (first.result, first.is_error) == ("a", False)
    assert second.is_error and "delegation_refused" in second.result
    assert len(children(parent_id)) == 1

    settings.RUNTIME_DELEGATION_MAX_DEPTH = 0
    parent_id = start(tool_step(delegate_call("c")), text_step())
    work_inline()
    (call,) = calls(parent_id)
    assert call.is_error and "depth 1" in call.result and call.attempt == 0
    assert children(parent_id) == []
    assert_log_sound(parent_id)


def test_grandchild_nests_and_answers_up(start, work_inline):
    grandchild = delegate_call("deep")
    parent_id = start(
        tool_step(delegate_call("mid", tool_step(grandchild), text_step("mid got it"))),
        text_step(),
    )
    work_inline()
    (kid,) = children(parent_id)
    (grandkid,) = children(kid.id)
    assert (kid.depth, grandkid.depth) == (1, 2)
    assert calls(kid.id)[0].result == "deep"
    assert calls(parent_id)[0].result == "mid got it"
    assert fsck.check() == []
