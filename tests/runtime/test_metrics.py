"""``/metrics``: after real runs, every family is there with the right labels and counts.

Runs are driven by the real Worker in this process (``work_inline``), so the hot-path
counters of this process move; the log's gauges are read from the database at scrape time.
Counters are process-wide, so the test compares them before and after.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from runtime import conf, operations, registry
from runtime.coordinator import commit, read_head, read_run
from runtime.domain.commit import CommitDraft
from runtime.domain.events import StepCommitted
from runtime.domain.model import Disposition
from runtime.errors import VersionConflict
from runtime.models import Run
from runtime.worker import claim, release
from tests.console.support import RunDriver
from tests.runtime.support import run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(client: Client | None = None, **headers: str) -> Samples:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    response = (client or Client()).get("/metrics", headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def _conflict(run_id: str) -> None:
    view = read_run(run_id)
    assert view is not None
    stale = CommitDraft(
        thread_id=view.thread_id,
        run_id=run_id,
        expected_version=read_head(view.thread_id).version - 1,
        disposition=Disposition.running(),
        events=(StepCommitted(step=view.step + 1),),
        actor="test",
    )
    with pytest.raises(VersionConflict):
        commit(stale)


def _take_over(run_id: str) -> None:
    """A claim by "lost", whose lease then expires, and a claim by "heir": one takeover."""
    first = claim("lost")
    assert first is not None and first.run_id == run_id
    Run.objects.filter(id=run_id).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    second = claim("heir")
    assert second is not None and second.run_id == run_id
    release(second.lease, run_id)


def _waiting_runs() -> None:
    """An approval ticket, a due timer ticket and a future one, and an unreconciled call."""
    approval = RunDriver(operations.start_run(agent="demo", input="a", actor="t"))
    (call,) = approval.open_batch({"name": "ledger_approval", "arguments": {"key": "k"}})
    approval.await_ticket(call, "approval")
    for at in (timezone.now() - timedelta(minutes=1), timezone.now() + timedelta(hours=1)):
        timer = RunDriver(operations.start_run(agent="demo", input="t", actor="t"))
        (call,) = timer.open_batch({"name": "slow", "arguments": {"seconds": 0}})
        timer.await_ticket(call, "timer", request={"due_at": at.isoformat()})
    lost = RunDriver(operations.start_run(agent="demo", input="l", actor="t"))
    (call,) = lost.open_batch({"name": "ledger_once", "arguments": {"key": "p"}})
    lost.execute(call)
    lost.fail()


def test_every_family_after_demo_runs(start, work_inline):
    before = scrape()
    done = start(tool_step(("ledger_replay", {"key": "a"})), text_step("all done"))
    flaky = start({"error": "retryable", "times": 1}, text_step("after a retry"))
    assert work_inline() == 2
    assert (run_row(done).end_cause, run_row(flaky).end_cause) == ("natural", "natural")
    _conflict(start(text_step()))  # a Running run, not claimed yet
    taken = Run.objects.filter(state="running").values_list("id", flat=True).get()
    _take_over(taken)
    # As if its workers kept dying: the next claim is over budget, a poison end (and, after a
    # death, one more takeover).
    Run.objects.filter(id=taken).update(claims=conf.poison_deaths())
    assert work_inline() == 1
    _waiting_runs()
    registry.register("metrics-worker", 2)

    after = scrape()
    assert delta(before, after, "runtime_commits_total") >= 8
    assert delta(before, after, "runtime_commit_duration_seconds_count") == delta(
        before, after, "runtime_commits_total"
    )
    assert value(after, "runtime_commit_duration_seconds_bucket", le="+Inf") >= 8
    assert delta(before, after, "runtime_version_conflicts_total") == 1
    assert delta(before, after, "runtime_lease_takeovers_total") == 2
    assert delta(before, after, "runtime_poison_ends_total") == 1

    model = {"provider": "scripted", "model": "default"}
    assert delta(before, after, "runtime_inference_duration_seconds_count", **model) == 4
    assert delta(before, after, "runtime_inference_errors_total", retryable="true", **model) == 1
    assert delta(before, after, "runtime_inference_tokens_total", direction="output", **model) > 0
    tool = {"tool": "ledger_replay", "policy": "replay"}
    assert delta(before, after, "runtime_tool_calls_total", outcome="ok", **tool) == 1
    assert delta(before, after, "runtime_tool_duration_seconds_count", **tool) == 1

    assert value(after, "runtime_runs", state="ended", end_cause="natural") == 2
    assert value(after, "runtime_runs", state="ended", end_cause="indeterminate") == 1
    assert value(after, "runtime_runs", state="ended", end_cause="failed") == 1
    assert value(after, "runtime_runs", state="awaiting", end_cause="") == 3
    assert value(after, "runtime_open_tickets", kind="approval") == 1
    assert value(after, "runtime_open_tickets", kind="timer") == 2
    assert value(after, "runtime_oldest_open_ticket_age_seconds", kind="timer") >= 0
    assert value(after, "runtime_unreconciled_indeterminate_calls") == 1
    assert value(after, "runtime_timers_due") == 1
    assert value(after, "runtime_workers", status="live") == 1
    # django-prometheus: HTTP by view and status, database queries by vendor.
    assert any(name.startswith("django_http_requests") for name, _ in after)
    vendor = connection.vendor
    assert delta(before, after, "django_db_execute_total", alias="default", vendor=vendor) > 10
    # Every series the sample Grafana dashboard queries exists.
    queried = set(re.findall(r"\b((?:runtime|django)_[a-z_]+)", DASHBOARD.read_text()))
    assert queried - {name for name, _ in after} == set()


def test_access_loopback_token_and_off(settings):
    remote = Client(REMOTE_ADDR="203.0.113.9")
    assert Client().get("/metrics").status_code == 200
    assert remote.get("/metrics").status_code == 403
    settings.RUNTIME_METRICS = "open"
    assert remote.get("/metrics").status_code == 200
    settings.RUNTIME_METRICS_TOKEN = "s3cret"
    assert remote.get("/metrics").status_code == 401
    assert Client().get("/metrics").status_code == 401  # a token guards loopback too
    assert remote.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 401
    scrape(remote, Authorization="Bearer s3cret")
    settings.RUNTIME_METRICS = "off"
    assert Client().get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 404
