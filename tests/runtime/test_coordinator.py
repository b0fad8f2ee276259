"""The commit coordinator: refusals write nothing, rollbacks leave nothing, announcements
follow the commit, and a stale writer gets VersionConflict (sequential cases; the real race
is in test_concurrency.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import models, transaction

from runtime import fsck
from runtime.coordinator import Lease, commit, read_head, read_run
from runtime.domain.commit import CommitDraft, publication
from runtime.domain.events import BatchFinalized, CallCompleted
from runtime.domain.model import (
    Decision,
    Disposition,
    EndCause,
    Message,
    Permission,
    ResumeTicket,
    RunState,
    TicketKind,
)
from runtime.errors import (
    IllegalTransition,
    InvalidCommit,
    InvalidDisposition,
    LeaseLost,
    NotFound,
    RunAlreadyActive,
    RunEnded,
    VersionConflict,
)
from runtime.models import (
    MessageRecord,
    ReconciliationRecord,
    Run,
    Thread,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
)
from runtime.signals import CommitNotice
from tests.domain import drafts


def state_of(thread_id: str) -> dict:
    """Everything a commit on the thread may write, to compare before and after."""
    return {
        "thread": Thread.objects.filter(id=thread_id).values("version", "active_run_id").first(),
        "commits": list(ThreadCommit.objects.filter(thread_id=thread_id).values("seq", "run_id")),
        "runs": list(Run.objects.filter(thread_id=thread_id).order_by("id").values()),
        "calls": list(ToolCallRecord.objects.filter(run__thread_id=thread_id).values()),
        "tickets": list(Ticket.objects.filter(run__thread_id=thread_id).values()),
        "messages": list(MessageRecord.objects.filter(thread_id=thread_id).values()),
        "reconciliations": list(ReconciliationRecord.objects.filter(thread_id=thread_id).values()),
    }


@pytest.fixture
def awaiting_run(make_run, make_calls, drive):
    """Return ``make() -> RunView``: a run Awaiting approval of the first of two calls."""

    def make():
        run = make_run()
        drive(drafts.infer_tools, run.run_id, make_calls(2, permission=Permission.ASK))
        call = read_run(run.run_id).batches[-1].calls[0]
        return drive(drafts.wait, run.run_id, call.call_id, "tk" + run.run_id[:16]).run

    return make


# -- a commit that is accepted --------------------------------------------------------------


@pytest.mark.django_db
def test_an_accepted_commit_writes_the_row_and_the_projections(
    make_run, drive, django_capture_on_commit_callbacks, announcements
):
    run = make_run(text="hi", metadata={"k": 1}, actor="alice")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        done = drive(drafts.infer_text, run.run_id, text="hello back")
    assert done.seq == 2 and done.head.version == 2 and done.head.active_run_id == run.run_id
    row = ThreadCommit.objects.get(thread_id=run.thread_id, seq=2)
    assert row.run_id == run.run_id and row.events == [{"type": "StepCommitted", "step": 1}]
    projection = Run.objects.get(id=run.run_id)
    assert (projection.state, projection.step, projection.version) == ("running", 1, 2)
    assert (projection.metadata, projection.created_by) == ({"k": 1}, "alice")
    assert read_run(run.run_id) == done.run
    assert [m.content for m in MessageRecord.objects.filter(thread_id=run.thread_id)] == [
        "hi",
        "hello back",
    ]
    assert len(callbacks) == 1
    assert announcements == [
        CommitNotice(
            thread_id=run.thread_id, run_id=run.run_id, seq=2, state="running", runnable=False
        )
    ]
    assert fsck.check_thread(run.thread_id) == []


@pytest.mark.django_db
def test_ticket_rows_follow_the_run(awaiting_run, drive):
    run = awaiting_run()
    ticket = Ticket.objects.get(run_id=run.run_id)
    assert (ticket.state, ticket.kind, ticket.opened_seq) == ("open", "approval", run.version)
    done = drive(drafts.resume, run.run_id, Decision.APPROVE)
    ticket.refresh_from_db()
    assert (ticket.state, ticket.decision, ticket.closed_seq) == ("consumed", "approve", done.seq)
    assert ticket.closed_by == "operator"
    call = ToolCallRecord.objects.get(id=ticket.call_id)
    assert (call.phase, call.approved) == ("awaiting", True)
    assert fsck.check_thread(run.thread_id) == []


@pytest.mark.django_db
def test_ending_an_awaiting_run_voids_its_ticket_and_seals_the_batch(awaiting_run, drive):
    run = awaiting_run()
    done = drive(drafts.end, run.run_id, EndCause.CANCELLED)
    ticket = Ticket.objects.get(run_id=run.run_id)
    assert (ticket.state, ticket.decision, ticket.closed_seq) == ("void", "", done.seq)
    phases = list(
        ToolCallRecord.objects.filter(run_id=run.run_id)
        .order_by("index")
        .values_list("phase", "batch_finalized", "effect_may_have_started")
    )
    assert phases == [("indeterminate", True, False), ("indeterminate", True, False)]
    tools = MessageRecord.objects.filter(run_id=run.run_id, role="tool").order_by("idx")
    assert [m.tool_call_id for m in tools] == [c.tool_call_id for c in done.run.batches[-1].calls]
    assert Thread.objects.get(id=run.thread_id).active_run_id is None
    assert fsck.check_thread(run.thread_id) == []


# -- refusals write nothing and announce nothing ---------------------------------------------


def _ticket(run_id: str, call_id: str, ticket_id: str = "tkx") -> ResumeTicket:
    return ResumeTicket(id=ticket_id, run_id=run_id, call_id=call_id, kind=TicketKind.APPROVAL)


def _awaiting_without_ticket(ctx):
    draft = drafts.wait(ctx.head, ctx.run, ctx.call.call_id, "tkx")
    return replace(draft, disposition=Disposition(state=RunState.AWAITING))


def _running_with_ticket(ctx):
    ticket = _ticket(ctx.run.run_id, ctx.call.call_id)
    return replace(
        drafts.wait(ctx.head, ctx.run, ctx.call.call_id, "tkx"),
        disposition=Disposition(state=RunState.RUNNING, ticket=ticket),
    )


def _ended_with_ticket(ctx):
    ticket = _ticket(ctx.run.run_id, ctx.call.call_id)
    draft = drafts.end(ctx.head, ctx.run, EndCause.CANCELLED)
    disposition = Disposition(state=RunState.ENDED, end_cause=EndCause.CANCELLED, ticket=ticket)
    return replace(draft, disposition=disposition)


def _ended_without_cause(ctx):
    draft = drafts.end(ctx.head, ctx.run, EndCause.CANCELLED)
    return replace(draft, disposition=Disposition(state=RunState.ENDED))


def _running_with_cause(ctx):
    draft = drafts.complete(ctx.head, ctx.run, ctx.call.call_id)
    return replace(
        draft, disposition=Disposition(state=RunState.RUNNING, end_cause=EndCause.NATURAL)
    )


def _no_disposition(ctx):
    return replace(drafts.complete(ctx.head, ctx.run, ctx.call.call_id), disposition=None)


def _ticket_for_another_run(ctx):
    ticket = _ticket(ctx.other.run_id, ctx.call.call_id)
    return drafts.wait(ctx.head, ctx.run, ctx.call.call_id, "tkx", ticket=ticket)


def _ticket_for_a_call_of_another_thread(ctx):
    ticket = _ticket(ctx.run.run_id, ctx.other_call.call_id)
    return drafts.wait(ctx.head, ctx.run, ctx.call.call_id, "tkx", ticket=ticket)


def _ticket_of_another_id(ctx):
    ticket = _ticket(ctx.run.run_id, ctx.call.call_id, "tk-other")
    return drafts.wait(ctx.head, ctx.run, ctx.call.call_id, "tkx", ticket=ticket)


def _second_run_on_the_thread(ctx):
    return drafts.activate(ctx.head, "second" + ctx.run.run_id[:20])


def _commit_for_another_thread(ctx):
    draft = drafts.complete(ctx.head, ctx.run, ctx.call.call_id)
    return replace(draft, thread_id=ctx.other_thread, expected_version=ctx.other_version)


def _stale_version(ctx):
    draft = drafts.complete(ctx.head, ctx.run, ctx.call.call_id)
    return replace(draft, expected_version=ctx.head.version - 1)


def _future_version(ctx):
    draft = drafts.complete(ctx.head, ctx.run, ctx.call.call_id)
    return replace(draft, expected_version=ctx.head.version + 1)


def _unknown_thread(ctx):
    return replace(drafts.complete(ctx.head, ctx.run, ctx.call.call_id), thread_id="nope")


def _unknown_run(ctx):
    return replace(drafts.complete(ctx.head, ctx.run, ctx.call.call_id), run_id="nope")


def _executing_a_completed_call(ctx):
    return drafts.execute(ctx.head, ctx.run, ctx.done_call.call_id, attempt=1)


def _executing_an_ask_call_without_approval(ctx):
    return drafts.execute(ctx.head, ctx.run, ctx.call.call_id)


def _results_out_of_call_order(ctx):
    draft = _complete_and_finalize(ctx)
    return replace(draft, messages=tuple(reversed(draft.messages)))


def _results_missing_one(ctx):
    draft = _complete_and_finalize(ctx)
    return replace(draft, messages=draft.messages[:1])


def _complete_and_finalize(ctx):
    """Complete the last call and finalize in one commit (accepted as it is)."""
    batch = ctx.run.open_batch
    finished = replace(ctx.call, phase=ctx.done_call.phase, result="r")
    published = publication(replace(batch, calls=(ctx.done_call, finished)))
    return replace(
        drafts.complete(ctx.head, ctx.run, ctx.call.call_id, result="r"),
        events=(
            CallCompleted(call_id=ctx.call.call_id, result="r"),
            BatchFinalized(step=batch.step),
        ),
        messages=published,
    )


def _finalizing_with_a_call_unfinished(ctx):
    batch = ctx.run.open_batch
    return replace(
        drafts.complete(ctx.head, ctx.run, ctx.call.call_id),
        events=(BatchFinalized(step=batch.step),),
    )


def _user_message_mid_run(ctx):
    draft = drafts.complete(ctx.head, ctx.run, ctx.call.call_id)
    return replace(draft, messages=(Message(role="user", content="sneaky"),))


def _note_with_a_disposition(ctx):
    draft = drafts.reconcile(ctx.head, ctx.run, ctx.call.call_id)
    return replace(draft, disposition=Disposition.running())


def _reconciling_a_call_that_is_not_indeterminate(ctx):
    return drafts.reconcile(ctx.head, ctx.run, ctx.done_call.call_id)


REFUSALS = [
    (_awaiting_without_ticket, InvalidDisposition, "must carry its ResumeTicket"),
    (_running_with_ticket, InvalidDisposition, "disposition of running cannot carry a ticket"),
    (_ended_with_ticket, InvalidDisposition, "disposition of ended cannot carry a ticket"),
    (_ended_without_cause, InvalidDisposition, "must carry its EndCause"),
    (_running_with_cause, InvalidDisposition, "cannot carry an EndCause"),
    (_no_disposition, InvalidDisposition, "carries its RunDisposition"),
    (_ticket_for_another_run, InvalidDisposition, "belongs to another run"),
    (_ticket_for_a_call_of_another_thread, InvalidDisposition, "a call in the open batch"),
    (_ticket_of_another_id, InvalidDisposition, "a call in the open batch"),
    (_second_run_on_the_thread, RunAlreadyActive, "already has a run"),
    (_commit_for_another_thread, InvalidCommit, "does not belong to this thread"),
    (_stale_version, VersionConflict, "Another writer committed first"),
    (_future_version, VersionConflict, "Another writer committed first"),
    (_unknown_thread, NotFound, "does not exist"),
    (_unknown_run, NotFound, "no committed activation"),
    (_executing_a_completed_call, IllegalTransition, "completed -> executing"),
    (_executing_an_ask_call_without_approval, IllegalTransition, "asks for approval first"),
    (_results_out_of_call_order, InvalidCommit, "in call order"),
    (_results_missing_one, InvalidCommit, "in call order"),
    (_finalizing_with_a_call_unfinished, InvalidCommit, "are not terminal"),
    (_user_message_mid_run, InvalidCommit, "enter only with a new run"),
    (_note_with_a_disposition, InvalidCommit, "reconciliation facts only"),
    (_reconciling_a_call_that_is_not_indeterminate, InvalidCommit, "only an Indeterminate"),
]


class Ctx:
    """A thread whose run has a batch of [completed allow-call, requested ask-call], plus a
    second thread with its own run and call."""

    def __init__(self, make_run, make_calls, drive) -> None:
        self.other = make_run()
        self.other_thread = self.other.thread_id
        drive(drafts.infer_tools, self.other.run_id, make_calls(1))
        other = read_run(self.other.run_id)
        assert other is not None
        self.other_call = other.batches[-1].calls[0]
        self.other_version = read_head(self.other_thread).version
        run = make_run()
        allow = make_calls(2, permission=Permission.ALLOW)[0]
        ask = make_calls(2, permission=Permission.ASK)[1]
        drive(drafts.infer_tools, run.run_id, (allow, ask))
        drive(drafts.execute, run.run_id, allow.call_id)
        drive(drafts.complete, run.run_id, allow.call_id)
        view = read_run(run.run_id)
        assert view is not None
        self.run = view
        self.head = read_head(run.thread_id)
        self.done_call, self.call = self.run.batches[-1].calls


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("build", "error", "text"), REFUSALS, ids=lambda v: getattr(v, "__name__", "")
)
def test_a_refused_commit_writes_and_announces_nothing(
    build, error, text, make_run, make_calls, drive, django_capture_on_commit_callbacks
):
    ctx = Ctx(make_run, make_calls, drive)
    draft = build(ctx)
    before = state_of(ctx.run.thread_id), state_of(ctx.other_thread)
    with django_capture_on_commit_callbacks() as callbacks, pytest.raises(error) as excinfo:
        commit(draft)
    assert text in str(excinfo.value)
    assert callbacks == []
    assert (state_of(ctx.run.thread_id), state_of(ctx.other_thread)) == before
    assert fsck.check() == []


@pytest.mark.django_db
def test_the_refusal_cases_start_from_a_commit_that_is_accepted(make_run, make_calls, drive):
    ctx = Ctx(make_run, make_calls, drive)
    done = commit(_complete_and_finalize(ctx))
    assert done.run.batches[-1].finalized
    assert fsck.check() == []


@pytest.mark.django_db
def test_any_commit_after_ended_is_refused(make_run, make_calls, drive):
    run = make_run()
    drive(drafts.infer_tools, run.run_id, make_calls(1, permission=Permission.ASK))
    drive(drafts.end, run.run_id, EndCause.FAILED)
    ended = read_run(run.run_id)
    head = read_head(run.thread_id)
    call_id = ended.batches[-1].calls[0].call_id
    before = state_of(run.thread_id)
    for draft in (
        drafts.infer_text(head, ended),
        drafts.end(head, ended, EndCause.CANCELLED),
        drafts.complete(head, ended, call_id),
        drafts.wait(head, ended, call_id, "tk1"),
        CommitDraft(
            thread_id=run.thread_id,
            run_id=run.run_id,
            expected_version=head.version,
            disposition=Disposition.running(),
            events=(CallCompleted(call_id=call_id, result="late"),),
        ),
    ):
        with pytest.raises(RunEnded) as excinfo:
            commit(draft)
        assert excinfo.value.detail["from_state"] == "ended"
        assert excinfo.value.detail["end_cause"] == "failed"
    reactivation = drafts.activate(head, run.run_id)
    with pytest.raises(InvalidCommit, match="activates once"):
        commit(reactivation)
    assert state_of(run.thread_id) == before


@pytest.mark.django_db
def test_a_follow_up_run_may_start_once_the_first_has_ended(make_run, drive):
    first = make_run()
    with pytest.raises(RunAlreadyActive):
        make_run(first.thread_id)
    drive(drafts.infer_text, first.run_id, end=True)
    second = make_run(first.thread_id)
    assert read_head(first.thread_id).active_run_id == second.run_id
    assert fsck.check_thread(first.thread_id) == []


@pytest.mark.django_db
def test_a_lost_lease_writes_nothing(make_run, drive):
    run = make_run()
    before = state_of(run.thread_id)
    head, view = read_head(run.thread_id), read_run(run.run_id)
    lease = Lease(worker_id="w-stale", epoch=3, ttl=timedelta(seconds=5))
    with pytest.raises(LeaseLost):
        commit(drafts.infer_text(head, view), lease=lease)
    assert state_of(run.thread_id) == before


@pytest.mark.django_db
def test_the_unique_sequence_is_the_safety_net_behind_the_head(make_run):
    """A log row already at the next sequence (a head left behind by hand) refuses the
    commit as a conflict, and the head stays where it was."""
    run = make_run()
    head, view = read_head(run.thread_id), read_run(run.run_id)
    ThreadCommit.objects.create(thread_id=run.thread_id, seq=head.version + 1, run_id=run.run_id)
    with pytest.raises(VersionConflict):
        commit(drafts.infer_text(head, view))
    assert read_head(run.thread_id) == head
    assert read_run(run.run_id) == view


# -- rollback after the log row, and announcements only after commit ---------------------------


def _plant_conflict(move: str, view, seq: int) -> Callable[[], object]:
    """Plant a row that makes the last part of the commit's write fail in the database (a
    message or ticket already there), after the head, run and log parts; return its undo."""
    planted: models.Model
    if move == "wait":
        planted = Ticket.objects.create(
            id="tkr",
            run_id=view.run_id,
            call_id=view.batches[-1].calls[0].call_id,
            kind="input",
            opened_seq=0,
        )
    else:
        planted = MessageRecord.objects.create(
            thread_id=view.thread_id, run_id=view.run_id, seq=seq, idx=0, role="user"
        )
    return planted.delete


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("move", ["text", "tools", "wait", "end"])
def test_a_write_that_fails_late_leaves_nothing(move, make_run, make_calls, drive, announcements):
    """The write is atomic: a database refusal of its last part takes every part with it."""
    run = make_run()
    drive(drafts.infer_tools, run.run_id, make_calls(2, permission=Permission.ASK))
    for call in read_run(run.run_id).batches[-1].calls:
        drive(drafts.complete, run.run_id, call.call_id, result="blocked", is_error=True)
    drive(drafts.finalize, run.run_id)
    if move in ("wait", "end"):
        drive(drafts.infer_tools, run.run_id, make_calls(1, permission=Permission.ASK))
    announcements.clear()
    head, view = read_head(run.thread_id), read_run(run.run_id)
    draft = {
        "text": lambda: drafts.infer_text(head, view, text="never seen"),
        "tools": lambda: drafts.infer_tools(head, view, make_calls(2)),
        "wait": lambda: drafts.wait(head, view, view.batches[-1].calls[0].call_id, "tkr"),
        "end": lambda: drafts.end(head, view, EndCause.CANCELLED),
    }[move]()
    undo = _plant_conflict(move, view, head.version + 1)
    before = state_of(run.thread_id)
    with pytest.raises(InvalidCommit, match="refused"):
        commit(draft)
    assert state_of(run.thread_id) == before
    assert announcements == []
    undo()
    assert commit(draft).seq == head.version + 1  # the same commit, now without the fault
    assert fsck.check() == []


@pytest.mark.django_db(transaction=True)
def test_the_announcement_waits_for_the_outer_transaction(make_run, drive, announcements):
    run = make_run()
    assert [n.runnable for n in announcements] == [True]  # the activation
    with transaction.atomic():
        done = drive(drafts.infer_text, run.run_id)
        assert len(announcements) == 1  # committed inside, but not yet durable
    assert announcements[-1] == CommitNotice(
        thread_id=run.thread_id, run_id=run.run_id, seq=done.seq, state="running", runnable=False
    )


@pytest.mark.django_db(transaction=True)
def test_an_outer_rollback_takes_the_commit_and_its_announcement(make_run, drive, announcements):
    run = make_run()
    announcements.clear()
    before = state_of(run.thread_id)
    with pytest.raises(RuntimeError), transaction.atomic():
        drive(drafts.infer_text, run.run_id)
        raise RuntimeError("the caller changed its mind")
    assert state_of(run.thread_id) == before
    assert announcements == []


@pytest.mark.django_db(transaction=True)
def test_announcements_say_when_a_run_becomes_runnable(awaiting_run, drive, announcements):
    run = awaiting_run()
    drive(drafts.resume, run.run_id, Decision.DENY)
    drive(drafts.end, run.run_id, EndCause.STOPPED)
    seen = [(n.seq, n.state, n.runnable) for n in announcements]
    assert seen == [
        (1, "running", True),  # activation
        (2, "running", False),  # batch opened
        (3, "awaiting", False),
        (4, "running", True),  # resumed
        (5, "ended", False),
    ]
