"""Pause and resume (issue 23, item 1): a committed pause ticket beside the disposition.

A pause is one commit (``RunPaused``, kind ``pause``) that keeps the run's disposition: the run
stops at its next boundary (a call whose effect started finishes and its result is committed;
nothing new starts), no worker claims it and none holds its lease, its open ticket stays
answerable, a cancel still ends it, and only a resume (``RunResumed``) lets a worker continue
it from the committed frontier. Refusals write nothing.
"""

from __future__ import annotations

import json

import pytest

from runtime import codec
from runtime.domain.model import Decision, ResumeCommand, RunState, TicketKind
from runtime.errors import (
    AlreadyPaused,
    IdempotencyKeyReused,
    NotPaused,
    RunEnded,
    TicketMismatch,
)
from runtime.models import CommandRecord, LateEvidence, Run, ThreadCommit, Ticket
from runtime.operations import cancel, pause, resume, resume_run
from tests.runtime.support import (
    assert_log_sound,
    calls,
    commit_count,
    ledger,
    run_row,
    text_step,
    tool_step,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _events(run_id: str, seq: int) -> list[str]:
    row = ThreadCommit.objects.get(thread_id=run_row(run_id).thread_id, seq=seq)
    return [e["type"] for e in row.events]


def _executing(run_id: str, index: int = 0) -> bool:
    found = [c for c in calls(run_id) if c.index == index]
    return bool(found) and found[0].phase == "executing"


def _refused_writes_nothing(run_id: str, act, error: type[Exception]) -> Exception:
    thread_id = run_row(run_id).thread_id
    seen = commit_count(thread_id)
    records = CommandRecord.objects.count()
    with pytest.raises(error) as refused:
        act()
    assert commit_count(thread_id) == seen
    assert CommandRecord.objects.count() == records
    return refused.value


def test_pause_is_one_commit_and_no_worker_claims_the_run(start, work_inline):
    run_id = start(tool_step(("ledger_once", {"key": "a"})), text_step())
    thread_id = run_row(run_id).thread_id
    before = commit_count(thread_id)

    doc = pause(run_id, actor="op", reason="model misbehaves")
    assert commit_count(thread_id) == before + 1
    assert _events(run_id, before + 1) == ["RunPaused"]
    last = ThreadCommit.objects.get(thread_id=thread_id, seq=before + 1)
    assert last.actor == "op"
    assert codec.load_disposition(last.disposition).state is RunState.RUNNING  # kept
    assert doc["state"] == "running"
    assert doc["pause"]["paused_by"] == "op" and doc["pause"]["reason"] == "model misbehaves"
    assert doc["pause"]["line"].startswith("paused by op at ")
    assert doc["pause"]["line"].endswith(": model misbehaves")
    row = run_row(run_id)
    assert (row.paused, row.lease_owner) == (True, None)

    assert work_inline() == 0  # nothing is runnable: the run never starts
    assert run_row(run_id).step == 0 and ledger(run_id) == {}
    assert_log_sound(run_id)

    resumed = resume_run(run_id, actor="op2", reason="fixed")
    assert resumed["pause"] is None and not run_row(run_id).paused
    assert _events(run_id, before + 2) == ["RunResumed"]
    assert work_inline() >= 1
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    assert [e["tool"] for e in ledger(run_id).values()] == ["ledger_once"]
    assert_log_sound(run_id)


def test_refusals_write_nothing(start, work_inline):
    run_id = start(tool_step(("ledger_approval", {"key": "a"})), text_step())
    _refused_writes_nothing(run_id, lambda: resume_run(run_id, actor="op"), NotPaused)
    pause(run_id, actor="op", reason="r1")
    # The same pause by the same actor is answered, not re-applied; another is refused.
    seen = commit_count(run_row(run_id).thread_id)
    assert pause(run_id, actor="op", reason="r1")["pause"]["reason"] == "r1"
    assert commit_count(run_row(run_id).thread_id) == seen
    refused = _refused_writes_nothing(
        run_id, lambda: pause(run_id, actor="other", reason="r2"), AlreadyPaused
    )
    assert (refused.code, refused.status) == ("already_paused", 409)
    assert refused.detail["paused_by"] == "op"
    _refused_writes_nothing(
        run_id, lambda: resume_run(run_id, actor="op", ticket_id="f" * 32), TicketMismatch
    )
    # Idempotency keys: a repeat gets the first answer, another body under the key is refused.
    first = resume_run(run_id, actor="op", idempotency_key="k1")
    assert resume_run(run_id, actor="op", idempotency_key="k1") == first
    _refused_writes_nothing(
        run_id, lambda: resume_run(run_id, reason="x", idempotency_key="k1"), IdempotencyKeyReused
    )
    # The same resume by the same actor (without the key) is answered; another is refused.
    seen = commit_count(run_row(run_id).thread_id)
    assert resume_run(run_id, actor="op")["pause"] is None
    assert commit_count(run_row(run_id).thread_id) == seen
    _refused_writes_nothing(run_id, lambda: resume_run(run_id, actor="other"), NotPaused)
    _refused_writes_nothing(run_id, lambda: resume_run(run_id, actor="op", reason="x"), NotPaused)

    cancel(run_id, actor="op")
    refused = _refused_writes_nothing(run_id, lambda: pause(run_id, actor="op"), RunEnded)
    assert (refused.code, refused.status) == ("run_ended", 409)
    _refused_writes_nothing(run_id, lambda: resume_run(run_id, actor="op"), RunEnded)
    assert_log_sound(run_id)


def test_cancel_on_a_paused_run(start, work_inline):
    run_id = start(tool_step(("ledger_once", {"key": "a"}), ("ledger_approval", {"key": "b"})))
    work_inline()
    assert run_row(run_id).state == "awaiting"
    pause(run_id, actor="op")
    done = cancel(run_id, actor="op", reason="enough")
    assert (done["state"], done["end_cause"], done["pause"]) == ("ended", "cancelled", None)
    row = run_row(run_id)
    assert (row.paused, row.state) == (False, "ended")
    assert Ticket.objects.get(run_id=run_id).state == "void"
    assert work_inline() == 0
    assert_log_sound(run_id)


def test_ticket_answered_while_paused_waits_for_the_resume(start, work_inline):
    run_id = start(tool_step(("ledger_approval", {"key": "b"})), text_step())
    work_inline()
    ticket = Ticket.objects.get(run_id=run_id)
    paused = pause(run_id, actor="op", reason="hold on")
    assert (paused["state"], paused["ticket"]["id"]) == ("awaiting", ticket.id)  # answerable

    answered = resume(
        run_id,
        ResumeCommand(ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
        actor="approver",
    )
    assert answered["state"] == "running" and answered["pause"]["reason"] == "hold on"
    ticket.refresh_from_db()
    assert ticket.state == "consumed"  # the answer is committed...
    assert work_inline() == 0  # ...and the run waits for the resume
    (call,) = calls(run_id)
    assert (call.phase, call.approved, call.attempt) == ("awaiting", True, 0)
    assert ledger(run_id) == {}
    # A pause ticket is answered only by a resume, never through the ticket answers.
    pause_id = answered["pause"]["ticket_id"]
    for kind in (TicketKind.PAUSE, TicketKind.APPROVAL):
        with pytest.raises(Exception) as refused:
            resume(run_id, ResumeCommand(ticket_id=pause_id, kind=kind, decision=Decision.RESUME))
        assert refused.value.status == 409

    resume_run(run_id, actor="op", ticket_id=pause_id)
    assert work_inline() >= 1
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    (call,) = calls(run_id)
    assert (call.phase, call.attempt) == ("completed", 1)
    assert_log_sound(run_id)


@pytest.mark.slow
def test_pause_mid_call_commits_its_result_and_frees_the_worker(start, spawn_worker):
    # The worker learns of the pause at a heartbeat while its call runs; the call (replay-safe,
    # which a stop would abandon) finishes, its result is committed, nothing new starts, and
    # the worker lets the run go: no lease, and an --until-idle worker exits.
    run_id = start(
        tool_step(("slow", {"seconds": 1.5}), ("ledger_once", {"key": "after"})), text_step()
    )
    owner = spawn_worker(worker_id="owner")
    wait_for(lambda: _executing(run_id), what="the slow call to start")
    pause(run_id, actor="op", reason="look first")
    code, err = owner.wait(timeout=30)
    assert code == 0, err
    slow, after = calls(run_id)
    assert (slow.phase, json.loads(slow.result)) == ("completed", {"slept": 1.5})
    assert (after.phase, after.attempt) == ("requested", 0)  # nothing new started
    assert ledger(run_id) == {}
    row = run_row(run_id)
    assert (row.state, row.paused, row.lease_owner, row.lease_expires_at) == (
        "running",
        True,
        None,
        None,
    )
    assert not LateEvidence.objects.exists()
    assert_log_sound(run_id)

    resume_run(run_id, actor="op")
    code, err = spawn_worker(worker_id="after").wait(timeout=60)
    assert code == 0, err
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    assert [e["tool"] for e in ledger(run_id).values()] == ["ledger_once"]
    assert_log_sound(run_id)


def test_paused_runs_gauge(start):
    from runtime import inventory

    a = start(text_step())
    start(text_step())
    assert inventory.paused_runs() == 0
    pause(a, actor="op")
    assert inventory.paused_runs() == 1
    assert Run.objects.runnable(run_row(a).created_at).filter(id=a).count() == 0


def test_the_worker_lets_a_paused_run_go_without_waiting_for_its_heartbeat(
    start, spawn_worker, settings
):
    """A pause committed while the model answers (a 30 s answer) is noticed at once, not at
    the worker's next heartbeat (30 s here): the inference is given up and the run released
    well before either. PostgreSQL tells the worker process by NOTIFY; on SQLite the worker
    runs in this process and the commit's signal tells it."""
    import threading

    from django.db import connection

    from runtime.models import StreamCheckpoint
    from runtime.worker import Worker

    heartbeat = 30.0
    words = int(heartbeat)  # a word a second: the answer streams for the heartbeat's length
    run_id = start({"text": "word " * words, "chunks": words, "delay_ms": 1000})
    if connection.vendor == "postgresql":
        owner = spawn_worker(
            worker_id="owner", RUNTIME_HEARTBEAT_SECONDS=str(heartbeat), RUNTIME_LEASE_SECONDS="90"
        )
        stop = None
    else:
        settings.RUNTIME_HEARTBEAT_SECONDS = heartbeat
        settings.RUNTIME_LEASE_SECONDS = 90
        inline = Worker(worker_id="owner")
        serving = threading.Thread(target=inline.run)
        serving.start()
        stop = inline
    try:
        streaming = StreamCheckpoint.objects.filter(run_id=run_id)
        wait_for(streaming.exists, timeout=60, what="the model's answer to stream")
        pause(run_id, actor="op")
        wait_for(
            lambda: run_row(run_id).lease_owner is None,
            timeout=heartbeat / 3,
            what="the worker to let the paused run go before its heartbeat",
        )
    finally:
        if stop is not None:
            stop.stop()
            serving.join(timeout=60)
    if stop is None:
        code, err = owner.wait(timeout=60)
        assert code == 0, err
    row = run_row(run_id)
    assert (row.state, row.paused, row.step) == ("running", True, 0)  # nothing committed
    assert_log_sound(run_id)
