"""Every run knows its agent's version (issue 34, item 1): the run records the deployed
version it started with, each worker commit the version whose code wrote it, and the API,
the console and ``runtime_show`` show them."""

from __future__ import annotations

from dataclasses import replace
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from runtime import fsck, operations
from runtime.demo.agent import demo
from runtime.documents import run_document
from runtime.models import Run, ThreadCommit
from tests.runtime import deploy_agents
from tests.runtime.support import text_step, tool_step
from tests.runtime.test_deploy_changes import _approve

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_version_is_its_authors_or_a_digest_of_what_changes_behaviour():
    assert replace(demo, version="2026.12.1").deployed_version == "2026.12.1"
    assert demo.deployed_version.startswith("d-") and len(demo.deployed_version) == 14
    assert replace(demo).deployed_version == demo.deployed_version  # equal definitions
    assert replace(demo, attached={"mcp": object()}).deployed_version == demo.deployed_version
    versions = {
        v.deployed_version
        for v in (
            deploy_agents.v1,
            deploy_agents.removed,
            deploy_agents.renamed,
            deploy_agents.new_argument,
            deploy_agents.new_policy,
            replace(deploy_agents.v1, instructions="Be brief."),
        )
    }
    assert len(versions) == 6  # each change a deploy makes is a new version


def test_runs_and_commits_record_the_versions_that_started_and_drove_them(
    deploy, start, work_inline, admin_client
):
    one = deploy("v1")
    run_id = start(tool_step(("refund", {"order": "o-1"})), text_step("told"), agent="deploy")
    work_inline()  # v1's worker asks for approval
    two = deploy("new_policy")
    _approve(run_id)
    work_inline()  # v2's worker runs the call and ends the run

    assert Run.objects.get(id=run_id).agent_version == one
    document = run_document(run_id)
    assert (document["agent_version"], document["state"]) == (one, "ended")
    written = list(
        ThreadCommit.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("actor", "agent_version")
    )
    assert written[0] == ("", "")  # the start: who started it, no code ran
    by_worker = [(actor.split(":")[0], version) for actor, version in written[1:]]
    assert ("worker", one) in by_worker and ("worker", two) in by_worker
    assert ("approver", "") in [(actor, version) for actor, version in written]
    assert by_worker[-1] == ("worker", two)  # the end was written by version 2's code

    out = StringIO()
    call_command("runtime_show", run_id, stdout=out)
    assert out.getvalue().splitlines()[0].endswith(f"agent_version={one}")
    page = admin_client.get(reverse("console:run", args=[run_id])).content.decode()
    assert (
        f'data-testid="agent-version" title="the version of its agent it started with">{one}<'
        in page
    )
    assert f'(deployed now: <span class="mono">{two}</span>)' in page


def test_a_fork_copies_the_versions_and_fsck_checks_them(deploy, start, work_inline):
    one = deploy("v1")
    source = start(text_step("hello"), agent="deploy")
    work_inline()
    fork = operations.fork_run(source, at_step=1, input="again", actor="op")
    assert Run.objects.get(id=fork).agent_version == one
    copied = ThreadCommit.objects.filter(run_id=fork).exclude(agent_version="")
    assert copied.exists()  # the worker's answer, copied with the version that wrote it
    assert fsck.check() == []


def test_webhook_bodies_carry_the_version_the_run_started_with(
    deploy, start, work_inline, settings
):
    from runtime import webhooks
    from runtime.models import WebhookDelivery

    settings.RUNTIME_WEBHOOK_ALLOW_HOSTS = ["127.0.0.1"]
    webhooks.create_endpoint(url="http://127.0.0.1:9/hook", events=["run.ended"])
    one = deploy("v1")
    run_id = start(text_step("hello"), agent="deploy")
    work_inline()
    ended = WebhookDelivery.objects.filter(run_id=run_id, kind="run.ended")
    assert ended.exists()
    assert {d.payload["data"]["agent_version"] for d in ended} == {one}


def test_a_snapshot_from_before_views_held_the_version_takes_it_from_the_run_row(
    deploy, start, work_inline
):
    """Runs in flight across the upgrade: their stored snapshots lack ``agent_version``;
    fsck does not call that wrong, and the next commit writes the row's version into it."""
    one = deploy("v1")
    run_id = start(tool_step(("refund", {"order": "o-1"})), text_step("told"), agent="deploy")
    work_inline()  # awaiting the approval
    row = Run.objects.get(id=run_id)
    del row.snapshot["agent_version"]  # as written before this release
    Run.objects.filter(id=run_id).update(snapshot=row.snapshot)
    assert fsck.check() == []
    _approve(run_id)
    work_inline()
    assert Run.objects.get(id=run_id).snapshot["agent_version"] == one
    assert fsck.check() == []
