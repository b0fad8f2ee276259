"""Reconciliation of Indeterminate calls whose effect may have started."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from runtime.models import LateEvidence, ReconciliationRecord, Run, ThreadCommit, ToolCallRecord

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


def _sealed(new_run, name: str, *, effects: str = "once", end: str = "fail", agent_input="x"):
    """A run whose one call of ``name`` started, then the run ended (failed or cancelled)."""
    run = new_run(input=agent_input)
    (call,) = run.open_batch({"name": name, "arguments": {"key": "k"}, "effects": effects})
    run.execute(call)
    if end == "fail":
        run.fail()
    else:
        from runtime import operations

        operations.cancel(run.run_id, actor="olga", reason="not needed")
    return run, call


def test_a_started_call_without_external_effects_needs_no_check(viewer, new_run):
    """Issue 22, item 2: a cancelled `wait` says "nothing to check" and is not queued."""
    _, effect = _sealed(new_run, "ledger_once", end="cancel")
    waiting, wait_call = _sealed(new_run, "wait", effects="none", end="cancel")
    row = ToolCallRecord.objects.get(id=wait_call.call_id)
    assert (row.phase, row.effect_may_have_started, row.effects) == ("indeterminate", False, "none")
    assert row.result.startswith("No external effect; nothing to check: the run was cancelled")
    page = viewer.get(reverse("console:reconcile"))
    assert [c.call.id for c in page.context["cards"]] == [effect.call_id]
    assert page.context["pending_count"] == 1
    assert viewer.get(reverse("console:tab_count", args=["reconcile"])).context["n"] == 1
    runs = viewer.get(reverse("console:runs")).context["runs"]
    flagged = {r.id for r in runs if r.needs_reconciliation}
    assert waiting.run_id not in flagged and len(flagged) == 1
    run_page = viewer.get(reverse("console:run", args=[waiting.run_id])).content.decode()
    assert "No external effect; nothing to check" in run_page


def test_queue_filters_by_tool_agent_run_age_and_reason(viewer, new_run):
    failed, once = _sealed(new_run, "ledger_once")
    cancelled, replay = _sealed(new_run, "ledger_replay", effects="idempotent", end="cancel")
    ToolCallRecord.objects.filter(id=once.call_id).update(
        updated_at=timezone.now() - timedelta(hours=2)
    )

    def shown(**query) -> list[str]:
        page = viewer.get(reverse("console:reconcile"), query)
        assert page.status_code == 200
        return [c.call.id for c in page.context["cards"]]

    assert sorted(shown()) == sorted([once.call_id, replay.call_id])
    assert shown(tool="ledger_replay") == [replay.call_id]
    assert shown(agent="demo", tool="ledger_once") == [once.call_id]
    assert shown(agent="nobody") == []
    assert shown(run=failed.run_id[:10]) == [once.call_id]
    assert shown(older_than="60") == [once.call_id]
    assert shown(reason="cancelled") == [replay.call_id]
    assert shown(reason="failed") == [once.call_id]
    assert sorted(shown(reason="no-such-reason")) == sorted(shown())  # unknown values are ignored
    page = viewer.get(reverse("console:reconcile"), {"reason": "cancelled"}).content.decode()
    assert "run cancelled" in page and "1 call match these filters" in page


def test_bulk_not_applied_asks_first_naming_count_and_tools(operator, new_run):
    calls = [_sealed(new_run, "ledger_once")[1] for _ in range(2)]
    calls.append(_sealed(new_run, "ledger_replay", effects="idempotent")[1])
    url = reverse("console:reconcile_bulk")
    ids = [c.call_id for c in calls]
    ask = operator.post(url, {"call": ids, "scope": "selected"}, headers=HX)
    html = ask.content.decode()
    assert ask.status_code == 200 and not ReconciliationRecord.objects.exists()
    assert 'Record "not applied" for 3 calls?' in html
    assert "ledger_once ×2, ledger_replay" in html
    stale = operator.post(
        url, {"call": ids, "scope": "selected", "confirm": "yes", "expected": "2"}
    )
    assert b"changed since you were asked" in stale.content
    assert not ReconciliationRecord.objects.exists()
    done = operator.post(
        url,
        {"call": ids, "scope": "selected", "confirm": "yes", "expected": "3", "evidence": "none"},
        headers=HX,
    )
    assert "Recorded <b>not applied</b> for 3 of 3 calls" in done.content.decode()
    assert "rt:bulk-reconciled" in done["HX-Trigger"]
    records = ReconciliationRecord.objects.all()
    assert sorted(r.call_id for r in records) == sorted(ids)
    assert {(r.outcome, r.actor, r.evidence) for r in records} == {("not_applied", "olga", "none")}
    assert operator.get(reverse("console:reconcile")).context["cards"] == []


def test_bulk_not_applied_for_every_match_of_the_filters(operator, viewer, new_run):
    once = [_sealed(new_run, "ledger_once")[1] for _ in range(2)]
    replay = _sealed(new_run, "ledger_replay", effects="idempotent")[1]
    url = reverse("console:reconcile_bulk")
    assert viewer.post(url, {"scope": "matching"}).status_code == 403
    ask = operator.post(url, {"scope": "matching", "tool": "ledger_once"}, headers=HX)
    assert 'Record "not applied" for 2 calls?' in ask.content.decode()
    operator.post(
        url, {"scope": "matching", "tool": "ledger_once", "confirm": "yes", "expected": "2"}
    )
    assert sorted(ReconciliationRecord.objects.values_list("call_id", flat=True)) == sorted(
        c.call_id for c in once
    )
    left = operator.get(reverse("console:reconcile")).context["cards"]
    assert [c.call.id for c in left] == [replay.call_id]
    nothing = operator.post(url, {"scope": "selected"}, headers=HX)
    assert nothing.status_code == 400 and b"Select calls first" in nothing.content
