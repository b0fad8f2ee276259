"""A tool's exception (issue 31, item 7): for a tool that declared no effect or an idempotent
one it is the call's error result once its attempts are spent, and the run goes on; only a
``once`` effect that may have started is sealed Indeterminate for Reconcile."""

from __future__ import annotations

import pytest

from runtime.inventory import unreconciled_calls
from tests.runtime.raising_agent import AGENT
from tests.runtime.support import calls, run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def raising(settings):
    settings.RUNTIME_AGENTS = [*settings.RUNTIME_AGENTS, AGENT]


@pytest.mark.parametrize("name", ["broken_read", "broken_idempotent"])
def test_an_exception_of_a_tool_without_a_once_effect_is_its_error_result(
    raising, start, work_inline, name
) -> None:
    run_id = start(tool_step((name, {})), text_step("told"), agent="raising")
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    [call] = calls(run_id)
    assert (call.phase, call.is_error, call.attempt) == ("completed", True, 2)
    assert call.result == "the tool raised KeyError: 'bug at attempt 2' (2 attempts)"
    assert not unreconciled_calls().filter(run_id=run_id).exists()


def test_an_exception_of_a_once_tool_is_sealed_for_reconcile(raising, start, work_inline) -> None:
    run_id = start(tool_step(("broken_once", {})), text_step("told"), agent="raising")
    work_inline()
    [call] = calls(run_id)
    assert call.phase == "indeterminate"
    assert "the tool failed: KeyError: 'bug at attempt 1'" in str(call.result)
    assert unreconciled_calls().filter(run_id=run_id).exists()
