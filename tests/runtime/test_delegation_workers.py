"""Delegation across real worker processes: children run concurrently on any worker, and a
cancelled parent ends its running children."""

from __future__ import annotations

import pytest

from runtime.models import MessageRecord, Run, ThreadCommit
from runtime.operations import cancel
from tests.runtime.support import (
    applied,
    assert_log_sound,
    calls,
    executing_workers,
    run_row,
    text_step,
    tool_step,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def slow_child(name: str, seconds: float) -> tuple[str, dict]:
    script = {"steps": [tool_step(("slow", {"seconds": seconds})), text_step(name)]}
    return ("delegate", {"input": name, "script": script})


def interval(run_id: str) -> tuple:
    """The times of the run's first and last commits."""
    times = ThreadCommit.objects.filter(run_id=run_id).order_by("seq")
    first, last = times.first(), times.last()
    assert first is not None and last is not None
    return first.created_at, last.created_at


def executing_children(run_id: str) -> list[str]:
    """The children of the run whose tool call is Executing now."""
    return [
        kid.id
        for kid in Run.objects.filter(parent_run_id=run_id)
        if any(c.phase == "executing" for c in calls(kid.id))
    ]


def test_two_children_overlap_and_the_ordinary_call_runs_once(start, spawn_worker):
    run_id = start(
        tool_step(slow_child("alpha", 1.5), ("ledger_once", {"key": "k"}), slow_child("beta", 1.5)),
        text_step("done"),
    )
    workers = [spawn_worker(worker_id=f"w{i}") for i in range(2)]
    for process in workers:
        code, err = process.wait(90)
        assert code == 0, err
    parent = run_row(run_id)
    assert (parent.state, parent.end_cause, parent.step) == ("ended", "natural", 2)
    alpha, beta = Run.objects.filter(parent_run_id=run_id).order_by("created_at")
    (a_start, a_end), (b_start, b_end) = interval(alpha.id), interval(beta.id)
    assert a_start < b_end and b_start < a_end, "the children's commit intervals interleave"
    first, ordinary, second = calls(run_id)
    assert applied(ordinary) == 1 and len(executing_workers(run_id)[ordinary.id]) == 1
    assert (first.result, second.result) == ("alpha", "beta")
    # The next inference saw the three results in call order, all before it.
    step_two = MessageRecord.objects.get(run_id=run_id, role="assistant", content="done")
    published = MessageRecord.objects.filter(run_id=run_id, role="tool").order_by("seq", "idx")
    assert [m.tool_call_id for m in published] == ["call_1_0", "call_1_1", "call_1_2"]
    assert all(m.seq < step_two.seq for m in published)
    for run in (run_id, alpha.id, beta.id):
        assert_log_sound(run)


def test_cancelling_a_parent_ends_its_running_children(start, spawn_worker):
    run_id = start(tool_step(slow_child("a", 60), slow_child("b", 60)), text_step())
    workers = [spawn_worker(worker_id=f"w{i}", until_idle=False) for i in range(2)]
    kids = wait_for(
        lambda: len(found := executing_children(run_id)) == 2 and found,
        timeout=60,
        what="both children executing their slow call",
    )
    cancel(run_id, actor="alice", reason="enough")
    for process in workers:
        process.signal()
        assert process.wait()[0] == 0
    for each in (run_id, *kids):
        row = run_row(each)
        assert (row.state, row.end_cause) == ("ended", "cancelled")
        (ended,) = ThreadCommit.objects.filter(run_id=each, disposition__state="ended")
        assert ended.actor == ("alice" if each == run_id else f"parent:{run_id}")
        assert_log_sound(each)
