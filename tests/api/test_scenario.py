"""The issue's scenario, driven only through HTTP against daphne, with the demo agent, a
script and the real worker (``runtime_worker --until-idle``) in another process."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from runtime.demo.models import LedgerEffect
from tests.api.conftest import SCENARIO

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def http(daphne, make_user):
    _, token = make_user("olivia", "read", "resume", "operate")
    client = httpx.Client(
        base_url=f"{daphne}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    yield client
    client.close()


def wait_for(check: Callable[[], Any], timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return found


def start_and_wait_for_approval(http, run_worker) -> tuple[dict, dict]:
    response = http.post(
        "/runs",
        json={"agent": "demo", "input": "record a, b and c", "metadata": {"script": SCENARIO}},
    )
    assert response.status_code == 201
    run = response.json()
    run_worker()

    def open_ticket():
        items = http.get("/tickets", params={"state": "open"}).json()["items"]
        return next((t for t in items if t["run_id"] == run["id"]), None)

    ticket = wait_for(open_ticket)
    assert ticket["kind"] == "approval"
    assert ticket["call"]["name"] == "ledger_approval"
    waiting = http.get(f"/runs/{run['id']}").json()
    assert waiting["state"] == "awaiting"
    assert [c["phase"] for c in waiting["active_batch"]["calls"]] == [
        "completed",
        "awaiting",
        "requested",
    ]
    return run, ticket


def results_in_call_order(document: dict) -> list[tuple[str, str, bool]]:
    (batch,) = document["batches"]
    assert batch["finalized"] is True
    assert [c["index"] for c in batch["calls"]] == [0, 1, 2]
    return [(c["name"], c["phase"], c["is_error"]) for c in batch["calls"]]


def ledger(run_id: str) -> dict[str, int]:
    return dict(LedgerEffect.objects.filter(run_id=run_id).values_list("key", "applied"))


def test_start_approve_and_read_the_result_in_call_order(http, run_worker):
    run, ticket = start_and_wait_for_approval(http, run_worker)
    response = http.post(
        f"/runs/{run['id']}/resume",
        json={"ticket_id": ticket["id"], "kind": "approval", "decision": "approve", "note": "ok"},
    )
    assert response.status_code == 200
    assert response.json()["state"] == "running"
    run_worker()

    done = http.get(f"/runs/{run['id']}").json()
    assert (done["state"], done["end_cause"]) == ("ended", "natural")
    assert results_in_call_order(done) == [
        ("ledger_once", "completed", False),
        ("ledger_approval", "completed", False),
        ("ledger_replay", "completed", False),
    ]
    tools = [m for m in done["messages"] if m["role"] == "tool"]
    calls = done["batches"][0]["calls"]
    assert [m["tool_call_id"] for m in tools] == [c["tool_call_id"] for c in calls]
    for message, key in zip(tools, "abc", strict=True):
        assert f'"recorded": "{key}"' in message["content"]
    last = done["messages"][-1]
    assert (last["role"], last["content"]) == ("assistant", "done")
    assert ledger(run["id"]) == {"a": 1, "b": 1, "c": 1}  # each effect exactly once


def test_start_deny_and_read_the_result_in_call_order(http, run_worker):
    run, ticket = start_and_wait_for_approval(http, run_worker)
    response = http.post(
        f"/runs/{run['id']}/resume",
        json={
            "ticket_id": ticket["id"],
            "kind": "approval",
            "decision": "deny",
            "note": "not today",
        },
    )
    assert response.status_code == 200
    run_worker()

    done = http.get(f"/runs/{run['id']}").json()
    assert (done["state"], done["end_cause"]) == ("ended", "natural")
    assert results_in_call_order(done) == [
        ("ledger_once", "completed", False),
        ("ledger_approval", "completed", True),
        ("ledger_replay", "completed", False),
    ]
    assert "Denied by operator: not today" in done["batches"][0]["calls"][1]["result"]
    assert ledger(run["id"]) == {"a": 1, "c": 1}  # the denied tool never ran


def test_a_resume_replayed_with_its_idempotency_key(http, run_worker):
    run, ticket = start_and_wait_for_approval(http, run_worker)
    body = {"ticket_id": ticket["id"], "kind": "approval", "decision": "approve"}
    key = {"Idempotency-Key": f"approve-{ticket['id']}"}
    first = http.post(f"/runs/{run['id']}/resume", json=body, headers=key)
    assert first.status_code == 200
    log = http.get(f"/runs/{run['id']}/commits").json()["items"]

    again = http.post(f"/runs/{run['id']}/resume", json=body, headers=key)
    assert again.status_code == 200
    assert again.json() == first.json()
    assert http.get(f"/runs/{run['id']}/commits").json()["items"] == log  # nothing written

    other = http.post(f"/runs/{run['id']}/resume", json={**body, "decision": "deny"}, headers=key)
    assert other.status_code == 422
    assert other.json()["error"]["code"] == "idempotency_key_reused"

    run_worker()
    # After the run moved on, the key still gets the first answer, and nothing is re-applied.
    late = http.post(f"/runs/{run['id']}/resume", json=body, headers=key)
    assert late.status_code == 200 and late.json() == first.json()
    assert http.get(f"/runs/{run['id']}").json()["end_cause"] == "natural"
    assert ledger(run["id"]) == {"a": 1, "b": 1, "c": 1}


def test_a_wrong_kind_resume_is_refused_and_writes_nothing(http, run_worker):
    run, ticket = start_and_wait_for_approval(http, run_worker)
    before = http.get(f"/runs/{run['id']}").json()
    log = http.get(f"/runs/{run['id']}/commits").json()["items"]
    response = http.post(
        f"/runs/{run['id']}/resume",
        json={"ticket_id": ticket["id"], "kind": "input", "input": {"answer": 42}},
    )
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "kind_mismatch"
    assert error["detail"]["run"] == before
    assert http.get(f"/runs/{run['id']}").json() == before
    assert http.get(f"/runs/{run['id']}/commits").json()["items"] == log
    assert http.get("/tickets").json()["items"][0]["id"] == ticket["id"]  # still open
