"""Fork from a step (issue 22): a new run on a new thread whose committed history is the
source's up to the end of the chosen step; nothing executed again; linked both ways; the
source never changed; fsck checks the copied prefix."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from runtime import fsck, operations
from runtime.demo.models import LedgerEffect
from runtime.domain.events import CallIndeterminate
from runtime.domain.model import Decision, Disposition, ResumeCommand, TicketKind
from runtime.errors import ForkRefused, NotFound
from runtime.inventory import unreconciled_calls
from runtime.models import MessageRecord, Run, ThreadCommit, Ticket
from tests.console.support import RunDriver
from tests.runtime.support import assert_log_sound, calls, run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = (
    tool_step(("ledger_once", {"key": "a"}), ("ledger_replay", {"key": "b"})),
    tool_step(("ledger_once", {"key": "c"})),
    text_step("all three recorded"),
)


def _log(thread_id: str) -> list[tuple]:
    return list(
        ThreadCommit.objects.filter(thread_id=thread_id)
        .order_by("seq")
        .values_list("seq", "run_id", "disposition", "messages", "events", "actor", "created_at")
    )


def test_fork_from_step_2_copies_history_and_runs_nothing_again(start, work_inline):
    source = start(*SCRIPT, input="record a, b, c")
    work_inline()
    src = Run.objects.get(id=source)
    assert (src.state, src.end_cause, src.step) == ("ended", "natural", 3)
    before = _log(src.thread_id)
    effects = LedgerEffect.objects.count()

    fork = operations.fork_run(source, at_step=2, input="now record d instead", actor="olga")
    run = Run.objects.get(id=fork)
    assert run.thread_id != src.thread_id and run.state == "running" and run.step == 2
    assert run.metadata["forked_from"] == {
        "run_id": source,
        "thread_id": src.thread_id,
        "step": 2,
        "seq": run.version - 1,
        "by": "olga",
    }
    assert run.metadata["script"] == src.metadata["script"]
    # The relation is also a column (indexed: the run page's forks are a lookup).
    assert run.forked_from == source and src.forked_from is None
    assert list(Run.objects.filter(forked_from=source).values_list("id", flat=True)) == [fork]
    copied = calls(fork)
    assert [c.name for c in copied] == ["ledger_once", "ledger_replay", "ledger_once"]
    originals = calls(source)
    for copy, original in zip(copied, originals, strict=True):
        assert copy.id != original.id and copy.operation_id != original.operation_id
        # The copy's own operation id stands where its output named the original's.
        result = (original.result or "").replace(original.operation_id, copy.operation_id)
        assert (copy.phase, copy.result, copy.attempt) == (
            original.phase,
            result,
            original.attempt,
        )
        assert copy.source["copied_from"]["operation_id"] == original.operation_id
    assert LedgerEffect.objects.count() == effects  # nothing executed again
    users = list(MessageRecord.objects.filter(run_id=fork, role="user").order_by("seq"))
    assert [m.content for m in users] == ["record a, b, c", "now record d instead"]
    assert _log(src.thread_id) == before  # the source never changes
    assert fsck.check_thread(run.thread_id) == []
    assert fsck.check_thread(src.thread_id) == []

    work_inline()  # the fork goes on from step 3: the model is asked again, no tool re-runs
    run.refresh_from_db()
    assert (run.state, run.end_cause, run.step) == ("ended", "natural", 3)
    assert LedgerEffect.objects.count() == effects
    assert_log_sound(fork)


def test_a_copied_indeterminate_call_is_reconciled_once_at_its_source():
    """A copy never ran: its original is the one a person checks (no second queue entry)."""
    driver = RunDriver(operations.start_run(agent="demo", input="pay", actor="t"))
    (call,) = driver.open_batch({"name": "ledger_once", "arguments": {"key": "p"}})
    driver.execute(call)
    driver._commit(
        Disposition.running(), events=(CallIndeterminate(call_id=call.call_id, reason="lost"),)
    )
    driver.finalize()
    driver.text_step("done", end=True)
    fork = operations.fork_run(driver.run_id, at_step=1, actor="olga")
    (copy,) = calls(fork)
    assert (copy.phase, copy.effect_may_have_started) == ("indeterminate", True)
    assert [c.id for c in unreconciled_calls()] == [call.call_id]
    assert fsck.check_thread(Run.objects.get(id=fork).thread_id) == []


def test_fork_refusals(start, work_inline):
    source = start(*SCRIPT)
    with pytest.raises(ForkRefused, match="has no step 1"):
        operations.fork_run(source, at_step=1)
    work_inline()
    with pytest.raises(ForkRefused, match="has no step 4"):
        operations.fork_run(source, at_step=4)
    with pytest.raises(ForkRefused):
        operations.fork_run(source, at_step=0)
    with pytest.raises(NotFound):
        operations.fork_run("0" * 32, at_step=1)
    assert Run.objects.count() == 1


def test_fsck_finds_a_copy_that_differs_from_its_source(start, work_inline):
    source = start(*SCRIPT)
    work_inline()
    fork = operations.fork_run(source, at_step=2, actor="olga")
    thread_id = Run.objects.get(id=fork).thread_id
    row = ThreadCommit.objects.get(thread_id=thread_id, seq=1)
    row.actor = "mallory"
    row.save(update_fields=["actor"])
    found = fsck.check_thread(thread_id)
    assert any("is not the copy of commit 1" in v.what and "actor" in v.what for v in found)
    assert 1 in [v.seq for v in found]


def test_runtime_fork_command(start, work_inline):
    source = start(*SCRIPT)
    work_inline()
    out = StringIO()
    call_command("runtime_fork", source, "--at-step", "1", "--input", "again", stdout=out)
    fork = out.getvalue().strip()
    assert Run.objects.get(id=fork).metadata["forked_from"]["step"] == 1
    out = StringIO()
    call_command("runtime_fork", source, "--at-step", "2", "--json", stdout=out)
    assert json.loads(out.getvalue())["metadata"]["forked_from"]["step"] == 2


def _approve(run_id: str) -> None:
    ticket = Ticket.objects.get(run_id=run_id, kind="approval", state="open")
    command = ResumeCommand(
        ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE
    )
    operations.resume(run_id, command, actor="approver")


def test_a_run_paused_during_the_step_forks(start, work_inline):
    """Issue 31, item 4: the pause ticket names no call; its copy must name none either (the
    copy once gave its empty call id a new id, and the fork was refused as invalid_commit)."""
    source = start(tool_step(("ledger_approval", {"key": "a"})), text_step("done"))
    work_inline()
    paused = operations.pause(source, actor="op", reason="look first")
    operations.resume_run(source, actor="op", ticket_id=paused["pause"]["ticket_id"])
    _approve(source)
    work_inline()
    assert run_row(source).end_cause == "natural"

    fork = operations.fork_run(source, at_step=1, actor="olga")
    assert Run.objects.get(id=fork).state == "running"
    assert fsck.check(Run.objects.get(id=fork).thread_id) == []


def test_a_step_ended_by_a_cancel_while_awaiting_is_refused_with_the_reason(start, work_inline):
    """Issue 31, item 4: the cancel that ended the awaiting run also ended its step; a copy
    cannot go on from there (a run leaves Awaiting only by a resume), so the fork is refused
    with the reason (409), not with an illegal transition of the copy."""
    source = start(
        tool_step(("ledger_once", {"key": "a"})),
        tool_step(("ledger_approval", {"key": "b"})),
        text_step("done"),
    )
    work_inline()
    operations.cancel(source, actor="op", reason="enough")
    with pytest.raises(ForkRefused) as refused:
        operations.fork_run(source, at_step=2, actor="olga")
    assert refused.value.status == 409
    assert "cancelled while it awaited" in refused.value.message
    assert operations.fork_run(source, at_step=1, actor="olga")  # the step before forks
