"""``POST /runs/{id}/pause`` and ``POST /runs/{id}/resume {"kind": "pause"}``: the pause in the
API, its schema, refusals (409 with stable codes, nothing written) and permissions."""

from __future__ import annotations

import pytest

from runtime.models import ThreadCommit
from tests.api.conftest import APPROVAL, commit_count, error_of

pytestmark = pytest.mark.django_db


def test_pause_and_resume(api, awaiting):
    run = awaiting("approval")
    response = api.post(f"/runs/{run['id']}/pause", {"reason": "checking the invoice"})
    assert response.status_code == 200, response.content
    doc = response.json()
    assert doc["state"] == "awaiting" and doc["ticket"]["kind"] == "approval"  # answerable
    pause = doc["pause"]
    assert (pause["paused_by"], pause["reason"]) == ("olivia", "checking the invoice")
    assert pause["line"] == f"paused by olivia at {pause['paused_at']}: checking the invoice"
    last = ThreadCommit.objects.filter(run_id=run["id"]).last()
    assert [e["type"] for e in last.events] == ["RunPaused"] and last.actor == "olivia"
    assert api.get("/runs", paused="true").json()["items"][0]["id"] == run["id"]
    assert api.get("/runs", paused="true").json()["items"][0]["paused"] is True
    assert api.get(f"/runs/{run['id']}").json()["pause"] == pause

    commits = commit_count(run["id"])
    refused = api.post(f"/runs/{run['id']}/pause", {"reason": "other"})
    assert refused.status_code == 409
    body = error_of(refused)
    assert body["code"] == "already_paused" and body["detail"]["run"]["pause"] == pause
    wrong = api.post(f"/runs/{run['id']}/resume", {"kind": "pause", "ticket_id": "a" * 32})
    assert (wrong.status_code, error_of(wrong)["code"]) == (409, "ticket_mismatch")
    assert commit_count(run["id"]) == commits

    resumed = api.post(f"/runs/{run['id']}/resume", {"kind": "pause", "note": "ok"})
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["pause"] is None and resumed.json()["state"] == "awaiting"
    again = api.post(f"/runs/{run['id']}/resume", {"kind": "pause", "decision": "resume"})
    assert (again.status_code, error_of(again)["code"]) == (409, "not_paused")
    assert commit_count(run["id"]) == commits + 1


def test_refusals_on_an_ended_run(api, start):
    run = start({"text": "x"})
    api.post(f"/runs/{run['id']}/cancel")
    commits = commit_count(run["id"])
    for path, body in (("pause", {}), ("resume", {"kind": "pause"})):
        response = api.post(f"/runs/{run['id']}/{path}", body)
        assert (response.status_code, error_of(response)["code"]) == (409, "run_ended")
    assert commit_count(run["id"]) == commits
    unknown = api.post("/runs/" + "a" * 32 + "/pause", {})
    assert (unknown.status_code, error_of(unknown)["code"]) == (404, "not_found")


def test_pause_with_an_idempotency_key(api, start):
    run = start(APPROVAL)
    key = {"Idempotency-Key": "pause-1"}
    first = api.post(f"/runs/{run['id']}/pause", {"reason": "r"}, headers=key)
    again = api.post(f"/runs/{run['id']}/pause", {"reason": "r"}, headers=key)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    other = api.post(f"/runs/{run['id']}/pause", {"reason": "other"}, headers=key)
    assert (other.status_code, error_of(other)["code"]) == (422, "idempotency_key_reused")


def test_pause_needs_the_operate_permission(api, api_as, start):
    run = start({"text": "x"})
    approver = api_as("abe", "read", "resume")
    assert approver.post(f"/runs/{run['id']}/pause", {}).status_code == 403
    api.post(f"/runs/{run['id']}/pause", {})
    response = approver.post(f"/runs/{run['id']}/resume", {"kind": "pause"})
    assert (response.status_code, error_of(response)["code"]) == (403, "forbidden")


def test_resume_body_shapes(api, start):
    run = start(APPROVAL)
    for body in (
        {"kind": "pause", "decision": "approve"},
        {"kind": "pause", "input": {"n": 1}},
        {"kind": "approval", "decision": "approve"},  # no ticket id
        {"kind": "approval", "ticket_id": "a" * 32, "decision": "resume"},
    ):
        assert api.post(f"/runs/{run['id']}/resume", body).status_code == 422, body


def test_openapi_schema_has_the_pause(api):
    schema = api.get("/openapi.json").json()
    assert "/api/v1/runs/{run_id}/pause" in schema["paths"]
    components = schema["components"]["schemas"]
    assert "pause" in components["RunOut"]["properties"]
    assert set(components["PauseOut"]["properties"]) >= {"paused_by", "paused_at", "reason"}
    assert "pause" in str(components["ResumeIn"]["properties"]["kind"])


def test_a_repeated_resume_is_answered_as_committed(api, api_as, start):
    """The same resume sent again by the user whose resume consumed the pause (two clicks,
    a retried request) gets the run again and writes nothing; another user, another note or
    another ticket is still refused ``not_paused``."""
    run = start({"text": "done"})
    paused = api.post(f"/runs/{run['id']}/pause", {"reason": "r"}).json()
    ticket = paused["pause"]["ticket_id"]
    body = {"kind": "pause", "ticket_id": ticket, "note": "go on"}
    first = api.post(f"/runs/{run['id']}/resume", body)
    assert first.status_code == 200, first.content
    commits = commit_count(run["id"])
    again = api.post(f"/runs/{run['id']}/resume", body)
    assert again.status_code == 200, again.content
    assert again.json()["pause"] is None and again.json()["version"] == first.json()["version"]
    bare = api.post(f"/runs/{run['id']}/resume", {"kind": "pause", "note": "go on"})
    assert bare.status_code == 200, bare.content  # no ticket named: the last pause's
    for other in (
        {"kind": "pause", "ticket_id": "b" * 32, "note": "go on"},
        {"kind": "pause", "ticket_id": ticket, "note": "another"},
    ):
        refused = api.post(f"/runs/{run['id']}/resume", other)
        assert (refused.status_code, error_of(refused)["code"]) == (409, "not_paused"), other
    someone = api_as("oscar", "read", "resume", "operate").post(f"/runs/{run['id']}/resume", body)
    assert (someone.status_code, error_of(someone)["code"]) == (409, "not_paused")
    assert commit_count(run["id"]) == commits


def test_a_pause_reason_has_one_limit_on_every_surface(api, start):
    """500 characters at most, for a pause's reason and a pause's resume note alike (the
    console's form has the same PAUSE_REASON_MAX); a longer one is refused, nothing written."""
    from runtime.domain.commit import PAUSE_REASON_MAX

    run = start({"text": "done"})
    commits = commit_count(run["id"])
    long = api.post(f"/runs/{run['id']}/pause", {"reason": "x" * (PAUSE_REASON_MAX + 1)})
    assert long.status_code == 422, long.content
    assert commit_count(run["id"]) == commits
    fits = api.post(f"/runs/{run['id']}/pause", {"reason": "x" * PAUSE_REASON_MAX})
    assert fits.status_code == 200, fits.content
    note = {"kind": "pause", "note": "y" * (PAUSE_REASON_MAX + 1)}
    refused = api.post(f"/runs/{run['id']}/resume", note)
    assert (refused.status_code, error_of(refused)["code"]) == (422, "invalid_commit")
    assert commit_count(run["id"]) == commits + 1
