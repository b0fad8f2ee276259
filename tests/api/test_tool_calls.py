"""``/tool-calls``: Indeterminate calls for reconciliation, and the recorded fact."""

from __future__ import annotations

import pytest

from runtime.models import ReconciliationRecord, ThreadCommit
from tests.api.conftest import commit_count, commit_executing, error_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def sealed(api, awaiting):
    """Two Indeterminate calls: one sealed from Executing (its effect may have started) and
    one sealed from Awaiting (it never started)."""
    started = awaiting("approval")
    body = {"ticket_id": started["ticket"]["id"], "kind": "approval", "decision": "approve"}
    assert api.post(f"/runs/{started['id']}/resume", body).status_code == 200
    call_id = started["ticket"]["call_id"]
    commit_executing(started["id"], call_id)  # a worker began the effect, then vanished
    assert api.post(f"/runs/{started['id']}/cancel", {}).status_code == 200
    never = awaiting("approval")
    assert api.post(f"/runs/{never['id']}/cancel", {}).status_code == 200
    return {"started": (started, call_id), "never": (never, never["ticket"]["call_id"])}


def test_indeterminate_lists_only_calls_whose_effect_may_have_started(api, sealed):
    (run, call_id) = sealed["started"]
    response = api.get("/tool-calls", phase="indeterminate")
    assert response.status_code == 200
    (item,) = response.json()["items"]
    assert item["call_id"] == call_id
    assert item["run_id"] == run["id"] and item["thread_id"] == run["thread_id"]
    assert item["phase"] == "indeterminate"
    assert item["effect_may_have_started"] is True
    assert item["attempt"] == 1
    assert item["operation_id"]
    assert "Verify with the downstream system" in item["result"]
    assert item["reconciliations"] == []


def test_all_lists_every_indeterminate_call(api, sealed):
    items = api.get("/tool-calls", phase="indeterminate", all="true").json()["items"]
    assert {i["call_id"] for i in items} == {sealed["started"][1], sealed["never"][1]}


def test_calls_by_other_phases_and_run(api, awaiting):
    run = awaiting("approval")
    items = api.get("/tool-calls", phase="awaiting").json()["items"]
    assert [i["run_id"] for i in items] == [run["id"]]
    assert api.get("/tool-calls", phase="completed").json()["items"] == []
    assert len(api.get("/tool-calls", run=run["id"]).json()["items"]) == 1
    assert api.get("/tool-calls", run="0" * 32).json()["items"] == []


def test_tool_calls_page(api, awaiting):
    for _ in range(3):
        awaiting("approval")
    page = api.get("/tool-calls", limit=2).json()
    rest = api.get("/tool-calls", limit=2, cursor=page["next_cursor"]).json()
    ids = [i["call_id"] for i in page["items"] + rest["items"]]
    assert len(ids) == len(set(ids)) == 3


def test_a_call_that_changes_while_a_client_pages_is_neither_skipped_nor_repeated(api, awaiting):
    """Issue 21, item 10b: pages follow the calls' creation (newest first), which never
    changes; paging on the time of the last change skipped a call that changed mid-walk."""
    runs = [awaiting("approval") for _ in range(3)]  # calls A, B, C, created in this order
    a, b, c = (run["ticket"]["call_id"] for run in runs)
    page = api.get("/tool-calls", limit=1).json()
    seen = [item["call_id"] for item in page["items"]]
    middle = runs[1]  # B changes between two page reads (its approval is committed)
    body = {"ticket_id": middle["ticket"]["id"], "kind": "approval", "decision": "approve"}
    assert api.post(f"/runs/{middle['id']}/resume", body).status_code == 200
    while page["next_cursor"] is not None:
        page = api.get("/tool-calls", limit=1, cursor=page["next_cursor"]).json()
        seen += [item["call_id"] for item in page["items"]]
    assert seen == [c, b, a]


def test_reconciliation_records_an_audited_fact(api, sealed):
    (run, call_id) = sealed["started"]
    before = commit_count()
    body = {"outcome": "applied", "evidence": "ledger row 42 exists"}
    response = api.post(f"/tool-calls/{call_id}/reconciliation", body)
    assert response.status_code == 201, response.content
    fact = response.json()
    assert fact["call_id"] == call_id and fact["run_id"] == run["id"]
    assert fact["outcome"] == "applied" and fact["evidence"] == "ledger row 42 exists"
    assert fact["actor"] == "olivia"
    assert commit_count() == before + 1
    note = ThreadCommit.objects.get(thread_id=run["thread_id"], seq=fact["seq"])
    assert note.actor == "olivia" and note.run_id is None
    assert note.events[0]["type"] == "ReconciliationRecorded"
    assert ReconciliationRecord.objects.get(pk=fact["id"]).seq == fact["seq"]
    # Nothing is reopened: the run stays ended, the call Indeterminate.
    document = api.get(f"/runs/{run['id']}").json()
    assert document["state"] == "ended"
    assert document["batches"][0]["calls"][0]["phase"] == "indeterminate"
    (listed,) = api.get("/tool-calls", phase="indeterminate").json()["items"]
    assert [r["outcome"] for r in listed["reconciliations"]] == ["applied"]


def test_a_contradicting_reconciliation_must_say_it_is_a_correction(api, sealed):
    """The console's rule, in the one place both surfaces call (operations.reconcile)."""
    (_, call_id) = sealed["started"]
    path = f"/tool-calls/{call_id}/reconciliation"
    first = api.post(path, {"outcome": "applied", "evidence": "row 42"}).json()
    before = commit_count()
    refused = api.post(path, {"outcome": "not_applied", "evidence": "no row"})
    assert refused.status_code == 409, refused.content
    error = refused.json()["error"]
    assert error["code"] == "reconciliation_contradicts"
    assert error["detail"]["earlier_seq"] == first["seq"]
    assert commit_count() == before  # a refusal writes nothing
    assert api.post(path, {"outcome": "unknown"}).status_code == 201  # no contradiction
    corrected = api.post(path, {"outcome": "not_applied", "evidence": "no row", "correction": True})
    assert corrected.status_code == 201, corrected.content


def test_a_reconciliation_sent_again_with_its_key_is_recorded_once(api, sealed):
    """Issue 31, item 1: a reconciliation takes an Idempotency-Key, as a resume does."""
    (_, call_id) = sealed["started"]
    path = f"/tool-calls/{call_id}/reconciliation"
    body, key = {"outcome": "applied", "evidence": "row 42"}, {"Idempotency-Key": "rec-1"}
    first = api.post(path, body, headers=key)
    assert first.status_code == 201, first.content
    before = commit_count()
    again = api.post(path, body, headers=key)
    assert again.status_code == 201 and again.json() == first.json()
    assert commit_count() == before and ReconciliationRecord.objects.count() == 1
    other = api.post(path, {"outcome": "unknown"}, headers=key)
    assert other.status_code == 422 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert commit_count() == before


def test_unreconciled_lists_what_the_console_still_shows(api, sealed):
    (_, call_id) = sealed["started"]
    assert [i["call_id"] for i in api.get("/tool-calls", unreconciled="true").json()["items"]] == [
        call_id
    ]
    body = {"outcome": "not_applied", "evidence": ""}
    assert api.post(f"/tool-calls/{call_id}/reconciliation", body).status_code == 201
    assert api.get("/tool-calls", unreconciled="true").json()["items"] == []
    # without the filter a reconciled call is still listed, with its reconciliation
    (listed,) = api.get("/tool-calls", phase="indeterminate").json()["items"]
    assert listed["reconciliations"][0]["outcome"] == "not_applied"


def test_reconciling_a_call_that_is_not_indeterminate_is_422(api, awaiting):
    run = awaiting("approval")
    before = commit_count()
    response = api.post(
        f"/tool-calls/{run['ticket']['call_id']}/reconciliation", {"outcome": "not_applied"}
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "invalid_commit"
    assert commit_count() == before


def test_reconciling_an_unknown_call_is_404(api):
    response = api.post("/tool-calls/" + "e" * 32 + "/reconciliation", {"outcome": "unknown"})
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


@pytest.mark.parametrize(
    "body", [{}, {"outcome": "maybe"}, {"outcome": "applied", "evidence": "\u0000"}]
)
def test_a_malformed_reconciliation_is_422(api, sealed, body):
    response = api.post(f"/tool-calls/{sealed['started'][1]}/reconciliation", body)
    assert response.status_code == 422
    assert error_of(response)["code"] == "validation_error"


@pytest.mark.parametrize("params", [{"phase": "sleeping"}, {"all": "perhaps"}, {"limit": 0}])
def test_bad_tool_call_filters_are_422(api, params):
    assert api.get("/tool-calls", **params).status_code == 422


def test_calls_by_tool_agent_and_seal_reason(api, sealed):
    """The Reconcile queue's filters (issue 22): tool, agent and why the call was sealed."""
    (_, call_id) = sealed["started"]
    items = api.get("/tool-calls", phase="indeterminate", all="true", reason="cancelled")
    assert {i["call_id"] for i in items.json()["items"]} == {call_id, sealed["never"][1]}
    assert api.get("/tool-calls", reason="failed").json()["items"] == []
    assert error_of(api.get("/tool-calls", reason="bored"))["code"] == "validation_error"
    named = api.get("/tool-calls", phase="indeterminate", tool="ledger_approval", agent="demo")
    (item,) = named.json()["items"]
    assert item["call_id"] == call_id and item["effects"] == "once"
    assert api.get("/tool-calls", tool="wait").json()["items"] == []
    assert api.get("/tool-calls", agent="nobody").json()["items"] == []
