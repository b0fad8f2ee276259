"""A run is driven by code that can drive it (issue 34, item 2): a worker claims the runs of
the agents' versions it carries; a run of a version a live worker still carries goes to that
worker; a run no live worker may drive waits and says why (the API document, the Workers
page, a metric), never poison."""

from __future__ import annotations

import itertools

import pytest
from django.db import connection
from django.urls import reverse

from console.api.documents import run_summaries
from runtime import registry, versions
from runtime.documents import run_document
from runtime.domain.versions import Routing, claimable
from runtime.models import Run, ThreadCommit, WorkerProcess
from runtime.worker import Worker
from tests.runtime.support import run_row, text_step
from tests.runtime.test_metrics import scrape, value

pytestmark = pytest.mark.django_db(transaction=True)


def _live(worker_id: str, agents: dict[str, str]) -> None:
    """A live worker's registration carrying ``agents`` (as another process writes it)."""
    registry.register(worker_id, 1)
    WorkerProcess.objects.filter(id=worker_id).update(agents=agents)


def test_the_claim_conditions_agree_with_the_rules(start):
    """The ORM filter and the claim statement's SQL take exactly the runs the pure rule
    allows, for every kind of run and fleet."""
    kinds = list(itertools.product(["demo", "assistant", "gone"], ["", "v1", "v2", "v3"]))
    for agent, version in kinds:
        run_id = start(text_step())
        Run.objects.filter(id=run_id).update(agent=agent, agent_version=version)
    rows = list(Run.objects.values_list("id", "agent", "agent_version"))
    fleets = [set(), {("demo", "v1")}, {("demo", "v1"), ("demo", "v2"), ("assistant", "v3")}]
    for mine, live, routing in itertools.product(
        [{}, {"demo": "v2"}, {"demo": "v1", "assistant": "v3"}], fleets, Routing
    ):
        condition = versions.Claimable(mine, frozenset(live), routing)
        expected = {i for i, a, v in rows if claimable(a, v, mine, live, routing)}
        assert set(Run.objects.filter(condition.q()).values_list("id", flat=True)) == expected
        if connection.vendor == "postgresql":
            sql, params = condition.sql()
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT id FROM {Run._meta.db_table} WHERE {sql}", params)
                assert {row[0] for row in cursor.fetchall()} == expected, (mine, live, routing)


def test_an_old_versions_run_waits_for_its_live_old_worker_then_drains_to_the_new(
    deploy, start, work_inline
):
    old = deploy("v1")
    run_id = start(text_step("done by whoever may"), agent="deploy")
    new = deploy("removed")
    _live("old-worker", {"deploy": old})
    assert work_inline() == 0  # the new worker leaves it to the old one
    # --until-idle waits on: should the old worker die, this one takes the run over.
    assert not Worker(worker_id="new", until_idle=True).idle()
    assert run_document(run_id)["waiting"] is None  # a live worker may drive it
    registry.stopped("old-worker")  # the last old worker is gone: the new one takes over
    assert work_inline() == 1
    assert run_row(run_id).state == "ended"
    written = ThreadCommit.objects.filter(run_id=run_id, actor__startswith="worker:")
    assert {c.agent_version for c in written} == {new}


def test_a_pinned_run_waits_for_its_version_and_says_why(
    deploy, start, work_inline, settings, admin_client
):
    settings.RUNTIME_AGENT_VERSION_ROUTING = "pinned"
    old = deploy("v1")
    run_id = start(text_step(), agent="deploy")
    new = deploy("removed")
    registry.register("new-worker", 1)  # carries what this process carries: the new version
    assert work_inline() == 0
    assert Worker(worker_id="new", until_idle=True).idle()  # the run never comes to it
    why = (
        f"waiting for a worker with version {old} of agent deploy (live workers carry {new};"
        " RUNTIME_AGENT_VERSION_ROUTING is pinned)"
    )
    assert run_document(run_id)["waiting"] == why
    unserved = value(scrape(), "runtime_runs_without_a_worker", agent="deploy", agent_version=old)
    assert unserved == 1
    page = admin_client.get(reverse("console:workers")).content.decode()
    assert why in page and f'data-agent="deploy">deploy {new}<' in page
    [listed] = run_summaries(list(Run.objects.filter(id=run_id)))  # the API's list item
    assert (listed["agent_version"], listed["waiting"]) == (old, why)
    runs_page = admin_client.get(reverse("console:runs")).content.decode()
    assert 'data-holder="unserved"' in runs_page and why in runs_page
    run_page = admin_client.get(reverse("console:run", args=[run_id])).content.decode()
    assert f"a worker with version {old} of agent deploy" in run_page
    assert (
        "Waiting for</dt><dd" in run_page
        and "waiting for a worker with"
        not in run_page.split('data-testid="waiting-for">')[1].split("</dd>")[0]
    )
    assert run_row(run_id).state == "running"  # waiting, never poison

    deploy("v1")  # a worker of its version comes back
    registry.register("old-worker", 1)
    assert work_inline() == 1
    assert run_row(run_id).state == "ended"
    assert run_row(run_id).end_cause == "natural"


def test_a_run_of_an_agent_no_live_worker_carries_waits_instead_of_failing(
    deploy, start, work_inline
):
    deploy("v1")
    run_id = start(text_step(), agent="deploy")
    deploy(None)  # the deploy dropped the agent
    registry.register("this-worker", 1)
    assert work_inline() == 0
    assert run_row(run_id).state == "running"
    assert run_document(run_id)["waiting"] == "waiting for a worker that carries agent deploy"
    deploy("v1")
    assert work_inline() == 1
    assert run_row(run_id).end_cause == "natural"
