"""Pause at every crash point of the crash matrix, with real worker processes really killed.

Each crasher dies at its point (exit 137, its lease left to expire); an operator pauses the
run; a fresh worker then finds nothing to do: the run stays exactly at the frontier the
crasher's commits left, no effect applies beyond what the crash left, and the log is sound
(``runtime_fsck``'s check). After the resume a new worker process continues it under each
call's pinned policy (the crash matrix's own outcomes) and the run ends ``natural``.
"""

from __future__ import annotations

import pytest

from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.models import Ticket
from runtime.operations import pause, resume, resume_run
from tests.runtime.support import (
    POLICY_TOOLS,
    applied,
    assert_log_sound,
    calls,
    commit_count,
    ledger,
    run_row,
    text_step,
    tool_step,
    wait_for,
)
from tests.runtime.test_crash_matrix import CLEAN_POINTS, MATRIX, _frontier_after_crash, _outcome

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _facts(run_id: str) -> tuple:
    """What the committed log says of the run and its calls, and what the ledger holds."""
    run = run_row(run_id)
    return (
        run.state,
        run.step,
        run.version,
        [(c.phase, c.attempt, c.batch_finalized, applied(c)) for c in calls(run_id)],
        sorted(ledger(run_id)),
    )


@pytest.mark.parametrize("point", [*CLEAN_POINTS, "executing_committed", "effect_applied"])
def test_pause_after_crash_then_resume(start, crashers, worker, point):
    waiting = crashers(len(POLICY_TOOLS), point)
    runs = {
        policy: start(tool_step((tool, {"key": "k"})), text_step())
        for policy, tool in POLICY_TOOLS.items()
    }
    for crasher in waiting:
        code, err = crasher.wait()
        assert code == 137, err
    for run_id in runs.values():
        _frontier_after_crash(point, run_id)
        pause(run_id, actor="op", reason=f"crashed at {point}")
    left = {run_id: _facts(run_id) for run_id in runs.values()}

    # A worker restarted meanwhile claims none of them (its --until-idle exits at once).
    code, err = worker(worker_id="idle")
    assert code == 0, err
    for run_id in runs.values():
        assert _facts(run_id) == left[run_id]  # paused exactly where the commits say
        row = run_row(run_id)
        assert row.paused and row.lease_owner in (None, *(f"crasher-{i}" for i in range(3)))
        assert row.claims <= 1  # never claimed since the crash
        assert_log_sound(run_id)

    for run_id in runs.values():
        resume_run(run_id, actor="op")
    code, err = worker(worker_id="recoverer")
    assert code == 0, err
    outcomes = {policy: _outcome(run_id, point) for policy, run_id in runs.items()}
    assert outcomes == {policy: MATRIX[point, policy] for policy in runs}


def test_pause_after_a_crash_at_the_ticket(start, worker):
    """ticket_committed: the crasher dies with the run Awaiting; paused, its ticket is still
    answered (committed), the run waits for the resume, then ends natural, effect once."""
    run_id = start(tool_step(("ledger_approval", {"key": "k"})), text_step())
    code, err = worker(crash_at="ticket_committed")
    assert code == 137, err
    pause(run_id, actor="op")
    ticket = Ticket.objects.get(run_id=run_id)
    resume(
        run_id,
        ResumeCommand(ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
    )
    seen = commit_count(run_row(run_id).thread_id)
    assert worker(worker_id="idle")[0] == 0
    assert commit_count(run_row(run_id).thread_id) == seen and ledger(run_id) == {}
    assert_log_sound(run_id)
    resume_run(run_id, actor="op")
    assert worker(worker_id="recoverer")[0] == 0
    (call,) = calls(run_id)
    assert (call.phase, call.attempt, applied(call)) == ("completed", 1, 1)
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert_log_sound(run_id)


@pytest.mark.parametrize(("point", "slow_attempts"), [("effect_applied", 2), ("call_completed", 1)])
def test_pause_lands_before_the_crash(start, spawn_worker, worker, point, slow_attempts):
    """The pause reaches a live worker mid-call (a slow replay-safe call, then a ledger call);
    the worker dies at the point (after the slow call's effect, or after committing its result
    on the paused run). A restarted worker leaves the paused run alone; after the resume a new
    worker finishes it natural: the slow call replayed only if its result was never committed,
    the ledger call applied once."""
    run_id = start(
        tool_step(("slow", {"seconds": 1.0}), ("ledger_once", {"key": "k"})), text_step()
    )
    owner = spawn_worker(worker_id="owner", crash_at=point)
    wait_for(lambda: [c.phase for c in calls(run_id)][:1] == ["executing"], what="slow to run")
    pause(run_id, actor="op")
    code, err = owner.wait(timeout=30)
    assert code == 137, err
    slow, once = calls(run_id)
    expected = "executing" if point == "effect_applied" else "completed"
    assert (slow.phase, once.phase, once.attempt) == (expected, "requested", 0)
    left = _facts(run_id)
    assert worker(worker_id="idle")[0] == 0
    assert _facts(run_id) == left and ledger(run_id) == {}
    assert_log_sound(run_id)
    resume_run(run_id, actor="op")
    assert worker(worker_id="recoverer")[0] == 0
    slow, once = calls(run_id)
    assert (slow.phase, slow.attempt) == ("completed", slow_attempts)
    assert (once.phase, once.attempt, applied(once)) == ("completed", 1, 1)
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert_log_sound(run_id)
