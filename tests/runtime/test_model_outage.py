"""A model outage never fails a run before its horizon (issue 31, item 6).

A real OpenAI-compatible server (tests/model_server.py) answers 503 while it is down; the
worker's production provider asks it. Past the quick retries the worker releases the run to
wait, says why in the run document (the API's and the console's "why is it not moving") and
a metric, and tries again later; when the model is back the run goes on. Only a model that
keeps failing for RUNTIME_MODEL_OUTAGE_SECONDS, counted from its first failure in the step,
fails the run, saying so.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime import limits
from runtime.agents import _registry
from runtime.documents import run_document
from runtime.models import Run
from runtime.operations import fork_run, start_run
from tests.model_server import model_server
from tests.runtime.limited_agent import AGENTS

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(settings, monkeypatch):
    """The ``modeled`` agent, asking a model server that is down until told otherwise."""
    with model_server([("ledger_replay", {"key": "m"})]) as server:
        monkeypatch.setenv("RUNTIME_TEST_MODEL_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "test")
        _registry.cache_clear()  # the modeled agent reads the server's URL when loaded
        settings.RUNTIME_AGENTS = AGENTS.split(",")
        server.outage(True)
        yield server
    _registry.cache_clear()


def _due(run_id: str, **fields) -> None:
    """Make the released run's next try due now (instead of waiting a second for it)."""
    Run.objects.filter(id=run_id).update(wait_until=timezone.now(), **fields)


def _statuses(server) -> list[int]:
    return [status for _at, status, _kind in server.arrivals]


def test_a_run_waits_through_an_outage_says_so_and_goes_on(server, work_inline, settings):
    settings.RUNTIME_MODEL_RETRIES = 2
    run_id = start_run(agent="modeled", input="task")
    work_inline()  # three tries, then the run is released to wait

    run = Run.objects.get(id=run_id)
    assert (run.state, run.lease_owner) == ("running", None)
    assert run.model_unavailable_since is not None
    waiting = run_document(run_id)["waiting"]
    assert waiting.startswith("waiting for the model: failing since ")
    assert "the run fails after 15 min" in waiting and "503" in waiting
    assert limits.waiting_for_model() == 1
    assert _statuses(server) == [503, 503, 503]

    _due(run_id)
    work_inline()  # still down: three more tries, released again, the same outage
    again = Run.objects.get(id=run_id)
    assert again.state == "running"
    assert again.model_unavailable_since == run.model_unavailable_since

    server.outage(False)
    _due(run_id)
    work_inline()
    run = Run.objects.get(id=run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    assert _statuses(server) == [503] * 6 + [200, 200]  # the tool call, then the answer
    assert run_document(run_id)["waiting"] is None
    assert limits.waiting_for_model() == 0


def test_a_model_down_past_the_horizon_fails_the_run_saying_so(server, work_inline, settings):
    settings.RUNTIME_MODEL_RETRIES = 0
    settings.RUNTIME_MODEL_OUTAGE_SECONDS = 600
    server.outage(True, kinds=("tool",))  # step 1 is answered (a tool call), step 2 is not
    run_id = start_run(agent="modeled", input="task")
    work_inline()
    assert Run.objects.get(id=run_id).state == "running"
    assert _statuses(server) == [200, 503]

    now = timezone.now()  # as if the step began 12 minutes ago, and its model failed since
    _due(
        run_id,
        committed_at=now - timedelta(minutes=12),
        model_unavailable_since=now - timedelta(minutes=11),
    )
    work_inline()
    run = Run.objects.get(id=run_id)
    assert (run.state, run.end_cause) == ("ended", "failed")
    assert run.error["type"] == "model_error" and run.error["status"] == 503
    assert "(the model failed for 11 min; the run waits up to 10 min" in run.error["message"]
    assert "RUNTIME_MODEL_OUTAGE_SECONDS" in run.error["message"]

    # An operator tries step 2 again once the model is back: a fork after step 1 (API POST
    # /runs/{id}/fork, the console's Fork), whose tool call is copied, never run again.
    server.outage(False)
    retry = fork_run(run_id, at_step=run.step, actor="op")
    work_inline()
    assert Run.objects.get(id=retry).end_cause == "natural"
    assert _statuses(server)[-1] == 200 and _statuses(server).count(200) == 2


def test_a_failure_recorded_in_an_earlier_step_starts_no_horizon(server, work_inline, settings):
    """``model_unavailable_since`` before the run's last commit is an earlier step's outage."""
    settings.RUNTIME_MODEL_RETRIES = 0
    run_id = start_run(agent="modeled", input="task")
    long_ago = timezone.now() - timedelta(days=3)
    Run.objects.filter(id=run_id).update(
        model_unavailable_since=long_ago, committed_at=long_ago + timedelta(seconds=1)
    )
    assert limits.model_unavailable_since(run_id) is None
    work_inline()  # a new outage: released to wait, not failed
    run = Run.objects.get(id=run_id)
    assert run.state == "running"
    assert run.model_unavailable_since > long_ago + timedelta(days=2)
