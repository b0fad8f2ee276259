"""Moving runs to a new version on purpose (issue 34, item 3): a dry run that lists per run
what changes, then a move that is a committed fact, in Audit, that routes the run to the new
version's workers."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from runtime import fsck, moves, operations, registry, versions
from runtime.errors import MoveRefused, UnknownAgent
from runtime.models import Run, ThreadCommit
from tests.runtime.support import calls, run_row, text_step, tool_step
from tests.runtime.test_deploy_changes import _approve, _tool_messages

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def awaiting(deploy, start, work_inline):
    """A run of version 1 waiting for the approval of ``refund``: (run id, version 1)."""
    one = deploy("v1")
    run_id = start(tool_step(("refund", {"order": "o-1"})), text_step("told"), agent="deploy")
    work_inline()
    assert run_row(run_id).state == "awaiting"
    return run_id, one


def _commits(run_id: str) -> int:
    return ThreadCommit.objects.filter(run_id=run_id).count()


NOT_RUN = (
    "call 0 refund (awaiting): its ticket stays open; once answered, the call is completed as"
    " an error before any effect: Not run: "
)


@pytest.mark.parametrize(
    ("version", "change"),
    [
        (
            "removed",
            NOT_RUN + "the tool 'refund' is not in agent 'deploy' as deployed now",
        ),
        (
            "renamed",
            NOT_RUN + "the tool 'refund' is not in agent 'deploy' as deployed now",
        ),
        (
            "new_argument",
            NOT_RUN + "the tool's current schema refuses the call's arguments",
        ),
        (
            "new_policy",
            "call 0 refund (awaiting): keeps what was pinned when it was requested (policy"
            " indeterminate, permission ask, 1 attempt(s), effects once); the new version"
            " declares policy replay, permission allow, 3 attempt(s), effects idempotent",
        ),
    ],
)
def test_the_dry_run_says_what_a_move_changes_for_each_run_and_writes_nothing(
    awaiting, deploy, version, change
):
    run_id, one = awaiting
    written = _commits(run_id)
    two = deploy(version)
    to_version, found, more = moves.plan("deploy")
    assert (to_version, more) == (two, False)
    [m] = found
    assert (m.run_id, m.from_version, m.to_version, m.state, m.refused) == (
        run_id,
        one,
        two,
        "awaiting",
        "",
    )
    [line] = m.changes
    assert line.startswith(change), line
    assert (
        m.next
        == f"it waits for its approval ticket of call 0 refund; version {two} goes on from it"
    )
    assert _commits(run_id) == written and run_row(run_id).agent_version == one


def test_a_moved_run_is_driven_by_the_new_version_even_when_pinned(
    awaiting, deploy, work_inline, settings, admin_client
):
    settings.RUNTIME_AGENT_VERSION_ROUTING = "pinned"
    run_id, one = awaiting
    two = deploy("removed")
    registry.register("new-worker", 1)  # the fleet carries version 2 alone
    _approve(run_id)
    assert work_inline() == 0  # pinned: it waits for a worker of version 1

    to_version, found, moved, more = moves.move("deploy", actor="olga", reason="refund is gone")
    assert (to_version, moved, more) == (two, [run_id], False)
    assert run_row(run_id).agent_version == two
    commit = ThreadCommit.objects.filter(run_id=run_id).order_by("-seq").first()
    assert commit.actor == "olga"
    assert commit.events == [
        {"type": "RunMoved", "from_version": one, "to_version": two, "reason": "refund is gone"}
    ]
    assert moves.plan("deploy")[1] == []  # nothing left to move

    assert work_inline() == 1  # a worker of version 2 drives it now
    assert run_row(run_id).end_cause == "natural"
    [result] = _tool_messages(run_id)
    assert result.startswith("Not run: the tool 'refund' is not in agent 'deploy'")
    assert calls(run_id)[0].phase == "completed"
    assert fsck.check() == []
    audit = admin_client.get(reverse("console:audit"), {"decision": "move"}).content.decode()
    assert f"run moved from version {one} to {two}" in audit and "refund is gone" in audit
    page = admin_client.get(reverse("console:run", args=[run_id])).content.decode()
    assert f"moved from version {one} to {two}: refund is gone" in page


def test_a_move_is_refused_and_writes_nothing_when_it_cannot_be_made(awaiting, deploy, start):
    run_id, one = awaiting
    two = deploy("removed")
    written = _commits(run_id)
    with pytest.raises(MoveRefused, match="is on version"):
        operations.move_run(run_id, from_version="d-other", to_version=two)
    Run.objects.filter(id=run_id).update(
        lease_owner="busy", lease_expires_at="2999-01-01T00:00:00Z"
    )
    with pytest.raises(MoveRefused, match="worker busy drives the run now: pause it first"):
        operations.move_run(run_id, from_version=one, to_version=two)
    [m] = moves.plan("deploy")[1]
    assert m.refused.startswith("worker busy drives the run now")
    assert moves.move("deploy")[2] == []
    Run.objects.filter(id=run_id).update(lease_owner=None, lease_expires_at=None)
    assert _commits(run_id) == written

    operations.move_run(run_id, from_version=one, to_version=two, actor="olga")
    with pytest.raises(MoveRefused, match="already on version"):  # again, or another operator
        operations.move_run(run_id, from_version=one, to_version=two, actor="oscar")
    assert _commits(run_id) == written + 1
    operations.cancel(run_id, actor="olga")
    with pytest.raises(MoveRefused, match="ended"):
        operations.move_run(run_id, from_version=two, to_version=one)
    with pytest.raises(UnknownAgent):
        moves.plan("nobody")


def test_a_claim_between_the_check_and_the_commit_refuses_the_move(awaiting, deploy, monkeypatch):
    """The lease is judged again in the move's write: a worker that claims the run after
    ``move_run`` looked and before it commits keeps it, and the move writes nothing."""
    run_id, one = awaiting
    two = deploy("removed")
    _approve(run_id)  # Running, and no worker holds it yet
    real = operations.commit

    def claimed_meanwhile(*args, **kwargs):
        monkeypatch.setattr(operations, "commit", real)
        later = timezone.now() + timedelta(minutes=5)
        Run.objects.filter(id=run_id).update(lease_owner="w-v1", lease_expires_at=later)
        return real(*args, **kwargs)

    monkeypatch.setattr(operations, "commit", claimed_meanwhile)
    written = _commits(run_id)
    with pytest.raises(MoveRefused, match="worker w-v1 drives the run now"):
        operations.move_run(run_id, from_version=one, to_version=two)
    assert _commits(run_id) == written and run_row(run_id).agent_version == one
    assert fsck.check() == []


def test_a_dry_run_finds_its_agents_runs_whatever_other_agents_are_on(
    awaiting, deploy, start, monkeypatch
):
    run_id, _ = awaiting
    deploy("removed")
    monkeypatch.setattr(versions, "VERSIONS_MAX", 2)
    for n in range(3):  # runs of "demo", listed before "deploy", on three older versions
        Run.objects.filter(id=start(text_step())).update(agent_version=f"d-old{n}")
    assert len(versions.open_versions()) == 2
    assert [m.run_id for m in moves.plan("deploy")[1]] == [run_id]


def test_runtime_move_lists_then_moves(awaiting, deploy):
    run_id, one = awaiting
    two = deploy("new_policy")
    out = StringIO()
    call_command("runtime_move", "deploy", stdout=out)
    text = out.getvalue()
    assert f"run {run_id} (awaiting) {one} -> {two}: would move" in text
    assert "keeps what was pinned" in text and f"dry run: 1 run(s) of deploy to {two}" in text
    assert run_row(run_id).agent_version == one

    out = StringIO()
    call_command("runtime_move", "deploy", "--from-version", one, "--apply", "--json", stdout=out)
    document = json.loads(out.getvalue())
    assert (document["to_version"], document["moved"], document["more"]) == (two, [run_id], False)
    assert run_row(run_id).agent_version == two
    out = StringIO()
    call_command("runtime_move", "deploy", "--from-version", one, stdout=out)  # nothing left
    said = f"no run of deploy that has not ended is on version {one}; versions its runs are on:"
    assert f"{said} {two}" in out.getvalue()
    assert fsck.check() == []


def test_the_console_lists_versions_then_moves_the_runs_its_dry_run_listed(
    awaiting, deploy, admin_client, client, django_user_model
):
    run_id, one = awaiting
    two = deploy("removed")
    url = reverse("console:move")
    page = admin_client.get(url).content.decode()
    assert f'data-version="deploy {one}"' in page and f"Dry run of a move to {two}" in page
    page = admin_client.get(url, {"agent": "deploy", "from_version": one}).content.decode()
    assert "completed as an error before any effect" in page and "Move 1 run" in page
    assert admin_client.get(url, {"agent": "nobody"}).status_code == 404
    assert admin_client.get(url, {"agent": "deploy", "from_version": "a\u0000b"}).status_code == 400
    assert admin_client.get(url, {"agent": "x" * 101}).status_code == 400
    written = _commits(run_id)
    for refused in (
        {"agent": "deploy", "run": [run_id], "reason": "x" * 501},
        {"agent": "deploy", "run": [run_id], "reason": "a\u0000b"},
        {"agent": "nobody", "run": [run_id]},
        {"agent": "deploy", "run": ["../etc"]},
        {"agent": "deploy", "from_version": "a\u0000b", "run": [run_id]},
        {"agent": "deploy", "from_version": "v" * 101, "run": [run_id]},
    ):
        assert admin_client.post(url, refused).status_code == 400, refused
    viewer = django_user_model.objects.create_user("vera", password="pw")
    client.force_login(viewer)
    assert client.get(url).status_code == 403
    assert client.post(url, {"agent": "deploy", "run": [run_id]}).status_code == 403
    assert _commits(run_id) == written and run_row(run_id).agent_version == one

    body = {"agent": "deploy", "from_version": one, "run": [run_id], "reason": "refund is gone"}
    response = admin_client.post(url, body)
    assert response.status_code == 302
    assert run_row(run_id).agent_version == two
    after = admin_client.get(response["Location"]).content.decode()
    assert f"Moved 1 run(s) of deploy to {two}." in after
    assert _commits(run_id) == written + 1
