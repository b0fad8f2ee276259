"""``POST /runs/{id}/resume``: every answer, every refusal (writing nothing), idempotency."""

from __future__ import annotations

import json

import pytest

from runtime.errors import VersionConflict
from runtime.models import CommandRecord, Ticket
from tests.api.conftest import commit_count, error_of

pytestmark = pytest.mark.django_db


def answer(run, **body):
    ticket = run["ticket"]
    return {"ticket_id": ticket["id"], "kind": ticket["kind"], **body}


def test_approve_returns_the_new_committed_state(api, awaiting):
    run = awaiting("approval")
    response = api.post(f"/runs/{run['id']}/resume", answer(run, decision="approve", note="ok"))
    assert response.status_code == 200
    document = response.json()
    assert document["state"] == "running"
    assert document["version"] == run["version"] + 1
    assert document["ticket"] is None
    (call,) = document["active_batch"]["calls"]
    assert call["approved"] is True
    ticket = Ticket.objects.get(id=run["ticket"]["id"])
    assert (ticket.state, ticket.decision, ticket.closed_by) == ("consumed", "approve", "olivia")


def test_deny_completes_the_call_with_a_denied_error(api, awaiting):
    run = awaiting("approval")
    response = api.post(f"/runs/{run['id']}/resume", answer(run, decision="deny", note="risky"))
    assert response.status_code == 200
    (call,) = response.json()["batches"][0]["calls"]
    assert call["phase"] == "completed"
    assert call["is_error"] is True
    assert "Denied by operator: risky" in call["result"]


def test_input_matching_the_schema_completes_the_call(api, awaiting):
    run = awaiting("input")
    response = api.post(f"/runs/{run['id']}/resume", answer(run, input={"n": 3}))
    assert response.status_code == 200
    (call,) = response.json()["batches"][0]["calls"]
    assert call["phase"] == "completed"
    assert call["result"] == '{"n": 3}'


def test_decision_input_with_input_is_the_same_answer(api, awaiting):
    run = awaiting("input")
    body = answer(run, decision="input", input={"n": 1})
    assert api.post(f"/runs/{run['id']}/resume", body).status_code == 200


def test_result_answers_like_input(api, awaiting):
    run = awaiting("input")
    response = api.post(f"/runs/{run['id']}/resume", answer(run, result={"n": 5}))
    assert response.status_code == 200
    assert response.json()["batches"][0]["calls"][0]["result"] == '{"n": 5}'


def test_input_failing_the_tickets_schema_is_422_and_writes_nothing(api, awaiting):
    run = awaiting("input")
    before = commit_count(run["id"])
    response = api.post(f"/runs/{run['id']}/resume", answer(run, input={"n": "three"}))
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "invalid_input"
    assert error["detail"]["path"] == ["n"]
    assert commit_count(run["id"]) == before


def refused(api, run, body, code):
    before = commit_count(run["id"])
    response = api.post(f"/runs/{run['id']}/resume", body)
    assert response.status_code == 409, response.content
    error = error_of(response)
    assert error["code"] == code
    committed = api.get(f"/runs/{run['id']}").json()
    assert error["detail"]["run"] == committed  # the current committed state rides along
    assert commit_count(run["id"]) == before  # nothing written
    return error


def test_another_ticket_is_409_ticket_mismatch(api, awaiting):
    run = awaiting("approval")
    body = {"ticket_id": "0" * 32, "kind": "approval", "decision": "approve"}
    error = refused(api, run, body, "ticket_mismatch")
    assert error["detail"]["open_ticket"] == run["ticket"]["id"]


def test_another_call_is_409_ticket_mismatch(api, awaiting):
    run = awaiting("approval")
    refused(api, run, answer(run, decision="approve", call_id="c" * 32), "ticket_mismatch")


def test_another_kind_is_409_kind_mismatch(api, awaiting):
    run = awaiting("approval")
    error = refused(api, run, answer(run, kind="input", input={"n": 1}), "kind_mismatch")
    assert error["detail"]["ticket_kind"] == "approval"


def test_a_decision_the_kind_does_not_take_is_409_kind_mismatch(api, awaiting):
    run = awaiting("input")
    error = refused(api, run, answer(run, decision="approve"), "kind_mismatch")
    # the message names what is wrong (the decision) and what would answer the ticket
    assert error["message"] == (
        "The decision approve does not answer the open input ticket (its decisions: deny, input)."
    )
    assert error["detail"]["allowed"] == ["deny", "input"]


def test_a_consumed_ticket_is_409_ticket_consumed_to_another_command(api, awaiting):
    run = awaiting("approval")
    assert api.post(f"/runs/{run['id']}/resume", answer(run, decision="approve")).status_code == 200
    refused(api, run, answer(run, decision="deny"), "ticket_consumed")


def test_an_ended_run_is_409_run_ended(api, awaiting):
    run = awaiting("approval")
    api.post(f"/runs/{run['id']}/cancel", {})
    error = refused(api, run, answer(run, decision="approve"), "run_ended")
    assert error["detail"]["run"]["end_cause"] == "cancelled"


def test_a_running_run_is_409_not_awaiting(api, start):
    run = start({"text": "x"})
    body = {"ticket_id": "1" * 32, "kind": "approval", "decision": "approve"}
    refused(api, run, body, "not_awaiting")


def test_a_lost_race_is_409_version_conflict(api, awaiting, monkeypatch):
    run = awaiting("approval")

    def always_behind(draft, **kwargs):
        raise VersionConflict(expected=draft.expected_version)

    monkeypatch.setattr("runtime.operations.commit", always_behind)
    refused(api, run, answer(run, decision="approve"), "version_conflict")


def test_an_unknown_run_is_404(api):
    body = {"ticket_id": "1" * 32, "kind": "approval", "decision": "approve"}
    response = api.post("/runs/" + "9" * 32 + "/resume", body)
    assert response.status_code == 404


@pytest.mark.parametrize(
    "extra",
    [
        {},  # no answer at all
        {"decision": "approve", "input": {"n": 1}},
        {"decision": "deny", "result": 1},
        {"input": 1, "result": 2},
        {"decision": "maybe"},
        {"decision": "approve", "note": "x" * 2001},
        {"decision": "approve", "unknown": True},
        {"input": {"nan": float("inf")}},
    ],
)
def test_malformed_commands_are_422(api, awaiting, extra):
    run = awaiting("approval")
    body = {"ticket_id": run["ticket"]["id"], "kind": "approval", **extra}
    before = commit_count(run["id"])
    response = api.client.post(
        f"/api/v1/runs/{run['id']}/resume",
        json.dumps(body, allow_nan=True),
        content_type="application/json",
        headers=api.headers(),
    )
    assert response.status_code == 422, response.content
    assert error_of(response)["code"] == "validation_error"
    assert commit_count(run["id"]) == before


def test_an_unknown_kind_is_422(api, awaiting):
    run = awaiting("approval")
    body = answer(run, kind="telepathy", decision="approve")
    response = api.post(f"/runs/{run['id']}/resume", body)
    assert response.status_code == 422


# -- idempotency ------------------------------------------------------------------------------


def test_the_same_key_and_body_get_the_first_answer_again(api, awaiting):
    run = awaiting("approval")
    key = {"Idempotency-Key": "approve-b-1"}
    body = answer(run, decision="approve", note="ok")
    first = api.post(f"/runs/{run['id']}/resume", body, headers=key)
    assert first.status_code == 200
    commits = commit_count(run["id"])
    again = api.post(f"/runs/{run['id']}/resume", body, headers=key)
    assert again.status_code == 200
    assert again.json() == first.json()
    assert commit_count(run["id"]) == commits
    assert CommandRecord.objects.filter(run_id=run["id"], key="approve-b-1").count() == 1


def test_the_same_key_with_another_body_is_422(api, awaiting):
    run = awaiting("approval")
    key = {"Idempotency-Key": "k-1"}
    first = api.post(f"/runs/{run['id']}/resume", answer(run, decision="approve"), headers=key)
    assert first.status_code == 200
    response = api.post(f"/runs/{run['id']}/resume", answer(run, decision="deny"), headers=key)
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "idempotency_key_reused"


def test_a_refused_command_is_not_remembered_under_its_key(api, awaiting):
    run = awaiting("approval")
    key = {"Idempotency-Key": "k-2"}
    wrong = api.post(f"/runs/{run['id']}/resume", answer(run, kind="input", input=1), headers=key)
    assert wrong.status_code == 409
    assert not CommandRecord.objects.filter(key="k-2").exists()


@pytest.mark.parametrize("key", ["x" * 201, "with space", "tab\there"])
def test_a_malformed_idempotency_key_is_422(api, awaiting, key):
    run = awaiting("approval")
    response = api.post(
        f"/runs/{run['id']}/resume",
        answer(run, decision="approve"),
        headers={"Idempotency-Key": key},
    )
    assert response.status_code == 422
    assert error_of(response)["code"] == "validation_error"


def test_respond_completes_an_approval_with_the_supplied_result(api, awaiting):
    run = awaiting("approval")
    body = answer(run, decision="respond", result={"recorded": "by hand"}, note="done in ERP")
    response = api.post(f"/runs/{run['id']}/resume", body)
    assert response.status_code == 200, response.content
    (call,) = response.json()["batches"][0]["calls"]
    assert call["phase"] == "completed" and call["is_error"] is False
    assert json.loads(call["result"]) == {"recorded": "by hand"}
    ticket = Ticket.objects.get(id=run["ticket"]["id"])
    assert (ticket.state, ticket.decision) == ("consumed", "respond")


@pytest.mark.parametrize(
    "body",
    [
        {"decision": "respond"},  # no result
        {"decision": "deny", "arguments": {"key": "x"}},  # arguments ride with approve only
        {"decision": "approve", "arguments": [1]},
    ],
)
def test_malformed_operator_acts_are_422_and_write_nothing(api, awaiting, body):
    run = awaiting("approval")
    before = commit_count()
    response = api.post(f"/runs/{run['id']}/resume", answer(run, **body))
    assert response.status_code == 422, response.content
    assert commit_count() == before
