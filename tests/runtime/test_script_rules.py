"""Which scripts a run starts with: steps it could never reach are refused, unless the
agent's ``step_end`` hook may go on after text; a stored script that today's rules refuse
fails its run with the reason (not as a crash, re-asked three times)."""

from __future__ import annotations

import pytest

from runtime.errors import ScriptRefused
from runtime.models import Run
from tests.runtime.support import assistant_messages, run_row, text_step

pytestmark = pytest.mark.django_db(transaction=True)


def test_steps_after_text_are_refused_for_an_agent_that_stops_there(start) -> None:
    with pytest.raises(ScriptRefused, match="steps.1: never used: steps.0 answers with text"):
        start(text_step("first"), text_step("second"))
    assert not Run.objects.exists()


def test_an_agent_that_may_go_on_after_text_may_have_steps_after_it(
    start, settings, work_inline
) -> None:
    continuing = "tests.runtime.continuing_agent.continuing"
    settings.RUNTIME_AGENTS = [*settings.RUNTIME_AGENTS, continuing]
    run_id = start(text_step("first"), text_step("second"), agent="continuing")
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    assert [m.content for m in assistant_messages(run_id)][:2] == ["first", "second"]


def test_a_stored_script_refused_by_todays_rules_fails_its_run_with_the_reason(
    start, work_inline
) -> None:
    run_id = start(text_step())
    stored = {"script": {"steps": [{"text": "a", "chunks": True}]}}
    Run.objects.filter(id=run_id).update(metadata=stored)  # as started before the rule
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "failed")
    assert "steps.0.chunks: Input should be a valid integer" in str(run.error)
