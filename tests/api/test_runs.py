"""``/runs``: start, list (filters, keyset pages), read, the log, cancel."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.agents import registry
from runtime.models import Run, ThreadCommit
from tests.api.conftest import APPROVAL, commit_count, error_of

pytestmark = pytest.mark.django_db


def test_start_run_on_a_new_thread_returns_201_and_the_run(api):
    response = api.post("/runs", {"agent": "demo", "input": "hello", "metadata": {"k": 1}})
    assert response.status_code == 201
    run = response.json()
    assert run["state"] == "running"
    assert run["agent"] == "demo"
    assert run["metadata"] == {"k": 1}
    assert run["version"] == 1
    assert run["messages"] == [
        {
            "role": "user",
            "content": "hello",
            "tool_call_id": None,
            "tool_calls": [],
            "name": None,
            "seq": 1,
        }
    ]
    assert run["ticket"] is None and run["batches"] == [] and run["active_batch"] is None
    assert run["created_by"] == "olivia"
    assert ThreadCommit.objects.get(run_id=run["id"]).actor == "olivia"


def test_start_run_takes_input_messages(api):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    response = api.post("/runs", {"agent": "demo", "input": messages})
    assert response.status_code == 201
    assert [(m["role"], m["content"]) for m in response.json()["messages"]] == [
        ("system", "be brief"),
        ("user", "hi"),
    ]


def test_unknown_agent_is_404_listing_the_known_agents(api):
    response = api.post("/runs", {"agent": "nobody", "input": "hi"})
    assert response.status_code == 404
    error = error_of(response)
    assert error["code"] == "unknown_agent"
    assert error["detail"]["known"] == sorted(registry())
    assert "demo" in error["detail"]["known"]
    # The message alone tells a new user where agents come from (issue 21, item 7).
    assert "the known agents are assistant, demo." in error["message"]
    assert "RUNTIME_AGENTS setting" in error["message"]
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    "body",
    [
        {"agent": "demo"},
        {"agent": "demo", "input": ""},
        {"agent": "demo", "input": []},
        {"agent": "demo", "input": [{"role": "assistant", "content": "x"}]},
        {"agent": "demo", "input": "nul \u0000 byte"},
        {"agent": "demo", "input": "x", "metadata": {"a": "nul \u0000"}},
        {"agent": "demo", "input": "x", "metadata": []},
        {"agent": "demo", "input": "x", "extra": 1},
        {"agent": "", "input": "x"},
    ],
)
def test_malformed_start_is_422(api, body):
    response = api.post("/runs", body)
    assert response.status_code == 422, response.content
    assert error_of(response)["code"] == "validation_error"
    assert not Run.objects.exists()


def test_a_malformed_script_is_422_script_refused(api):
    body = {"agent": "demo", "input": "x", "metadata": {"script": {"steps": [{"bogus": 1}]}}}
    response = api.post("/runs", body)
    assert response.status_code == 422
    assert error_of(response)["code"] == "script_refused"
    assert not Run.objects.exists()


def test_a_script_refusal_names_each_problem_where_it_is(api):
    steps = [{"text": "ok"}, {"tool_calls": []}, {"error": "sometimes"}, {"bogus": 1}]
    body = {"agent": "demo", "input": "x", "metadata": {"script": {"steps": steps}}}
    error = error_of(api.post("/runs", body))
    locations = [problem["loc"] for problem in error["detail"]["errors"]]
    assert locations == [["steps", 1, "tool_calls"], ["steps", 2, "error"], ["steps", 3]]
    assert "steps.3: a step is an object with text, tool_calls or error" in error["message"]
    assert "{'type'" not in error["message"]  # readable text, not a Python repr


@pytest.mark.parametrize(
    ("steps", "said"),
    [
        ([{"text": "ok", "chunks": True}], "steps.0.chunks: Input should be a valid integer"),
        ([{"text": "ok", "delay_ms": "5"}], "steps.0.delay_ms: Input should be a valid integer"),
        (
            [{"text": "done"}, {"tool_calls": [{"name": "ledger_once"}]}],
            "steps.1: never used: steps.0 answers with text only, which ends the run",
        ),
        (
            [{"error": "fatal"}, {"text": "never"}],
            "steps.1: never used: steps.0 fails for good, which ends the run",
        ),
    ],
    ids=["bool-as-int", "string-as-int", "after-text", "after-fatal"],
)
def test_a_script_that_cannot_mean_what_it_says_is_refused(api, steps, said):
    body = {"agent": "demo", "input": "x", "metadata": {"script": {"steps": steps}}}
    response = api.post("/runs", body)
    assert response.status_code == 422
    error = error_of(response)
    assert error["code"] == "script_refused"
    assert said in error["message"]
    assert not Run.objects.exists()


def test_scripts_are_refused_when_disabled(api, settings):
    settings.RUNTIME_ALLOW_SCRIPTED = False
    body = {"agent": "demo", "input": "x", "metadata": {"script": {"steps": []}}}
    response = api.post("/runs", body)
    assert response.status_code == 422
    assert error_of(response)["code"] == "script_refused"


def test_get_run_is_the_committed_run_document(api, awaiting):
    run = awaiting("approval")
    response = api.get(f"/runs/{run['id']}")
    assert response.status_code == 200
    document = response.json()
    assert document["state"] == "awaiting"
    assert document["end_cause"] is None
    assert document["version"] == run["version"]
    assert document["committed_at"]
    ticket = document["ticket"]
    assert ticket["kind"] == "approval"
    assert ticket["request"]["tool"] == "ledger_approval"
    assert ticket["request"]["arguments"] == {"key": "b"}
    assert "schema" in ticket and ticket["schema"] is None
    batch = document["active_batch"]
    assert batch == document["batches"][-1] and batch["finalized"] is False
    (call,) = batch["calls"]
    assert call["phase"] == "awaiting"
    assert call["attempt"] == 0
    assert call["operation_id"]
    assert call["policy"] == "indeterminate"
    assert call["arguments"] == {"key": "b"}
    assert call["result"] is None
    assert ticket["call_id"] == call["call_id"]


def test_get_run_matches_the_cli_document(api, awaiting):
    from runtime.documents import run_document

    run = awaiting("input")
    document = api.get(f"/runs/{run['id']}").json()
    shared = run_document(run["id"])
    assert {k: document[k] for k in shared} == shared
    assert document["ticket"]["schema"]["required"] == ["n"]


def test_unknown_run_is_404(api):
    response = api.get("/runs/" + "0" * 32)
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def test_a_malformed_run_id_is_422(api):
    response = api.get("/runs/not%20an%20id")
    assert response.status_code == 422
    assert error_of(response)["code"] == "validation_error"


# -- listing ----------------------------------------------------------------------------------


def test_list_runs_newest_first_with_keyset_pages(api, start):
    ids = [start({"text": "x"}, text=f"run {i}")["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        response = api.get("/runs", **params)
        assert response.status_code == 200
        page = response.json()
        assert len(page["items"]) <= 2
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))


def test_a_page_is_stable_when_runs_are_added(api, start):
    first = [start({"text": "x"})["id"] for _ in range(3)]
    page = api.get("/runs", limit=2).json()
    start({"text": "x"})  # newer than everything listed: never shifts the next page
    rest = api.get("/runs", limit=10, cursor=page["next_cursor"]).json()
    assert [i["id"] for i in page["items"]] + [i["id"] for i in rest["items"]] == first[::-1]


def test_list_runs_filters(api, start, awaiting):
    waiting = awaiting("approval")
    running = start({"text": "x"})
    ended = start({"text": "x"})
    api.post(f"/runs/{ended['id']}/cancel", {"reason": "test"})

    def ids(**params):
        response = api.get("/runs", **params)
        assert response.status_code == 200, response.content
        return {item["id"] for item in response.json()["items"]}

    assert ids(state="awaiting") == {waiting["id"]}
    assert ids(state="running") == {running["id"]}
    assert ids(state="ended") == {ended["id"]}
    assert ids(end_cause="cancelled") == {ended["id"]}
    assert ids(end_cause="natural") == set()
    assert ids(agent="demo") == {waiting["id"], running["id"], ended["id"]}
    assert ids(agent="other") == set()
    assert ids(thread=running["thread_id"]) == {running["id"]}


@pytest.mark.parametrize(
    "params",
    [
        {"state": "sleeping"},
        {"end_cause": "boredom"},
        {"limit": 0},
        {"limit": 201},
        {"cursor": "***"},
        {"thread": "a b"},
    ],
)
def test_bad_list_parameters_are_422(api, params):
    response = api.get("/runs", **params)
    assert response.status_code == 422
    assert error_of(response)["code"] == "validation_error"


@pytest.mark.parametrize("cursor", ["bm90IGpzb24", "WzEsMl0", "WyJ4IiwiYSJd"])
def test_a_cursor_not_issued_here_is_422_invalid_cursor(api, cursor):
    response = api.get("/runs", cursor=cursor)
    assert response.status_code == 422
    assert error_of(response)["code"] == "invalid_cursor"


# -- the log ----------------------------------------------------------------------------------


def test_commits_lists_the_runs_log_entries_after_a_sequence(api, awaiting):
    run = awaiting("approval")
    response = api.get(f"/runs/{run['id']}/commits")
    assert response.status_code == 200
    page = response.json()
    seqs = [c["seq"] for c in page["items"]]
    assert seqs == sorted(seqs) and seqs[-1] == run["version"]
    assert page["next_after"] is None
    first, last = page["items"][0], page["items"][-1]
    assert first["disposition"]["state"] == "running"
    assert first["events"][0]["type"] == "RunActivated"
    assert last["disposition"]["state"] == "awaiting"
    assert last["disposition"]["ticket"]["kind"] == "approval"
    assert [e["type"] for e in last["events"]] == ["CallAwaiting"]

    after = api.get(f"/runs/{run['id']}/commits", after=seqs[0]).json()
    assert [c["seq"] for c in after["items"]] == seqs[1:]
    paged = api.get(f"/runs/{run['id']}/commits", limit=1).json()
    assert [c["seq"] for c in paged["items"]] == seqs[:1]
    assert paged["next_after"] == seqs[0]


def test_commits_of_a_run_leave_out_other_runs_on_the_thread(api, start):
    first = start({"text": "x"})
    api.post(f"/runs/{first['id']}/cancel", {})
    second = start({"text": "y"}, thread=first["thread_id"])
    items = api.get(f"/runs/{second['id']}/commits").json()["items"]
    assert [c["run_id"] for c in items] == [second["id"]]
    assert items[0]["seq"] == 3  # sequences are per thread


def test_commits_of_an_unknown_run_is_404(api):
    response = api.get("/runs/" + "f" * 32 + "/commits")
    assert response.status_code == 404


@pytest.mark.parametrize("after", [-1, 2**63, "x"])
def test_commits_after_out_of_range_is_422(api, start, after):
    run = start({"text": "x"})
    response = api.get(f"/runs/{run['id']}/commits", after=after)
    assert response.status_code == 422


# -- cancel -----------------------------------------------------------------------------------


def test_cancel_returns_the_terminus_and_a_repeat_writes_nothing(api, awaiting):
    run = awaiting("approval")
    response = api.post(f"/runs/{run['id']}/cancel", {"reason": "no longer needed"})
    assert response.status_code == 200
    terminus = response.json()
    assert terminus["state"] == "ended"
    assert terminus["end_cause"] == "cancelled"
    assert terminus["ticket"] is None
    (call,) = terminus["batches"][0]["calls"]
    assert call["phase"] == "indeterminate"
    assert call["effect_may_have_started"] is False
    assert terminus["active_batch"] is None
    commits = commit_count(run["id"])
    assert ThreadCommit.objects.filter(run_id=run["id"]).last().actor == "olivia"

    again = api.post(f"/runs/{run['id']}/cancel", {"reason": "again"})
    assert again.status_code == 200
    assert again.json() == terminus
    assert commit_count(run["id"]) == commits


def test_cancel_takes_no_body(api, start):
    run = start({"text": "x"})
    response = api.post(f"/runs/{run['id']}/cancel")
    assert response.status_code == 200
    assert response.json()["end_cause"] == "cancelled"


def test_cancel_with_an_idempotency_key(api, start):
    run = start({"text": "x"})
    key = {"Idempotency-Key": "cancel-1"}
    first = api.post(f"/runs/{run['id']}/cancel", {"reason": "r"}, headers=key)
    again = api.post(f"/runs/{run['id']}/cancel", {"reason": "r"}, headers=key)
    assert first.status_code == again.status_code == 200
    assert first.json() == again.json()
    other = api.post(f"/runs/{run['id']}/cancel", {"reason": "other"}, headers=key)
    assert other.status_code == 422
    assert error_of(other)["code"] == "idempotency_key_reused"


def test_cancel_an_unknown_run_is_404(api):
    response = api.post("/runs/" + "a" * 32 + "/cancel", {})
    assert response.status_code == 404
    assert error_of(response)["code"] == "not_found"


def test_a_script_step_is_visible_in_the_run(api, start):
    run = start(APPROVAL, {"text": "done"})
    assert run["metadata"]["script"]["steps"][0] == APPROVAL


def test_the_run_list_carries_each_runs_input_line_and_why_it_waits(api):
    """Issue 32: a client reads a page of runs without one request per row."""
    long = "x" * 500
    first = api.post("/runs", {"agent": "demo", "input": "Refund order 7\nsecond line"}).json()
    second = api.post("/runs", {"agent": "demo", "input": long}).json()
    Run.objects.filter(id=second["id"]).update(
        wait_until=timezone.now() + timedelta(minutes=1), waiting="waiting for the model: ..."
    )
    items = {item["id"]: item for item in api.get("/runs").json()["items"]}
    assert items[first["id"]]["input"] == "Refund order 7"
    assert items[first["id"]]["waiting"] is None
    assert items[second["id"]]["input"] == "x" * 400 + "…"
    assert items[second["id"]]["waiting"] == "waiting for the model: ..."
    thread = api.get(f"/threads/{first['thread_id']}").json()
    assert thread["runs"][0]["input"] == "Refund order 7"
