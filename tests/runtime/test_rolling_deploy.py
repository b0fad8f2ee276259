"""A rolling deploy with runs in flight, with real worker processes (issue 34, items 2 and 4).

Version 1 of the agent ``deploy`` has ``refund`` (asks for approval, a ``once`` effect);
version 2 is the same agent with ``refund`` removed (tests/runtime/deploy_agents). While a
version-1 worker and a version-2 worker run side by side, every run of version 1 is driven
by the version-1 worker and every run of version 2 by the version-2 worker. Once the
version-1 worker has stopped, the version-2 worker takes its runs over (RUNTIME_AGENT_VERSION
_ROUTING's default, drain): an approved call of the removed tool is completed with an error
result before any effect, and the run goes on to its end. No traceback, fsck clean.

The second test leaves runs of version 1 in every waiting state (an input, a timer, a child,
and a batch with a call Completed, one awaiting approval and one Requested) before the
version-1 worker leaves; the version-2 worker finishes each as the docs say.
"""

from __future__ import annotations

import signal

import pytest

from runtime import fsck, operations, timers
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.models import MessageRecord, Run, ThreadCommit, Ticket, WorkerProcess
from tests.runtime.support import calls, ledger, run_row, text_step, tool_step, wait_for
from tests.runtime.test_deploy_changes import _approve

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BASE = "runtime.demo.agent.demo,runtime.demo.agent.assistant"
# Heartbeats every second, judged overdue after three: a loaded machine never makes the
# live version-1 worker look gone while both run (its runs would then drain early).
ENV = {"RUNTIME_LEASE_SECONDS": "20", "RUNTIME_HEARTBEAT_SECONDS": "1"}


def _worker(spawn_worker, worker_id: str, version: str):
    spawned = spawn_worker(
        until_idle=False,
        worker_id=worker_id,
        max_inflight=10,
        RUNTIME_AGENTS=f"{BASE},tests.runtime.deploy_agents.{version}",
        **ENV,
    )
    wait_for(
        lambda: WorkerProcess.objects.filter(id=worker_id, agents__has_key="deploy").exists(),
        timeout=120,
        what=f"worker {worker_id} to register",
    )
    return spawned


def _settled(*run_ids: str, state: str = "ended") -> bool:
    return Run.objects.filter(id__in=run_ids, state=state, lease_owner__isnull=True).count() == len(
        run_ids
    )


def _drivers(run_id: str) -> set[tuple[str, str]]:
    """(worker id, agent version) of every commit a worker wrote for ``run_id``."""
    rows = ThreadCommit.objects.filter(run_id=run_id, actor__startswith="worker:")
    return {
        (actor.removeprefix("worker:"), v)
        for actor, v in rows.values_list("actor", "agent_version")
    }


def _tool_results(run_id: str) -> list[str]:
    rows = MessageRecord.objects.filter(run_id=run_id, role="tool").order_by("seq", "idx")
    return list(rows.values_list("content", flat=True))


def test_a_rolling_deploy_drives_each_run_with_code_that_can_drive_it(deploy, start, spawn_worker):
    one = deploy("v1")

    def refund(order: str) -> str:
        return start(tool_step(("refund", {"order": order})), text_step("told"), agent="deploy")

    early_plain, early_refund = start(text_step("early"), agent="deploy"), refund("o-1")
    old = _worker(spawn_worker, "old", "v1")
    wait_for(lambda: _settled(early_plain) and _settled(early_refund, state="awaiting"))

    new = _worker(spawn_worker, "new", "removed")
    # Both live: version 1's runs (new and waiting ones) go to the old worker alone.
    mixed_plain, late_refund = start(text_step("mixed"), agent="deploy"), refund("o-2")
    _approve(early_refund)
    two = deploy("removed")  # the API now starts runs with version 2
    fresh = start(text_step("fresh"), agent="deploy")
    wait_for(
        lambda: (
            _settled(early_refund, mixed_plain, fresh) and _settled(late_refund, state="awaiting")
        )
    )
    for run_id in (early_plain, early_refund, mixed_plain, late_refund):
        assert _drivers(run_id) == {("old", one)}, run_id
    assert _drivers(fresh) == {("new", two)}
    assert _tool_results(early_refund) == ["refunded o-1"]

    old.signal(signal.SIGTERM)  # the last version-1 worker leaves
    assert old.wait(60)[0] == 0
    _approve(late_refund)  # its tool is gone from the code that drives it now
    wait_for(lambda: _settled(late_refund))
    assert _drivers(late_refund) == {("old", one), ("new", two)}
    [result] = _tool_results(late_refund)
    assert result.startswith("Not run:") and "refund" in result

    runs = Run.objects.filter(agent="deploy")
    assert set(runs.values_list("end_cause", flat=True)) == {"natural"}
    assert fsck.check() == []
    new.signal(signal.SIGTERM)
    assert new.wait(60)[0] == 0
    for worker in (old, new):
        assert "Traceback" not in worker.stderr, worker.stderr


ASK = (
    "ask_input",
    {
        "question": "How many?",
        "answer_schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
    },
)


def _answer(run_id: str) -> None:
    ticket = Ticket.objects.get(run_id=run_id, kind="input", state="open")
    command = ResumeCommand(
        ticket_id=ticket.id, kind=TicketKind.INPUT, decision=Decision.INPUT, input={"n": 3}
    )
    operations.resume(run_id, command, actor="operator")


def test_runs_waiting_in_every_state_go_on_under_the_new_version(deploy, start, spawn_worker):
    one = deploy("v1")
    child_script = {"steps": [tool_step(ASK), text_step("child done")]}
    batch = (
        ("ledger_once", {"key": "a"}),
        ("refund", {"order": "o-3"}),
        ("ledger_replay", {"key": "c"}),
    )
    runs = {
        "input": start(tool_step(ASK), text_step("answered"), agent="deploy"),
        "timer": start(tool_step(("wait", {"seconds": 3600})), text_step("woke"), agent="deploy"),
        "child": start(
            tool_step(("delegate", {"input": "find it", "script": child_script})),
            text_step("parent done"),
            agent="deploy",
        ),
        "batch": start(tool_step(*batch), text_step("batched"), agent="deploy"),
    }
    old = _worker(spawn_worker, "old", "v1")
    wait_for(lambda: _settled(*runs.values(), state="awaiting"), timeout=60)
    child = wait_for(lambda: Run.objects.filter(parent_run_id=runs["child"]).first())
    wait_for(lambda: _settled(child.id, state="awaiting"))
    assert [c.phase for c in calls(runs["batch"])] == ["completed", "awaiting", "requested"]

    new = _worker(spawn_worker, "new", "removed")
    two = deploy("removed")
    old.signal(signal.SIGTERM)
    assert old.wait(60)[0] == 0
    _answer(runs["input"])
    timers.fire(runs["timer"], Ticket.objects.get(run_id=runs["timer"], state="open").id)
    _answer(child.id)
    _approve(runs["batch"])
    wait_for(lambda: _settled(child.id, *runs.values()), timeout=60)

    ended = Run.objects.filter(id__in=[child.id, *runs.values()])
    assert set(ended.values_list("end_cause", flat=True)) == {"natural"}
    for run_id in runs.values():
        assert ("new", two) in _drivers(run_id), run_id  # version 2 finished each
        assert ("old", one) in _drivers(run_id), run_id
    completed, gone, replayed = _tool_results(runs["batch"])
    assert gone.startswith("Not run: the tool 'refund' is not in agent 'deploy'")
    effects = sorted((e["key"], e["applied"]) for e in ledger(runs["batch"]).values())
    assert effects == [("a", 1), ("c", 1)]  # each applied once; refund never ran
    assert fsck.check() == []
    new.signal(signal.SIGTERM)
    assert new.wait(60)[0] == 0
    for worker in (old, new):
        assert "Traceback" not in worker.stderr, worker.stderr


@pytest.mark.parametrize(
    ("point", "phase"),
    [
        ("executing_committed", "indeterminate"),  # the effect may have started: sealed
        ("effect_applied", "indeterminate"),
        ("call_completed", "completed"),  # the old code finished it; the new goes on
        ("batch_finalized", "completed"),
        ("inference_streaming", "completed"),
    ],
)
def test_a_crash_of_the_old_worker_at_each_boundary(deploy, start, worker, point, phase):
    one = deploy("v1")
    run_id = start(tool_step(("refund", {"order": "o-9"})), text_step("told"), agent="deploy")
    old = {"RUNTIME_AGENTS": f"{BASE},tests.runtime.deploy_agents.v1"}
    assert worker(worker_id="old", **old)[0] == 0  # to the approval
    _approve(run_id)
    code, err = worker(crash_at=point, worker_id="crasher", **old)
    assert code == 137, err
    two = deploy("removed")
    code, err = worker(
        worker_id="new", RUNTIME_AGENTS=f"{BASE},tests.runtime.deploy_agents.removed"
    )
    assert code == 0, err
    assert "Traceback" not in err, err

    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    [call] = calls(run_id)
    assert call.phase == phase
    if phase == "indeterminate":  # a once effect whose tool is gone: for Reconcile
        assert call.effect_may_have_started and call.result.startswith("Outcome unknown")
    else:
        assert _tool_results(run_id) == ["refunded o-9"]
    assert {("crasher", one), ("new", two)} <= _drivers(run_id)
    assert fsck.check() == []


@pytest.mark.parametrize(
    ("point", "phase"),
    [
        ("executing_committed", "indeterminate"),  # ledger_once's effect may have started
        ("effect_applied", "indeterminate"),
        ("call_completed", "completed"),
        ("batch_finalized", "completed"),
        ("inference_streaming", "completed"),
    ],
)
def test_a_crash_of_the_new_worker_at_each_boundary_of_a_run_it_took_over(
    deploy, start, worker, point, phase
):
    """The old version's workers are gone; a new one takes over a run whose approved batch
    holds a call of the removed tool and a ``once`` call, and dies at a boundary; another new
    worker finishes it: the removed tool's call is an error result, the other call is
    recovered by its pinned policy, each effect at most once."""
    one = deploy("v1")
    batch = tool_step(("refund", {"order": "o-9"}), ("ledger_once", {"key": "k"}))
    run_id = start(batch, text_step("told"), agent="deploy")
    old = {"RUNTIME_AGENTS": f"{BASE},tests.runtime.deploy_agents.v1"}
    assert worker(worker_id="old", **old)[0] == 0  # to the approval; then no v1 worker is live
    _approve(run_id)
    two = deploy("removed")
    new = {"RUNTIME_AGENTS": f"{BASE},tests.runtime.deploy_agents.removed"}
    code, err = worker(crash_at=point, worker_id="crasher", **new)
    assert code == 137, err
    code, err = worker(worker_id="new", **new)
    assert code == 0, err
    assert "Traceback" not in err, err

    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    gone, once = calls(run_id)
    assert (gone.phase, gone.result.startswith("Not run: the tool 'refund'")) == ("completed", True)
    assert once.phase == phase
    assert [e["applied"] for e in ledger(run_id).values()] in ([], [1])  # at most once
    assert _drivers(run_id) - {("old", one)} <= {("crasher", two), ("new", two)}
    assert fsck.check() == []
