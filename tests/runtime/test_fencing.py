"""Effects are fenced like commits; leases follow one clock; a lost or cancelled call frees
its worker; kills that are not the run's fault never poison it; broken model output never
enters the history sent back to the provider (issue: "truth under stress", items 2, 7, 10,
11, 12). Real worker subprocesses, really stopped and killed.
"""

from __future__ import annotations

import json
import signal
import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from runtime import operations
from runtime.db import db_now
from runtime.demo.models import LedgerEffect
from runtime.documents import run_document
from runtime.models import LateEvidence, MessageRecord, Run
from runtime.worker import claim
from tests.runtime.support import (
    applied,
    assert_log_sound,
    calls,
    run_row,
    text_step,
    tool_step,
    wait_for,
)
from tests.subprocesses import subprocess_database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="needs PostgreSQL's row locks and clock"
)


def _phase(run_id: str, index: int = 0) -> tuple[str, int] | None:
    rows = calls(run_id)
    return (rows[index].phase, rows[index].attempt) if len(rows) > index else None


@postgres_only
def test_a_paused_worker_cannot_apply_an_effect_beside_its_successor(start, spawn_worker):
    """Worker A is stopped (SIGSTOP) past its lease while its ledger_reconnect effect waits on
    a slow downstream (a table lock); worker B takes the run over. When the downstream answers
    and A continues, A's effect is refused by its fence (the claim is B's now), B's lookup
    finds nothing and its attempt 2 applies: one effect, never two."""
    run_id = start(tool_step(("ledger_reconnect", {"key": "k"})), text_step())
    table = LedgerEffect._meta.db_table
    with psycopg.connect(subprocess_database_url()) as downstream:
        downstream.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        a = spawn_worker(worker_id="a", until_idle=False)
        wait_for(lambda: _phase(run_id) == ("executing", 1), what="A's Executing commit")
        wait_for(lambda: _waiting_on_lock(), what="A's effect to wait on the downstream")
        a.signal(signal.SIGSTOP)
        try:
            b = spawn_worker(worker_id="b", until_idle=False)
            # B's start (a new process) and its wait for A's lease: slow on a loaded machine.
            wait_for(lambda: run_row(run_id).lease_owner == "b", timeout=60, what="B's takeover")
        finally:
            downstream.rollback()  # the downstream answers
            a.signal(signal.SIGCONT)
    wait_for(lambda: run_row(run_id).state == "ended", what="the run to end")
    for worker in (a, b):
        worker.signal(signal.SIGTERM)
        assert worker.wait(20)[0] == 0
    (call,) = calls(run_id)
    assert (call.phase, call.attempt, applied(call)) == ("completed", 2, 1)
    # A learnt it lost the run from its effect's fence, or first from its heartbeat (a thread
    # of its own, which may beat before the effect's statement gets its locks): either way
    # the effect was refused (applied once, by B's attempt 2).
    assert "fenced" in a.stderr or "lease lost" in a.stderr
    assert_log_sound(run_id)


def _waiting_on_lock() -> bool:
    with psycopg.connect(subprocess_database_url(), autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%%INSERT INTO%%ledgereffect%%'"
        ).fetchone()
    return bool(row and row[0])


@postgres_only
def test_a_fast_clock_does_not_take_over_a_live_lease(start, monkeypatch):
    """Leases are stamped and judged on the database's clock: a worker whose own clock runs
    12 s ahead (past the 1 s lease) finds nothing to claim while the owner's lease is live."""
    start(text_step())
    owner = claim("owner")
    assert owner is not None
    ahead = timezone.now() + timedelta(seconds=12)
    monkeypatch.setattr(timezone, "now", lambda: ahead)
    assert claim("fast-clock") is None
    assert Run.objects.get(id=owner.run_id).lease_owner == "owner"


def test_a_cancelled_call_does_not_hold_the_next_runs_tool(start, spawn_worker):
    """One worker, one loop: a run in slow(30) is cancelled; the next run's ledger call runs
    at once, not after the abandoned call returns (its result is kept as late evidence)."""
    worker = spawn_worker(worker_id="one", until_idle=False)
    slow = start(tool_step(("slow", {"seconds": 30})), text_step())
    wait_for(lambda: _phase(slow) == ("executing", 1), what="the slow call to start")
    operations.cancel(slow, actor="operator")
    quick = start(tool_step(("ledger_replay", {"key": "k"})), text_step())
    started = time.monotonic()
    wait_for(lambda: run_row(quick).state == "ended", timeout=15, what="the next run to end")
    assert time.monotonic() - started < 15  # far below the 30 s the abandoned call takes
    (call,) = calls(quick)
    assert (call.phase, applied(call)) == ("completed", 1)
    assert run_row(slow).end_cause == "cancelled"
    worker.signal(signal.SIGTERM)
    assert worker.wait(20)[0] == 0


def test_workers_killed_mid_step_do_not_poison_a_healthy_run(start, spawn_worker, worker):
    """Claims lost with their worker are not the run's fault: four workers SIGKILLed while
    the same inference streams (no commit between them) leave a run that still finishes."""
    run_id = start({"text": "a long answer " * 40, "chunks": 40, "delay_ms": 50})
    for n in range(4):
        victim = spawn_worker(worker_id=f"victim-{n}", until_idle=False)
        wait_for(lambda n=n: run_row(run_id).claims == n + 1, what=f"claim {n + 1}")
        victim.signal(signal.SIGKILL)
        victim.wait(20)
    code, err = worker(worker_id="survivor")
    assert code == 0, err
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural"), run.error
    assert_log_sound(run_id)


def test_unparseable_arguments_never_enter_the_history(start, worker):
    """Truncated JSON from the model: the call gets an error result, the history keeps a
    valid ``{}`` (the raw text stays in the message's meta and the call), so the next request
    is valid for a provider that validates history."""
    broken = '{"key": "a", "n'
    run_id = start({"tool_calls": [{"name": "ledger_replay", "arguments": broken}]}, text_step())
    assert worker()[0] == 0
    (call,) = calls(run_id)
    assert (call.phase, call.is_error, call.arguments_text) == ("completed", True, broken)
    first, second = MessageRecord.objects.filter(run_id=run_id, role="assistant").order_by("seq")
    (block,) = first.tool_calls
    assert block["arguments"] == "{}"
    assert first.meta["raw_arguments"] == {block["id"]: broken}
    assert json.loads(block["arguments"]) == {}
    assert run_row(run_id).end_cause == "natural"
    assert not LedgerEffect.objects.exists()
    assert second.seq > first.seq
    assert_log_sound(run_id)


def test_a_superseded_attempts_late_result_is_shown_on_its_call(start, spawn_worker, worker):
    """Worker A is stopped past its lease inside a replay-safe call; B replays it and ends the
    run; when A continues, its result of attempt 1 is kept and shown on the call (never
    published), not flagged (a replay-safe effect may repeat by policy)."""
    run_id = start(tool_step(("slow", {"seconds": 1.5})), text_step())
    a = spawn_worker(worker_id="a", until_idle=False)
    wait_for(lambda: _phase(run_id) == ("executing", 1), what="A's attempt to start")
    a.signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: Run.objects.filter(id=run_id, lease_expires_at__lt=db_now()).exists(),
            what="A's lease to expire",
        )
        code, err = worker(worker_id="b")
        assert code == 0, err
    finally:
        a.signal(signal.SIGCONT)
    wait_for(
        lambda: LateEvidence.objects.filter(call__run_id=run_id).exists(),
        what="A's late result",
    )
    a.signal(signal.SIGTERM)
    assert a.wait(20)[0] == 0
    (call,) = run_document(run_id)["batches"][0]["calls"]
    assert (call["phase"], call["attempt"]) == ("completed", 2)
    assert [(r["attempt"], r["worker"]) for r in call["late_results"]] == [(1, "a")]
    assert call["possible_duplicate"] is False
    tools = MessageRecord.objects.filter(run_id=run_id, role="tool")
    assert [m.content for m in tools] == [call["result"]]  # only the committed result
    assert_log_sound(run_id)
