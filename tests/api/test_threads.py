"""``/threads``: create, read (committed messages and runs), start a run on one."""

from __future__ import annotations

import pytest

from runtime.models import Thread
from tests.api.conftest import error_of

pytestmark = pytest.mark.django_db


def test_create_thread_is_201_with_its_id(api):
    response = api.post("/threads", {"metadata": {"customer": "acme"}})
    assert response.status_code == 201
    thread = response.json()
    assert Thread.objects.filter(id=thread["id"]).exists()
    assert thread["version"] == 0
    assert thread["metadata"] == {"customer": "acme"}
    assert thread["messages"] == [] and thread["runs"] == [] and thread["active_run_id"] is None


def test_create_thread_takes_no_body(api):
    assert api.post("/threads").status_code == 201


def test_start_runs_on_a_thread_and_read_it(api, start):
    thread = api.post("/threads", {}).json()
    run = start({"text": "x"}, thread=thread["id"], text="first")
    assert run["thread_id"] == thread["id"]
    response = api.get(f"/threads/{thread['id']}")
    assert response.status_code == 200
    read = response.json()
    assert read["active_run_id"] == run["id"]
    assert read["version"] == 1
    assert [r["id"] for r in read["runs"]] == [run["id"]]
    assert [(m["run_id"], m["role"], m["content"]) for m in read["messages"]] == [
        (run["id"], "user", "first")
    ]


def test_a_thread_with_an_unended_run_refuses_another_with_409(api, start):
    run = start({"text": "x"})
    before = api.get(f"/threads/{run['thread_id']}").json()
    response = api.post(f"/threads/{run['thread_id']}/runs", {"agent": "demo", "input": "second"})
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "run_active"
    assert error["detail"]["active_run_id"] == run["id"]
    assert api.get(f"/threads/{run['thread_id']}").json() == before


def test_a_thread_takes_a_new_run_once_the_last_one_ended(api, start):
    run = start({"text": "x"})
    api.post(f"/runs/{run['id']}/cancel", {})
    second = start({"text": "y"}, thread=run["thread_id"])
    runs = api.get(f"/threads/{run['thread_id']}").json()["runs"]
    assert [r["id"] for r in runs] == [run["id"], second["id"]]


def test_unknown_agent_on_a_thread_is_404_with_known_agents(api):
    thread = api.post("/threads", {}).json()
    response = api.post(f"/threads/{thread['id']}/runs", {"agent": "ghost", "input": "x"})
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "unknown_agent"
    assert "demo" in error["detail"]["known"]


def test_unknown_thread_is_404(api):
    assert api.get("/threads/" + "1" * 32).status_code == 404
    response = api.post("/threads/" + "1" * 32 + "/runs", {"agent": "demo", "input": "x"})
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def test_malformed_thread_bodies_are_422(api):
    assert api.post("/threads", {"metadata": "x"}).status_code == 422
    assert api.post("/threads", {"other": 1}).status_code == 422
