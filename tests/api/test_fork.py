"""``POST /runs/{id}/fork``: a new run on a new thread with the source's history up to a
step's end (issue 22)."""

from __future__ import annotations

import pytest

from runtime.demo.models import LedgerEffect
from runtime.models import ThreadCommit
from tests.api.conftest import drive, error_of

pytestmark = pytest.mark.django_db(transaction=True)  # the tools run on their own thread

SCRIPT = [
    {"tool_calls": [{"name": "ledger_once", "arguments": {"key": "a"}}]},
    {"tool_calls": [{"name": "ledger_replay", "arguments": {"key": "b"}}]},
    {"text": "done"},
]


def test_fork_from_step_2(api, start):
    source = start(*SCRIPT)
    drive()
    before = api.get(f"/runs/{source['id']}").json()
    assert before["state"] == "ended"
    commits = ThreadCommit.objects.count()
    effects = LedgerEffect.objects.count()
    response = api.post(f"/runs/{source['id']}/fork", {"at_step": 2, "input": "and c"})
    assert response.status_code == 201, response.json()
    fork = response.json()
    assert fork["id"] != source["id"] and fork["thread_id"] != source["thread_id"]
    assert fork["state"] == "running" and fork["step"] == 2
    assert fork["metadata"]["forked_from"]["run_id"] == source["id"]
    assert fork["metadata"]["forked_from"]["by"] == "olivia"
    assert [c["name"] for b in fork["batches"] for c in b["calls"]] == [
        "ledger_once",
        "ledger_replay",
    ]
    assert fork["messages"][-1] == {
        "role": "user",
        "content": "and c",
        "tool_call_id": None,
        "tool_calls": [],
        "name": None,
        "seq": fork["version"],
    }
    assert ThreadCommit.objects.count() > commits and LedgerEffect.objects.count() == effects
    assert api.get(f"/runs/{source['id']}").json() == before  # the source never changes


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"at_step": 9}, 409, "fork_refused"),
        ({"at_step": 0}, 422, "validation_error"),
        ({}, 422, "validation_error"),
        ({"at_step": 1, "extra": 1}, 422, "validation_error"),
    ],
)
def test_refused_forks(api, start, body, status, code):
    source = start(*SCRIPT)
    drive()
    response = api.post(f"/runs/{source['id']}/fork", body)
    assert response.status_code == status and error_of(response)["code"] == code


def test_fork_needs_operate(api_as, start):
    source = start(*SCRIPT)
    drive()
    reader = api_as("rita", "read", "resume")
    assert reader.post(f"/runs/{source['id']}/fork", {"at_step": 1}).status_code == 403
    assert (
        api_as("ops", "read", "operate").post(f"/runs/{'0' * 32}/fork", {"at_step": 1}).status_code
        == 404
    )
