"""Every crash point against every recovery policy, with real worker processes really killed.

A worker started with RUNTIME_CRASH_AT exits with 137 at the named commit point (as if killed:
no cleanup, its lease left to expire); a second worker takes the run over from the committed
frontier. The ledger counts each effect per operation id, so "applied twice" is visible:
mark-indeterminate tools apply at most once (Indeterminate when the crash came after their
Executing commit), reconnect tools exactly once, replay tools hold one row per operation id
with the repeated application counted. No call is ever seen Requested again once Executing.
"""

from __future__ import annotations

import json

import pytest

from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.models import CommandRecord, MessageRecord, Ticket
from runtime.operations import resume
from tests.runtime.support import (
    POLICY_TOOLS,
    applied,
    assert_log_sound,
    calls,
    commit_count,
    executing_workers,
    ledger,
    run_row,
    text_step,
    tool_step,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# Crash points where no effect can be in flight: the takeover finishes the call normally.
CLEAN_POINTS = ("inference_streaming", "batch_committed", "call_completed", "batch_finalized")
# (point, policy) -> (final phase, attempts committed, ledger applications)
IN_FLIGHT = {
    ("executing_committed", "indeterminate"): ("indeterminate", 1, 0),
    ("executing_committed", "reconnect"): ("completed", 2, 1),
    ("executing_committed", "replay"): ("completed", 2, 1),
    ("effect_applied", "indeterminate"): ("indeterminate", 1, 1),
    ("effect_applied", "reconnect"): ("completed", 1, 1),
    ("effect_applied", "replay"): ("completed", 2, 2),
}
MATRIX = {(p, policy): ("completed", 1, 1) for p in CLEAN_POINTS for policy in POLICY_TOOLS}
MATRIX.update(IN_FLIGHT)


def _frontier_after_crash(point: str, run_id: str) -> None:
    """What the crashed worker left committed: exactly the commits before its crash point."""
    run = run_row(run_id)
    rows = calls(run_id)
    assert run.state == "running"
    if point == "inference_streaming":
        assert (run.step, rows, run.claims) == (0, [], 1)
        return
    (call,) = rows
    phase, attempt, count, finalized = {
        "batch_committed": ("requested", 0, 0, False),
        "executing_committed": ("executing", 1, 0, False),
        "effect_applied": ("executing", 1, 1, False),
        "call_completed": ("completed", 1, 1, True),  # committed with the publication
        "batch_finalized": ("completed", 1, 1, True),
    }[point]
    assert (call.phase, call.attempt, applied(call), call.batch_finalized) == (
        phase,
        attempt,
        count,
        finalized,
    )


def _outcome(run_id: str, point: str) -> tuple[str, int, int]:
    """What the takeover made of the run's one call, in the terms of MATRIX, plus checks."""
    run = run_row(run_id)
    assert (run.state, run.end_cause, run.step) == ("ended", "natural", 2)
    (call,) = calls(run_id)
    workers = [w for _, w in executing_workers(run_id)[call.id]]
    if point in ("inference_streaming", "batch_committed"):
        assert workers == ["recoverer"]
    else:  # the recovering worker re-attempts only under a policy that may replay
        assert workers[0].startswith("crasher") and workers[1:] == ["recoverer"] * (
            call.attempt - 1
        )
    assert len(ledger(run_id)) == (1 if applied(call) else 0)  # one row per operation id
    assert call.result is not None  # the call settled
    if call.phase == "indeterminate":
        assert call.effect_may_have_started and call.is_error
        assert call.result.startswith("Outcome unknown")
        assert call.operation_id in call.result
    else:
        assert not call.is_error
        assert json.loads(call.result) == {"recorded": "k", "operation_id": call.operation_id}
    # The model saw exactly that result, published once, before its final answer.
    tool_messages = list(MessageRecord.objects.filter(run_id=run_id, role="tool"))
    assert [(m.tool_call_id, m.content) for m in tool_messages] == [("call_1_0", call.result)]
    assert_log_sound(run_id)
    return (call.phase, call.attempt, applied(call))


@pytest.mark.parametrize("point", [*CLEAN_POINTS, "executing_committed", "effect_applied"])
def test_takeover_after_crash(start, crashers, worker, point):
    """One run per policy, each with one call; one crasher process per run (each claims one
    run and dies at its first occurrence of the point), then one recovering worker."""
    waiting = crashers(len(POLICY_TOOLS), point)
    runs = {
        policy: start(tool_step((tool, {"key": "k"})), text_step())
        for policy, tool in POLICY_TOOLS.items()
    }
    for crasher in waiting:
        code, err = crasher.wait()
        assert code == 137, err
        assert f"RUNTIME_CRASH_AT: crashing at {point}:1" in err
    for run_id in runs.values():
        _frontier_after_crash(point, run_id)

    code, err = worker(worker_id="recoverer")
    assert code == 0, err

    outcomes = {policy: _outcome(run_id, point) for policy, run_id in runs.items()}
    assert outcomes == {policy: MATRIX[point, policy] for policy in runs}


@pytest.mark.parametrize(
    ("point", "expected"),
    [
        ("ticket_committed", ("completed", 1, 1)),
        ("executing_committed", ("indeterminate", 1, 0)),
        ("effect_applied", ("indeterminate", 1, 1)),
        ("call_completed", ("completed", 1, 1)),
    ],
)
def test_approval_gated_call_after_crash(start, worker, point, expected):
    """ledger_approval (ask, then mark-indeterminate): the crash lands before or after the
    operator's approval; the approval is asked once and the effect applies at most once."""
    run_id = start(tool_step(("ledger_approval", {"key": "k"})), text_step())
    before_approval = point == "ticket_committed"
    code, err = worker(crash_at=point if before_approval else None)
    assert code == (137 if before_approval else 0), err
    ticket = Ticket.objects.get(run_id=run_id)
    assert (run_row(run_id).state, ticket.state) == ("awaiting", "open")
    # An Awaiting run needs no worker: one started now finds nothing to do.
    assert worker()[0] == 0
    assert (run_row(run_id).state, Ticket.objects.get(run_id=run_id).state) == ("awaiting", "open")
    resume(
        run_id,
        ResumeCommand(ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
    )
    if not before_approval:
        code, err = worker(crash_at=point, worker_id="crasher")
        assert code == 137, err
    code, err = worker(worker_id="recoverer")
    assert code == 0, err

    phase, attempts, count = expected
    (call,) = calls(run_id)
    assert (call.phase, call.attempt, applied(call)) == (phase, attempts, count)
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert Ticket.objects.filter(run_id=run_id).count() == 1  # never asked again
    assert_log_sound(run_id)


@pytest.mark.parametrize("kind", ["approval", "input"])
def test_crash_in_the_resuming_process(start, worker, command, kind):
    """resume_committed fires in ``manage.py runtime_resume`` after its commit: the resume
    stands, its idempotency key answers a repeat, and the run finishes once."""
    if kind == "approval":
        step = tool_step(("ledger_approval", {"key": "k"}))
        answer = ["--approve"]
    else:
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        step = tool_step(("ask_input", {"question": "how many?", "answer_schema": schema}))
        answer = ["--input", '{"n": 3}']
    run_id = start(step, text_step())
    assert worker()[0] == 0
    ticket = Ticket.objects.get(run_id=run_id)
    thread_id = run_row(run_id).thread_id
    args = ["runtime_resume", run_id, "--ticket", ticket.id, *answer, "--idempotency-key", "k1"]

    crashed = command(*args, RUNTIME_CRASH_AT="resume_committed")
    assert crashed.returncode == 137, crashed.stderr
    assert crashed.stdout == ""  # it died before it could say anything
    ticket.refresh_from_db()
    assert ticket.state == "consumed"
    seen = commit_count(thread_id)

    repeated = command(*args)
    assert repeated.returncode == 0, repeated.stderr
    assert repeated.stdout.startswith(f"run {run_id}: running (version {seen})")
    assert CommandRecord.objects.filter(run_id=run_id).count() == 1
    # The same answer without the key, by the same actor: answered as committed (issue 21: a
    # committed command is never a failure), nothing written.
    again = command(*args[:-2])
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"run {run_id}: running (version {seen})")
    assert commit_count(thread_id) == seen

    assert worker()[0] == 0
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    (call,) = calls(run_id)
    if kind == "approval":
        assert (call.phase, call.attempt, applied(call)) == ("completed", 1, 1)
    else:
        assert (call.phase, call.attempt, json.loads(call.result)) == ("completed", 0, {"n": 3})
        assert ledger(run_id) == {}
    assert_log_sound(run_id)


def test_replay_budget_spent_seals_indeterminate(start, worker):
    """A replay tool whose every attempt is cut off after its effect: each application is
    counted on the one ledger row, and after the pinned budget (3) the call is Indeterminate."""
    run_id = start(tool_step(("ledger_replay", {"key": "k"})), text_step())
    for attempt in (1, 2, 3):
        code, err = worker(crash_at="effect_applied", worker_id=f"w{attempt}")
        assert code == 137, err
    code, err = worker(worker_id="last")
    assert code == 0, err
    (call,) = calls(run_id)
    assert (call.phase, call.attempt, applied(call)) == ("indeterminate", 3, 3)
    assert call.effect_may_have_started and "no result after 3 attempts" in call.result
    assert [w for _, w in executing_workers(run_id)[call.id]] == ["w1", "w2", "w3"]
    assert len(ledger(run_id)) == 1
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert_log_sound(run_id)
