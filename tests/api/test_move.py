"""``POST /runs/move``: the dry run and the move of runs to the deployed version of their agent
in the API (issue 34, item 3), its refusals (nothing written) and its permission."""

from __future__ import annotations

import pytest

from runtime.models import ThreadCommit
from tests.api.conftest import commit_count, drive, error_of

pytestmark = pytest.mark.django_db

REFUND = {"tool_calls": [{"name": "refund", "arguments": {"order": "o-1"}}]}


def test_a_dry_run_then_a_move(api, deploy):
    one = deploy("v1")
    body = {"agent": "deploy", "input": "refund", "metadata": {"script": {"steps": [REFUND]}}}
    run = api.post("/runs", body).json()
    drive()
    assert api.get(f"/runs/{run['id']}").json()["state"] == "awaiting"
    two = deploy("removed")
    commits = commit_count(run["id"])

    planned = api.post("/runs/move", {"agent": "deploy"})
    assert planned.status_code == 200, planned.content
    doc = planned.json()
    assert (doc["to_version"], doc["moved"], doc["more"]) == (two, [], False)
    [entry] = doc["runs"]
    assert (entry["run_id"], entry["from_version"], entry["refused"]) == (run["id"], one, "")
    assert entry["changes"] == [
        "call 0 refund (awaiting): its ticket stays open; once answered, the call is completed as"
        " an error before any effect: Not run: the tool"
        " 'refund' is not in agent 'deploy' as deployed now"
    ]
    assert commit_count(run["id"]) == commits  # a dry run writes nothing

    applied = api.post(
        "/runs/move", {"agent": "deploy", "from_version": one, "apply": True, "reason": "gone"}
    )
    assert applied.status_code == 200, applied.content
    assert applied.json()["moved"] == [run["id"]]
    assert api.get(f"/runs/{run['id']}").json()["agent_version"] == two
    last = ThreadCommit.objects.filter(run_id=run["id"]).last()
    assert (last.actor, last.events[0]["type"]) == ("olivia", "RunMoved")
    again = api.post("/runs/move", {"agent": "deploy", "apply": True}).json()
    assert (again["runs"], again["moved"]) == ([], [])  # nothing left on another version


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"agent": "nobody"}, 404, "unknown_agent"),
        ({"agent": "deploy", "limit": 0}, 422, None),
        ({"agent": "deploy", "apply": True, "to_version": "x"}, 422, None),  # the server's own
        ({"agent": "deploy", "run_ids": []}, 422, None),
        ({"agent": "deploy", "apply": "yes"}, 422, None),  # never read as true
        ({"agent": "deploy", "limit": "5"}, 422, None),
        ({"agent": "deploy", "reason": "x\u0000y", "apply": True}, 422, None),
    ],
)
def test_a_refused_move_says_why_and_writes_nothing(api, deploy, body, status, code):
    deploy("v1")
    before = ThreadCommit.objects.count()
    response = api.post("/runs/move", body)
    assert response.status_code == status, response.content
    error = error_of(response)
    assert code is None or error["code"] == code
    assert ThreadCommit.objects.count() == before


def test_moving_runs_needs_the_operate_permission(api_as, deploy):
    deploy("v1")
    reader = api_as("rita", "read", "resume")
    response = reader.post("/runs/move", {"agent": "deploy"})
    assert response.status_code == 403
    assert error_of(response)["code"]
