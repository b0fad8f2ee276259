"""Crash points of delegation and timers, with real worker processes really killed.

Each run's batch is a delegate call (or a wait) followed by an ordinary call of each recovery
policy. A worker crashes at the point; a second worker recovers from the committed frontier.
After recovery: exactly one child per delegate call, each child's terminus delivered exactly
once, the timer fired exactly once, the ordinary call's effect applied once (every point here
lies outside its effect), results published in call order, and the log checks clean.
"""

from __future__ import annotations

import json

import pytest

from runtime.domain.events import CallResumed
from runtime.models import MessageRecord, Run
from tests.runtime.support import (
    POLICY_TOOLS,
    applied,
    assert_log_sound,
    calls,
    drafts,
    run_row,
    text_step,
    tool_step,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

DELEGATION_POINTS = ("child_started", "child_ended_before_delivery", "delivery_committed")


def resumes(run_id: str) -> list[tuple[str, str]]:
    return [
        (event.ticket_id, draft.actor)
        for _, draft in drafts(run_row(run_id).thread_id)
        for event in draft.events
        if isinstance(event, CallResumed)
    ]


def _published(run_id: str) -> list[str | None]:
    rows = MessageRecord.objects.filter(run_id=run_id, role="tool").order_by("seq", "idx")
    return [m.tool_call_id for m in rows]


@pytest.mark.parametrize("policy", sorted(POLICY_TOOLS))
@pytest.mark.parametrize("point", DELEGATION_POINTS)
def test_delegation_crash(start, worker, point, policy):
    child = {"input": "answer", "script": {"steps": [{"text": "forty-two"}]}}
    run_id = start(
        tool_step(("delegate", child), (POLICY_TOOLS[policy], {"key": "k"})), text_step()
    )
    code, err = worker(crash_at=point, worker_id="crasher")
    assert code == 137, err
    assert f"RUNTIME_CRASH_AT: crashing at {point}:1" in err
    (kid,) = Run.objects.filter(parent_run_id=run_id)
    if point == "child_ended_before_delivery":  # the child's end rolled back with its delivery
        assert kid.state == "running" and resumes(run_id) == []
    if point == "delivery_committed":
        assert kid.state == "ended" and len(resumes(run_id)) == 1

    code, err = worker(worker_id="recoverer")
    assert code == 0, err
    run = run_row(run_id)
    assert (run.state, run.end_cause, run.step) == ("ended", "natural", 2)
    (kid,) = Run.objects.filter(parent_run_id=run_id)  # one child, never a second
    assert (kid.state, kid.end_cause) == ("ended", "natural")
    delegated, ordinary = calls(run_id)
    assert (delegated.phase, delegated.result) == ("completed", "forty-two")
    assert resumes(run_id) == [(delegated.ticket_id, f"child:{kid.id}")]
    assert (ordinary.phase, ordinary.attempt, applied(ordinary)) == ("completed", 1, 1)
    assert _published(run_id) == ["call_1_0", "call_1_1"]
    assert_log_sound(run_id)
    assert_log_sound(kid.id)


@pytest.mark.parametrize("policy", sorted(POLICY_TOOLS))
def test_timer_fired_crash(start, spawn_worker, worker, policy):
    run_id = start(
        tool_step(("wait", {"seconds": 0.3}), (POLICY_TOOLS[policy], {"key": "k"})), text_step()
    )
    crasher = spawn_worker(crash_at="timer_fired", until_idle=False, worker_id="crasher")
    code, err = crasher.wait()
    assert code == 137, err
    (ticket_id, actor), *more = resumes(run_id)
    assert (actor, more, run_row(run_id).state) == ("timer", [], "running")

    code, err = worker(worker_id="recoverer")
    assert code == 0, err
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert resumes(run_id) == [(ticket_id, "timer")]
    waited, ordinary = calls(run_id)
    assert (waited.phase, waited.attempt, json.loads(waited.result)) == (
        "completed",
        2,
        {"waited": 0.3},
    )
    assert (ordinary.phase, ordinary.attempt, applied(ordinary)) == ("completed", 1, 1)
    assert _published(run_id) == ["call_1_0", "call_1_1"]
    assert_log_sound(run_id)
