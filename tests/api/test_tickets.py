"""``GET /tickets``: the approval queue, oldest first."""

from __future__ import annotations

import pytest

from tests.api.conftest import error_of

pytestmark = pytest.mark.django_db


def test_open_tickets_oldest_first_with_run_and_call(api, awaiting):
    first = awaiting("approval")
    second = awaiting("input")
    response = api.get("/tickets", state="open")
    assert response.status_code == 200
    items = response.json()["items"]
    assert [t["id"] for t in items] == [first["ticket"]["id"], second["ticket"]["id"]]
    approval, question = items
    assert approval["kind"] == "approval" and approval["state"] == "open"
    assert approval["run_id"] == first["id"] and approval["thread_id"] == first["thread_id"]
    assert approval["agent"] == "demo"
    assert approval["call"]["name"] == "ledger_approval"
    assert approval["call"]["call_id"] == approval["call_id"]
    assert question["schema"]["required"] == ["n"]
    assert question["request"] == {"question": "How many?"}


def test_open_is_the_default_and_answered_tickets_leave_the_queue(api, awaiting):
    run = awaiting("approval")
    other = awaiting("approval")
    body = {"ticket_id": run["ticket"]["id"], "kind": "approval", "decision": "deny"}
    assert api.post(f"/runs/{run['id']}/resume", body).status_code == 200
    assert [t["id"] for t in api.get("/tickets").json()["items"]] == [other["ticket"]["id"]]
    consumed = api.get("/tickets", state="consumed").json()["items"]
    assert [(t["id"], t["decision"], t["closed_by"]) for t in consumed] == [
        (run["ticket"]["id"], "deny", "olivia")
    ]
    assert len(api.get("/tickets", state="all").json()["items"]) == 2


def test_a_cancelled_runs_ticket_is_void(api, awaiting):
    run = awaiting("approval")
    api.post(f"/runs/{run['id']}/cancel", {})
    assert api.get("/tickets").json()["items"] == []
    (void,) = api.get("/tickets", state="void").json()["items"]
    assert void["id"] == run["ticket"]["id"]


def test_tickets_filter_by_kind_and_run_and_page(api, awaiting):
    runs = [awaiting("approval"), awaiting("input"), awaiting("approval")]
    kinds = api.get("/tickets", kind="input").json()["items"]
    assert [t["run_id"] for t in kinds] == [runs[1]["id"]]
    mine = api.get("/tickets", run=runs[2]["id"]).json()["items"]
    assert [t["run_id"] for t in mine] == [runs[2]["id"]]
    page = api.get("/tickets", limit=2).json()
    rest = api.get("/tickets", limit=2, cursor=page["next_cursor"]).json()
    assert [t["run_id"] for t in page["items"] + rest["items"]] == [r["id"] for r in runs]
    assert rest["next_cursor"] is None


@pytest.mark.parametrize("params", [{"state": "pending"}, {"kind": "x"}, {"limit": 500}])
def test_bad_ticket_filters_are_422(api, params):
    response = api.get("/tickets", **params)
    assert response.status_code == 422
    assert error_of(response)["code"] == "validation_error"
