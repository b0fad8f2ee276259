"""Reconciliation of Indeterminate calls whose effect may have started."""

from __future__ import annotations

import pytest
from django.urls import reverse

from runtime.models import LateEvidence, ReconciliationRecord, Run, ThreadCommit

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


def post(client, call, htmx=True, **data):
    return client.post(
        reverse("console:reconcile_call", args=[call.call_id]),
        {f"{call.call_id}-{k}": v for k, v in data.items()},
        headers=HX if htmx else {},
    )


def test_page_lists_calls_that_may_have_started(viewer, indeterminate_call, approval_run, operator):
    run, call = indeterminate_call
    # a call sealed before any attempt needs no reconciliation and is not listed
    other, _ = approval_run
    operator.post(reverse("console:cancel", args=[other.run_id]), {"confirm": "on"})
    LateEvidence.objects.create(
        call_id=call.call_id, result='{"recorded": "payment-7"}', worker="worker-crashed"
    )
    response = viewer.get(reverse("console:reconcile"))
    html = response.content.decode()
    assert [c.call.id for c in response.context["cards"]] == [call.call_id]
    assert call.operation_id in html
    assert "ledger_once" in html and "payment-7" in html
    assert "Attempt 1" in html and "worker-crashed" in html
    assert "Late evidence from worker" in html and "&quot;recorded&quot;" in html
    assert "may have taken effect" in html  # the published error result
    assert 'name="' + call.call_id + '-outcome"' not in html  # viewers get no form


def test_record_applied_needs_evidence(operator, indeterminate_call):
    _, call = indeterminate_call
    response = post(operator, call, outcome="applied")
    assert response.status_code == 400
    assert b"Applied needs evidence" in response.content
    assert not ReconciliationRecord.objects.exists()
    assert post(operator, call, outcome="maybe").status_code == 400


def test_record_an_outcome(operator, indeterminate_call):
    run, call = indeterminate_call
    response = post(operator, call, outcome="applied", evidence="ledger row 7 <b>present</b>")
    assert response.status_code == 200
    html = response.content.decode()
    record = ReconciliationRecord.objects.get()
    assert (record.outcome, record.actor, record.call_id) == ("applied", "olga", call.call_id)
    assert f"Outcome recorded as commit #{record.seq}." in html
    assert "by <b>olga</b>" in html
    assert "ledger row 7 &lt;b&gt;present&lt;/b&gt;" in html
    note = ThreadCommit.objects.get(seq=record.seq, thread_id=record.thread_id)
    assert note.run_id is None and note.actor == "olga"
    # the call leaves the default list, stays under "all", and the run page shows the record
    assert operator.get(reverse("console:reconcile")).context["cards"] == []
    assert len(operator.get(reverse("console:reconcile"), {"show": "all"}).context["cards"]) == 1
    page = operator.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert "Reconciliations" in page and "outcome-applied" in page and "<b>olga</b>" in page
    assert "reconciled call" in page  # the thread note is in the run's commit log


def test_record_with_a_follow_up_run(operator, indeterminate_call):
    run, call = indeterminate_call
    response = post(operator, call, outcome="not_applied", follow_up_agent="demo")
    assert response.status_code == 200
    follow = Run.objects.exclude(id=run.run_id).get()
    assert follow.thread_id == Run.objects.get(id=run.run_id).thread_id
    assert follow.created_by == "olga"
    assert b"follow-up run started" in response.content
    assert reverse("console:run", args=[follow.id]).encode() in response.content
    doc_messages = follow.messages.values_list("content", flat=True)
    assert any("outcome not_applied" in m for m in doc_messages)


def test_follow_up_refused_while_the_thread_has_an_active_run(operator, indeterminate_call):
    run, call = indeterminate_call
    thread_id = Run.objects.get(id=run.run_id).thread_id
    from runtime import operations

    operations.start_run(agent="demo", input="busy", thread_id=thread_id, actor="x")
    response = post(operator, call, outcome="unknown", follow_up_agent="demo")
    assert response.status_code == 409
    assert b"Not recorded: the thread has an active run" in response.content
    assert ReconciliationRecord.objects.count() == 0  # note and follow-up land together


def test_reconcile_without_htmx(operator, indeterminate_call):
    _, call = indeterminate_call
    response = post(operator, call, htmx=False, outcome="unknown")
    assert response.status_code == 302 and response["Location"] == reverse("console:reconcile")
    bad = post(operator, call, htmx=False, outcome="applied")
    assert bad.status_code == 400 and b"<html" in bad.content


def test_reconcile_unknown_or_unsuitable_call_404(operator, approval_run):
    run, _ = approval_run
    assert operator.post(reverse("console:reconcile_call", args=["nope"]), {}).status_code == 404
    live_call = run.calls[0]  # awaiting, not Indeterminate
    assert post(operator, live_call, outcome="unknown").status_code == 404
