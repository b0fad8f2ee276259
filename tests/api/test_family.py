"""Child runs and timers on the API: the run document's ``parent``, ``children``, open
``tickets`` and a timer's ``due_at``; ``GET /runs?parent=``; firing a timer through resume;
what a person may not answer (a delegation ticket, a timer's deny: 409
``ticket_not_answerable``, nothing written)."""

from __future__ import annotations

from datetime import datetime

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from console.api.events import stream_run
from runtime.models import Run, ThreadCommit, Ticket
from runtime.worker import Worker
from tests.api.conftest import error_of
from tests.api.sse import parse

pytestmark = pytest.mark.django_db(transaction=True)


def drive() -> None:
    """Claim and drive runs with the real Worker (which releases each lease) until idle."""
    worker = Worker(worker_id="api-tests", until_idle=True)
    while worker.step():
        pass


GATED_CHILD = {
    "input": "record g",
    "script": {
        "steps": [
            {"tool_calls": [{"name": "ledger_approval", "arguments": {"key": "g"}}]},
            {"text": "child done"},
        ]
    },
}


def test_parent_and_children_documents(api, start):
    parent = start(
        {"tool_calls": [{"name": "delegate", "arguments": GATED_CHILD}]}, {"text": "done"}
    )
    drive()
    document = api.get(f"/runs/{parent['id']}").json()
    assert (document["state"], document["parent"], document["depth"]) == ("awaiting", None, 0)
    (child,) = document["children"]
    (call,) = document["batches"][0]["calls"]
    assert child["agent"] == "demo" and child["state"] == "awaiting"
    assert child["call_id"] == call["call_id"]
    assert document["ticket"]["kind"] == "delegation"
    assert document["ticket"]["request"]["child_run_id"] == child["id"]
    assert [t["id"] for t in document["tickets"]] == [document["ticket"]["id"]]

    child_doc = api.get(f"/runs/{child['id']}").json()
    assert child_doc["parent"] == {"run": parent["id"], "call": call["call_id"]}
    assert (child_doc["depth"], child_doc["children"]) == (1, [])
    assert child_doc["ticket"]["kind"] == "approval"

    listed = api.get(f"/runs?parent={parent['id']}").json()["items"]
    assert [r["id"] for r in listed] == [child["id"]]
    assert api.get(f"/runs?parent={child['id']}").json()["items"] == []

    answered = api.post(
        f"/runs/{child['id']}/resume",
        {"ticket_id": child_doc["ticket"]["id"], "kind": "approval", "decision": "approve"},
    )
    assert answered.status_code == 200, answered.content
    drive()
    document = api.get(f"/runs/{parent['id']}").json()
    assert (document["state"], document["end_cause"]) == ("ended", "natural")
    assert document["batches"][0]["calls"][0]["result"] == "child done"
    assert document["children"][0]["end_cause"] == "natural"


def _commits() -> int:
    return ThreadCommit.objects.count()


@pytest.mark.parametrize(
    "answer",
    [
        {"decision": "deny"},
        {"input": {"answer": "made up"}},
        {"result": "made up"},
        {"decision": "approve"},
    ],
)
@pytest.mark.parametrize("waiting_on", ["delegation", "approval"])
def test_a_delegation_ticket_is_answered_only_by_its_child(api, start, answer, waiting_on):
    """A person's answer to a delegation ticket is refused while the child works, whether the
    parent is parked on that ticket or waits on another (an approval after it): 409
    ``ticket_not_answerable`` naming the child to cancel, nothing written. Cancelling the
    child (what the refusal says to do) answers the ticket with an error."""
    steps = [{"name": "delegate", "arguments": GATED_CHILD}]
    if waiting_on == "approval":
        steps.append({"name": "ledger_approval", "arguments": {"key": "p"}})
    parent = start({"tool_calls": steps}, {"text": "done"})
    drive()
    document = api.get(f"/runs/{parent['id']}").json()
    (child,) = document["children"]
    (delegation,) = [t for t in document["tickets"] if t["kind"] == "delegation"]
    assert (document["state"], document["ticket"]["kind"]) == ("awaiting", waiting_on)
    seen = _commits()

    refused = api.post(
        f"/runs/{parent['id']}/resume",
        {"ticket_id": delegation["id"], "kind": "delegation", **answer},
    )
    assert refused.status_code == 409, refused.content
    error = error_of(refused)
    assert error["code"] == "ticket_not_answerable"
    assert error["detail"]["child_run_id"] == child["id"]
    assert error["detail"]["allowed"] == []
    assert error["detail"]["run"]["version"] == document["version"]
    assert f"cancel the child run {child['id']}" in error["message"]
    assert _commits() == seen
    assert Ticket.objects.get(id=delegation["id"]).state == "open"
    assert Run.objects.get(id=child["id"]).state == "awaiting"  # the child is still at work

    cancelled = api.post(f"/runs/{child['id']}/cancel", {"reason": "not needed"})
    assert cancelled.status_code == 200, cancelled.content
    document = api.get(f"/runs/{parent['id']}").json()
    call = document["batches"][0]["calls"][0]
    assert call["phase"] == "completed" and call["is_error"]
    assert child["id"] in call["result"] and "cancelled" in call["result"]
    assert Ticket.objects.get(id=delegation["id"]).state == "consumed"


def test_a_timer_is_fired_not_denied(api, start):
    """A person may fire a timer now or cancel its run; a deny is 409
    ``ticket_not_answerable`` (the timer fires by itself), a result 409 ``kind_mismatch``,
    and neither writes anything."""
    run = start({"tool_calls": [{"name": "wait", "arguments": {"seconds": 3600}}]}, {"text": "ok"})
    drive()
    ticket = api.get(f"/runs/{run['id']}").json()["ticket"]
    seen = _commits()
    denied = api.post(
        f"/runs/{run['id']}/resume",
        {"ticket_id": ticket["id"], "kind": "timer", "decision": "deny", "note": "no"},
    )
    assert denied.status_code == 409, denied.content
    error = error_of(denied)
    assert error["code"] == "ticket_not_answerable"
    assert (error["detail"]["allowed"], error["detail"]["due_at"]) == (
        ["approve"],
        ticket["due_at"],
    )
    assert ticket["due_at"] in error["message"] and "cancel the run" in error["message"]
    supplied = api.post(
        f"/runs/{run['id']}/resume", {"ticket_id": ticket["id"], "kind": "timer", "result": "x"}
    )
    assert supplied.status_code == 409 and error_of(supplied)["code"] == "kind_mismatch"
    as_approval = api.post(
        f"/runs/{run['id']}/resume",
        {"ticket_id": ticket["id"], "kind": "approval", "decision": "approve"},
    )
    error = error_of(as_approval)
    assert (error["code"], error["detail"]["allowed"]) == ("kind_mismatch", ["approve"])
    assert "(its decisions: approve)" in error["message"]
    assert _commits() == seen
    assert Ticket.objects.get(id=ticket["id"]).state == "open"


def test_timer_due_at_and_fire_now(api, start):
    run = start({"tool_calls": [{"name": "wait", "arguments": {"seconds": 3600}}]}, {"text": "ok"})
    drive()
    document = api.get(f"/runs/{run['id']}").json()
    ticket = document["ticket"]
    assert ticket["kind"] == "timer" and ticket["request"] == {"due_at": ticket["due_at"]}
    due = datetime.fromisoformat(ticket["due_at"])
    assert due.utcoffset().total_seconds() == 0
    fired = api.post(
        f"/runs/{run['id']}/resume",
        {"ticket_id": ticket["id"], "kind": "timer", "decision": "approve", "note": "now"},
    )
    assert fired.status_code == 200, fired.content
    assert fired.json()["state"] == "running"
    again = api.post(
        f"/runs/{run['id']}/resume",
        {"ticket_id": ticket["id"], "kind": "timer", "decision": "approve"},
    )
    assert again.status_code == 409 and again.json()["error"]["code"] == "ticket_consumed"
    drive()
    document = api.get(f"/runs/{run['id']}").json()
    assert (document["state"], document["end_cause"]) == ("ended", "natural")
    assert document["batches"][0]["calls"][0]["result"] == '{"waited": 3600.0}'


@pytest.mark.asyncio
async def test_the_parents_stream_carries_the_delivery(api, start):
    """The parent's SSE stream carries the commit that delivered its child's terminus."""
    child = {"input": "x", "script": {"steps": [{"text": "forty-two"}]}}
    parent = await sync_to_async(start)(
        {"tool_calls": [{"name": "delegate", "arguments": child}]}, {"text": "done"}
    )
    try:
        await sync_to_async(drive)()
        chunks = [c async for c in stream_run(parent["id"], cursor=0, live=False, timeout=10)]
    finally:
        await sync_to_async(connections.close_all)()
    commits = [e for e in parse("".join(chunks).split("\n")) if e.event == "commit"]
    (delivery,) = [e for e in commits if e.data["actor"].startswith("child:")]
    (event,) = delivery.data["events"]
    assert (event["type"], event["decision"], event["input"]["answer"]) == (
        "CallResumed",
        "input",
        "forty-two",
    )
