"""The step loop against the scripted model: retried and fatal model errors, the step limit,
and a stale lease fenced before any effect. Driven in this process by the real Worker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.demo.models import LedgerEffect
from runtime.errors import LeaseLost
from runtime.loop import drive_inline
from runtime.models import MessageRecord, Run
from runtime.worker import claim
from tests.runtime.support import (
    applied,
    assert_log_sound,
    assistant_messages,
    calls,
    commit_count,
    run_row,
    text_step,
    tool_step,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _retryable(times: int) -> dict:
    return {"error": "retryable", "times": times}


@pytest.mark.parametrize(
    "steps",
    [
        [_retryable(2), text_step("hello")],
        [tool_step(("ledger_once", {"key": "a"})), _retryable(2), text_step("hello")],
        [_retryable(1), _retryable(1), text_step("hello")],  # counted together: 2 failures
    ],
    ids=["first step", "after a batch", "two error steps"],
)
def test_retryable_model_errors_are_retried(start, work_inline, steps):
    run_id = start(*steps)
    assert work_inline() == 1  # retried within the one claim
    run = run_row(run_id)
    assert (run.state, run.end_cause, run.error) == ("ended", "natural", None)
    assert assistant_messages(run_id)[-1].content == "hello"
    assert [applied(c) for c in calls(run_id)] == [1] * len(calls(run_id))
    assert_log_sound(run_id)


def test_retryable_errors_beyond_the_budget_fail_the_run_that_waits_for_no_outage(
    start, work_inline, settings
):
    settings.RUNTIME_MODEL_RETRIES = 1
    settings.RUNTIME_MODEL_OUTAGE_SECONDS = 0  # otherwise it waits (test_model_outage.py)
    run_id = start(_retryable(2), text_step("never"))
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "failed")
    assert run.error["retryable"] is True and run.error["provider"] == "scripted"
    assert assistant_messages(run_id) == []
    assert_log_sound(run_id)


def test_fatal_model_error_fails_the_run_with_the_error(start, work_inline):
    run_id = start(tool_step(("ledger_once", {"key": "a"})), {"error": "fatal"})
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause, run.step) == ("ended", "failed", 1)
    assert run.error == {
        "type": "model_error",
        "provider": "scripted",
        "status": None,
        "message": "scripted fatal error",
        "retryable": False,
    }
    (call,) = calls(run_id)
    assert (call.phase, call.batch_finalized, applied(call)) == ("completed", True, 1)
    assert_log_sound(run_id)


def test_step_limit_ends_the_run(start, work_inline):
    limit = 8  # the demo agent's step limit
    steps = [tool_step(("ledger_replay", {"key": f"k{i}"})) for i in range(limit + 2)]
    run_id = start(*steps)
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause, run.step) == ("ended", "step_limit", limit)
    assert [(c.step, c.phase, applied(c)) for c in calls(run_id)] == [
        (step, "completed", 1) for step in range(1, limit + 1)
    ]
    assert all(c.batch_finalized for c in calls(run_id))
    assert_log_sound(run_id)


def test_bad_calls_become_error_results_not_crashes(start, work_inline):
    run_id = start(
        tool_step(
            ("no_such_tool", {}),
            ("ledger_once", {"key": ""}),  # fails the argument schema (min_length 1)
            ("ledger_once", {"key": "ok", "extra": 1}),
            ("ledger_once", {"key": "fine"}),
        ),
        text_step(),
    )
    work_inline()
    assert run_row(run_id).end_cause == "natural"
    unknown, empty, extra, fine = calls(run_id)
    assert unknown.result == "Unknown tool 'no_such_tool'; it was not run."
    assert "invalid arguments for ledger_once" in empty.result
    assert "extra" in extra.result
    assert [(c.phase, c.is_error, c.attempt) for c in (unknown, empty, extra)] == [
        ("completed", True, 0)
    ] * 3
    assert (fine.is_error, applied(fine)) == (False, 1)
    assert LedgerEffect.objects.count() == 1
    assert_log_sound(run_id)


def test_stale_lease_is_fenced_before_any_effect(start, work_inline):
    run_id = start(tool_step(("ledger_once", {"key": "a"})), text_step())
    stale = claim("stale")
    assert stale is not None
    Run.objects.filter(id=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    fresh = claim("fresh")
    assert fresh is not None and fresh.lease.epoch == stale.lease.epoch + 1
    thread_id = run_row(run_id).thread_id
    seen = commit_count(thread_id)

    with pytest.raises(LeaseLost):
        drive_inline(run_id, lease=stale.lease)
    assert commit_count(thread_id) == seen
    assert not LedgerEffect.objects.exists()
    assert not MessageRecord.objects.filter(run_id=run_id, role="assistant").exists()

    drive_inline(run_id, lease=fresh.lease)
    assert run_row(run_id).end_cause == "natural"
    (call,) = calls(run_id)
    assert applied(call) == 1
    assert_log_sound(run_id)
