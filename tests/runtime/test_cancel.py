"""Cancel while Running mid-batch and while Awaiting.

One commit ends the run as Ended(cancelled) and seals every open call (the batch is finalized,
so no tool-use block is left without a result); a repeated cancel returns the same terminus and
writes nothing; a tool result that arrives after its call was sealed is kept as LateEvidence
and never published.
"""

from __future__ import annotations

import json
import time

import pytest

from runtime import codec
from runtime.domain.model import Decision, EndCause, ResumeCommand, RunState, TicketKind
from runtime.errors import IdempotencyKeyReused, RunEnded
from runtime.models import CommandRecord, LateEvidence, MessageRecord, ThreadCommit, Ticket
from runtime.operations import cancel, resume
from tests.runtime.support import (
    assert_log_sound,
    calls,
    commit_count,
    ledger,
    run_row,
    text_step,
    tool_step,
    twins,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _executing(run_id: str, index: int = 0) -> bool:
    found = [c for c in calls(run_id) if c.index == index]
    return bool(found) and found[0].phase == "executing"


def _assert_cancelled_in_one_commit(run_id: str, before: int) -> ThreadCommit:
    thread_id = run_row(run_id).thread_id
    assert commit_count(thread_id) == before + 1
    last = ThreadCommit.objects.get(thread_id=thread_id, seq=before + 1)
    disposition = codec.load_disposition(last.disposition)
    assert disposition is not None
    assert (disposition.state, disposition.end_cause) == (RunState.ENDED, EndCause.CANCELLED)
    run = run_row(run_id)
    # The lease stays with a live owner until it lets go; an Ended run is never claimed.
    assert (run.state, run.end_cause) == ("ended", "cancelled")
    assert all(c.phase in ("completed", "indeterminate") for c in calls(run_id))
    assert all(c.batch_finalized for c in calls(run_id))
    # Every tool-use block has its result, in call order, published by that same commit.
    published = MessageRecord.objects.filter(run_id=run_id, role="tool").order_by("seq", "idx")
    assert [(m.seq, m.tool_call_id, m.content) for m in published] == [
        (before + 1, c.tool_call_id, c.result) for c in calls(run_id)
    ]
    return last


def _assert_repeat_writes_nothing(run_id: str, first: dict, **options) -> None:
    thread_id = run_row(run_id).thread_id
    seen = commit_count(thread_id)
    again = cancel(run_id, actor="test", **options)
    assert again == first  # the same terminus, to the last field
    assert commit_count(thread_id) == seen


@pytest.mark.slow
def test_cancel_mid_call_keeps_the_late_result_as_evidence(start, spawn_worker):
    # The owner's heartbeat is slower than the call, so it only learns of the cancel when the
    # tool returns: its result comes late and must be kept as evidence, never published.
    run_id = start(
        tool_step(("slow", {"seconds": 1.5}), ("ledger_once", {"key": "after"})), text_step()
    )
    owner = spawn_worker(
        worker_id="owner", RUNTIME_LEASE_SECONDS="30", RUNTIME_HEARTBEAT_SECONDS="10"
    )
    wait_for(lambda: _executing(run_id), what="the slow call to start")
    before = commit_count(run_row(run_id).thread_id)

    first = cancel(run_id, actor="op", reason="operator says stop")
    assert (first["state"], first["end_cause"]) == ("ended", "cancelled")
    last = _assert_cancelled_in_one_commit(run_id, before)
    assert last.actor == "op"
    slow, after = calls(run_id)
    # `slow` declares no external effect: nothing to check, whatever its attempt (issue 22).
    assert (slow.phase, slow.effect_may_have_started) == ("indeterminate", False)
    assert slow.result.startswith("No external effect; nothing to check")
    assert "the run was cancelled" in slow.result and "operator says stop" in slow.result
    assert (after.phase, after.attempt) == ("indeterminate", 0)
    assert not after.effect_may_have_started
    assert after.result.startswith("Not executed")
    _assert_repeat_writes_nothing(run_id, first)

    code, err = owner.wait(timeout=20)
    assert code == 0, err
    evidence = LateEvidence.objects.get(call_id=slow.id)
    assert (json.loads(evidence.result), evidence.worker) == ({"slept": 1.5}, "owner")
    slow.refresh_from_db()
    assert slow.phase == "indeterminate" and "slept" not in slow.result
    assert not MessageRecord.objects.filter(run_id=run_id, content__contains="slept").exists()
    assert ledger(run_id) == {}  # the call after the cancelled one never ran
    assert commit_count(run_row(run_id).thread_id) == before + 1
    assert_log_sound(run_id)


@pytest.mark.slow
def test_cancel_mid_replayable_call_frees_the_worker_at_once(start, spawn_worker):
    # With a live heartbeat the owner notices the lost lease while the replay-safe call is in
    # flight and abandons it, long before the call would return.
    run_id = start(tool_step(("slow", {"seconds": 30})), text_step())
    owner = spawn_worker(worker_id="owner")
    wait_for(lambda: _executing(run_id), what="the slow call to start")
    before = commit_count(run_row(run_id).thread_id)

    first = cancel(run_id, actor="test", idempotency_key="stop-1")
    cancelled_at = time.monotonic()
    assert (first["state"], first["end_cause"]) == ("ended", "cancelled")
    _assert_cancelled_in_one_commit(run_id, before)
    code, err = owner.wait(timeout=10)
    assert code == 0, err
    assert time.monotonic() - cancelled_at < 5
    assert "ended by another writer" in err
    _assert_repeat_writes_nothing(run_id, first, idempotency_key="stop-1")
    _assert_repeat_writes_nothing(run_id, first)
    assert not LateEvidence.objects.exists()  # abandoned: there is no result to keep
    assert_log_sound(run_id)


@pytest.mark.slow
def test_cancel_while_awaiting(start, work_inline, command):
    run_id = start(
        tool_step(
            ("ledger_once", {"key": "a"}),
            ("ledger_approval", {"key": "b"}),
            ("ledger_replay", {"key": "c"}),
        ),
        text_step(),
    )
    work_inline()
    assert run_row(run_id).state == "awaiting"
    ticket = Ticket.objects.get(run_id=run_id)
    before = commit_count(run_row(run_id).thread_id)

    done = command("runtime_cancel", run_id, "--reason", "not today")
    assert (done.returncode, done.stdout.strip()) == (0, f"run {run_id}: ended (cancelled)")
    assert _assert_cancelled_in_one_commit(run_id, before).actor.startswith("cli:")
    first = cancel(run_id, actor="test", reason="not today", idempotency_key="c1")
    assert (first["state"], first["end_cause"], first["ticket"]) == ("ended", "cancelled", None)
    a, b, c = calls(run_id)
    assert (a.phase, a.is_error) == ("completed", False)
    assert (b.phase, b.effect_may_have_started) == ("indeterminate", False)
    assert (c.phase, c.effect_may_have_started) == ("indeterminate", False)
    assert "not today" in b.result and b.result.startswith("Not executed")
    ticket.refresh_from_db()
    assert ticket.state == "void"

    _assert_repeat_writes_nothing(run_id, first, idempotency_key="c1", reason="not today")
    _assert_repeat_writes_nothing(run_id, first)
    with pytest.raises(IdempotencyKeyReused):  # the same key for another request
        cancel(run_id, idempotency_key="c1", reason="something else")
    assert CommandRecord.objects.filter(run_id=run_id).count() == 1
    with pytest.raises(RunEnded):
        resume(
            run_id,
            ResumeCommand(ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
        )
    assert work_inline() == 0  # nothing is runnable
    assert commit_count(run_row(run_id).thread_id) == before + 1
    assert [e["tool"] for e in ledger(run_id).values()] == ["ledger_once"]
    assert_log_sound(run_id)


def test_twin_cancels_sent_at_once_get_the_same_terminus(start, work_inline):
    run_id = start(tool_step(("ledger_approval", {"key": "b"})), text_step())
    work_inline()
    before = commit_count(run_row(run_id).thread_id)
    first, second = twins(lambda: cancel(run_id, idempotency_key="twin"))
    assert isinstance(first, dict), first
    assert second == first
    assert (first["state"], first["end_cause"]) == ("ended", "cancelled")
    assert commit_count(run_row(run_id).thread_id) == before + 1
