"""Staged plugin state: committed with its boundary's commit, never earlier; folded; shown in
the run document; checked by the log checker; lost (only) when a crash comes first."""

from __future__ import annotations

import pytest

from runtime import fsck
from runtime.documents import run_document
from runtime.domain.events import (
    BatchFinalized,
    BatchOpened,
    CallCompleted,
    StateStaged,
    StepCommitted,
)
from runtime.models import ThreadCommit
from tests.runtime.support import assert_log_sound, drafts, run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)

AGENTS = "runtime.demo.agent.demo,tests.runtime.staging_agent.counting"


@pytest.fixture
def counting(settings):
    settings.RUNTIME_AGENTS = AGENTS.split(",")


def staged_by_commit(run_id: str) -> list[tuple[tuple[str, ...], dict]]:
    """For each commit that staged state: the kinds of its other events, and the value."""
    found = []
    for _, draft in drafts(run_row(run_id).thread_id):
        for event in draft.events:
            if isinstance(event, StateStaged):
                others = tuple(
                    type(e).__name__ for e in draft.events if not isinstance(e, StateStaged)
                )
                found.append((others, event.value))
    return found


def test_state_rides_the_boundary_commits(counting, start, work_inline):
    """AfterTool's state rides the commit of the call's result (merged with the batch's
    publication when it is the last call: README, "Commits that merge")."""
    run_id = start(tool_step(("ledger_once", {"key": "k"})), text_step(), agent="counting")
    work_inline()
    steps = (StepCommitted.__name__, BatchOpened.__name__)
    assert staged_by_commit(run_id) == [
        (steps, {"steps": 1, "tools": [], "last_finish": "tool_calls"}),
        (
            (CallCompleted.__name__, BatchFinalized.__name__),
            {"steps": 1, "tools": ["ledger_once"], "last_finish": "tool_calls"},
        ),
        ((StepCommitted.__name__,), {"steps": 2, "tools": ["ledger_once"], "last_finish": "stop"}),
    ]
    document = run_document(run_id)
    assert document["plugin_state"] == {
        "counter": {"steps": 2, "tools": ["ledger_once"], "last_finish": "stop"}
    }
    assert_log_sound(run_id)


def test_fsck_finds_state_its_model_refuses(counting, start, work_inline):
    run_id = start(text_step(), agent="counting")
    work_inline()
    assert fsck.check_thread(run_row(run_id).thread_id) == []
    thread_id = run_row(run_id).thread_id
    commit = ThreadCommit.objects.get(thread_id=thread_id, seq=2)
    commit.events[-1]["value"]["steps"] = -1  # a log written by a plugin of another version
    ThreadCommit.objects.filter(pk=commit.pk).update(events=commit.events)
    problems = [str(v) for v in fsck.check_thread(thread_id)]
    assert any("snapshot differs" in p for p in problems), problems
    assert any("does not validate" in p for p in problems), problems


@pytest.mark.slow
def test_a_crash_before_the_commit_loses_only_the_staged_value(counting, start, worker):
    run_id = start(text_step(), agent="counting")
    code, err = worker(crash_at="inference_streaming", RUNTIME_AGENTS=AGENTS)
    assert code == 137, err
    assert staged_by_commit(run_id) == []  # staged by StepStart, never committed
    assert worker(RUNTIME_AGENTS=AGENTS)[0] == 0
    assert run_document(run_id)["plugin_state"] == {
        "counter": {"steps": 1, "tools": [], "last_finish": "stop"}
    }
    assert_log_sound(run_id)
