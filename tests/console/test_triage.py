"""Triage at scale without a browser (issue 11): context in lists, filters and keyset pages,
notes, bulk answers confirmed once, input forms in schema order without a preselected enum,
pinned run rows, unreconciled flags, explicit corrections, zoned times."""

from __future__ import annotations

import json
import re

import pytest
from django.urls import reverse

from console.views import tickets as ticket_views
from runtime import operations
from runtime.inventory import unreconciled_calls
from runtime.models import ReconciliationRecord, Ticket

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}

ORDERED_SCHEMA = {
    "type": "object",
    "properties": {
        "zulu_account": {"type": "string"},
        "amount": {"type": "number"},
        "currency": {"enum": ["EUR", "USD"]},
    },
    "required": ["zulu_account", "currency"],
}


@pytest.fixture
def approvals(new_run):
    """approvals(n, tool=...) -> [(driver, ticket_id)] of runs awaiting approval."""

    def make(n: int, tool: str = "ledger_approval"):
        made = []
        for i in range(n):
            run = new_run(input=f"Record payment-{i}.\nSecond line.")
            (call,) = run.open_batch(
                {"name": tool, "arguments": {"key": f"p-{i}"}, "permission": "ask"},
                text=f"Payment {i} needs an approval.",
            )
            made.append((run, run.await_ticket(call)))
        return made

    return make


def card(ticket_id: str) -> str:
    return f'id="ticket-{ticket_id}"'


def positions(html: str, *names: str) -> list[int]:
    return [html.index(f'name="answer-{n}"') for n in names]


def test_input_fields_in_schema_order_and_no_preselected_enum(approver, new_run):
    run = new_run()
    args = {"question": "Which account?", "answer_schema": ORDERED_SCHEMA}
    (call,) = run.open_batch({"name": "ask_input", "arguments": args})
    ticket_id = run.await_ticket(call, "input", request={}, schema=ORDERED_SCHEMA)
    html = approver.get(reverse("console:ticket", args=[ticket_id])).content.decode()
    first, second, third = positions(html, "zulu_account", "amount", "currency")
    assert first < second < third  # the model's order, whatever the database keeps
    select = re.search(r'<select name="answer-currency".*?</select>', html, re.S).group(0)
    assert '<option value="" selected>' in select  # nothing chosen for the operator
    # an untouched form is refused: the first value is never sent on its own
    response = approver.post(
        reverse("console:answer", args=[ticket_id]),
        {"decision": "input", "answer-zulu_account": "ACME"},
        headers=HX,
    )
    assert response.status_code == 422
    assert Ticket.objects.get(id=ticket_id).state == "open"


def test_a_note_rides_with_the_approval_and_is_shown_everywhere(approver, approval_run):
    run, ticket_id = approval_run
    response = approver.post(
        reverse("console:answer", args=[ticket_id]),
        {"decision": "approve", "note": "checked with finance"},
        headers=HX,
    )
    assert response.status_code == 200
    assert "Note: checked with finance" in response.content.decode()
    for url in (
        reverse("console:ticket", args=[ticket_id]),
        reverse("console:run", args=[run.run_id]),
        reverse("console:inbox"),
    ):
        assert "checked with finance" in approver.get(url).content.decode(), url


def test_inbox_filters_and_keyset_pages(operator, approvals, input_run, monkeypatch):
    monkeypatch.setattr(ticket_views, "INBOX_PAGE", 2)
    made = approvals(3)
    html = operator.get(reverse("console:inbox"), {"kind": "input"}).content.decode()
    assert card(input_run[1]) in html and card(made[0][1]) not in html
    html = operator.get(reverse("console:inbox"), {"tool": "ledger_approval"}).content.decode()
    assert card(input_run[1]) not in html
    # oldest first, two per page: the input ticket came first, then p-0, then p-1 and p-2
    first = operator.get(reverse("console:inbox")).content.decode()
    assert 'data-testid="open-count">4<' in first
    next_link = re.search(r'href="\?([^"]*after=[^"]*)"', first).group(1).replace("&amp;", "&")
    second = operator.get(reverse("console:inbox") + "?" + next_link).content.decode()
    assert card(made[1][1]) in second and card(made[2][1]) in second
    assert card(made[0][1]) not in second
    assert "Record payment-1." in second  # the run's input, first line


def test_the_inbox_bar_refreshes_without_touching_the_cards(operator, approvals):
    approvals(2)
    bar = operator.get(reverse("console:inbox"), {"part": "bar"}, headers=HX).content.decode()
    assert 'data-testid="open-count">2<' in bar and "ticket-card" not in bar


def test_bulk_answers_ask_once_then_answer_each(approver, approvals):
    made = approvals(2) + approvals(1, tool="ledger_once")
    ids = [t for _, t in made]
    url = reverse("console:bulk_answer")
    ask = approver.post(url, {"ticket": ids, "decision": "approve"}, headers=HX)
    text = ask.content.decode()
    assert "Approve 3 tickets?" in text and "ledger_approval ×2, ledger_once" in text
    assert Ticket.objects.filter(id__in=ids, state="open").count() == 3  # nothing written
    done = approver.post(url, {"ticket": ids, "decision": "approve", "confirm": "yes"}, headers=HX)
    assert "3 of 3 tickets approved" in done.content.decode()
    assert done.content.decode().count('hx-swap-oob="true"') == 3
    assert set(Ticket.objects.filter(id__in=ids).values_list("decision", flat=True)) == {"approve"}
    assert approver.post(url, {"decision": "approve"}, headers=HX).status_code == 400


def test_runs_list_rows_stay_put_while_runs_are_created(viewer, new_run):
    new_run(input="First run")
    page = viewer.get(reverse("console:runs")).content.decode()
    refresh = re.search(r'hx-get="([^"]*top=[^"]*)"', page).group(1).replace("&amp;", "&")
    new_run(input="A newer run")
    again = viewer.get(refresh, headers=HX).content.decode()
    assert "First run" in again and "A newer run" not in again
    assert "1 new run: show it" in again
    assert "A newer run" in viewer.get(reverse("console:runs")).content.decode()


def test_runs_list_says_what_each_run_is_about(viewer, approval_run, indeterminate_call):
    html = viewer.get(reverse("console:runs")).content.decode()
    assert "Record invoice-42." in html  # the input's first line
    assert "waits for approval: #0 ledger_approval" in html
    assert 'data-testid="needs-rec"' in html
    assert re.search(r'data-testid="unreconciled-chip".*?<b>1</b>', html, re.S)
    flagged = viewer.get(reverse("console:runs"), {"unreconciled": "on"}).content.decode()
    assert indeterminate_call[0].run_id in flagged and approval_run[0].run_id not in flagged


def test_tab_counts_in_the_navigation(viewer, approval_run, indeterminate_call):
    html = viewer.get(reverse("console:runs")).content.decode()
    assert re.search(r'data-testid="tab-count-inbox"[^>]*>1<', html)
    assert re.search(r'data-testid="tab-count-reconcile"[^>]*>1<', html)
    one = viewer.get(reverse("console:tab_count", args=["inbox"]), headers=HX)
    assert one.status_code == 200 and ">1</span>" in one.content.decode()
    assert viewer.get(reverse("console:tab_count", args=["nope"])).status_code == 404


def test_a_contradicting_reconciliation_is_an_explicit_correction(operator, indeterminate_call):
    run, call = indeterminate_call
    url = reverse("console:reconcile_call", args=[call.call_id])
    p = call.call_id
    first = operator.post(url, {f"{p}-outcome": "applied", f"{p}-evidence": "row 7"}, headers=HX)
    assert first.status_code == 200 and first["HX-Trigger"] == "rt:reconciled"
    counters = operator.get(reverse("console:reconcile"), {"part": "counters"}, headers=HX)
    assert 'data-testid="pending-count">0<' in counters.content.decode()
    refused = operator.post(url, {f"{p}-outcome": "not_applied"}, headers=HX)
    assert refused.status_code == 409
    assert "contradicts commit #" in refused.content.decode()
    assert ReconciliationRecord.objects.filter(call_id=call.call_id).count() == 1
    fixed = operator.post(url, {f"{p}-outcome": "not_applied", f"{p}-correction": "on"}, headers=HX)
    assert fixed.status_code == 200
    earlier = ReconciliationRecord.objects.filter(call_id=call.call_id).order_by("seq").first()
    for html in (
        fixed.content.decode(),
        operator.get(reverse("console:run", args=[run.run_id])).content.decode(),
    ):
        assert f"correction of commit #{earlier.seq} (applied by olga)" in html


def test_times_name_their_zone_and_log_rows_name_calls(viewer, approval_run):
    run, _ = approval_run
    html = viewer.get(reverse("console:run", args=[run.run_id])).content.decode()
    stamps = re.findall(r"<time [^>]*data-local[^>]*>([^<]*)</time>", html)
    assert stamps and all(s.endswith(" UTC") and s[:4].isdigit() for s in stamps)
    assert "#0 ledger_approval awaiting ticket" in html  # as the batch cards name it
    assert "RunState" not in html and "ActiveToolBatch" not in html


def test_run_page_reads_one_version(viewer, approval_run):
    run, _ = approval_run
    html = viewer.get(reverse("console:run", args=[run.run_id])).content.decode()
    version = re.search(r'data-testid="run-version">(\d+)<', html).group(1)
    assert f"as of commit #{version}<" in html


def test_still_unknown_stays_to_check_and_a_decisive_outcome_settles(operator, indeterminate_call):
    """One rule (runtime.inventory.unreconciled_calls) for the console's "To check", the API's
    ``unreconciled``, the metric and runtime_prune: "still unknown" is recorded but leaves the
    call to check; applied or not applied settles it."""
    _, call = indeterminate_call
    operations.reconcile(call.call_id, outcome="unknown", evidence="", actor="olga")
    html = operator.get(reverse("console:reconcile")).content.decode()
    assert call.call_id in html  # recorded, yet still to check
    assert list(unreconciled_calls().values_list("id", flat=True)) == [call.call_id]
    operations.reconcile(call.call_id, outcome="not_applied", evidence="no row", actor="olga")
    html = operator.get(reverse("console:reconcile")).content.decode()
    assert call.call_id not in html  # settled: off the "to check" list
    assert not unreconciled_calls().exists()


def test_audit_lists_every_decision_with_filters(
    operator, approval_run, new_run, indeterminate_call
):
    run, ticket_id = approval_run
    operator.post(
        reverse("console:answer", args=[ticket_id]),
        {"decision": "approve", "note": "ok by finance"},
        headers=HX,
    )
    cancelled = new_run()
    operations.cancel(cancelled.run_id, actor="olga", reason="wrong customer")
    _, call = indeterminate_call
    operations.reconcile(call.call_id, outcome="applied", evidence="row 9", actor="rita")
    html = operator.get(reverse("console:audit")).content.decode()
    for text in ("ok by finance", "wrong customer", "row 9", "run cancelled", "applied"):
        assert text in html, text
    only = operator.get(reverse("console:audit"), {"decision": "cancel"}).content.decode()
    assert "wrong customer" in only and "ok by finance" not in only
    by_rita = operator.get(reverse("console:audit"), {"actor": "rita"}).content.decode()
    assert "row 9" in by_rita and "wrong customer" not in by_rita
    one_run = operator.get(reverse("console:audit"), {"run": run.run_id}).content.decode()
    assert "ok by finance" in one_run and "row 9" not in one_run
    recent = operator.get(reverse("console:audit"), {"within": "60"}).content.decode()
    assert "ok by finance" in recent


def test_long_run_log_filters_pages_and_folds(viewer, new_run, monkeypatch):
    from console.views import runs as run_views

    monkeypatch.setattr(run_views, "LOG_SHOWN", 3)
    run = new_run()
    for i in range(4):
        (call,) = run.open_batch({"name": "ledger_replay", "arguments": {"key": f"k{i}"}})
        run.execute(call)
        run.complete(call, "ok")
        run.finalize()
    url = reverse("console:run", args=[run.run_id])
    html = viewer.get(url).content.decode()
    assert '<details class="batch "' in html  # finalized batches fold away
    older = re.search(r'href="\?log_before=(\d+)[^"]*" data-testid="older-commits"', html)
    before = int(older.group(1))
    page = viewer.get(url, {"log_before": before}).content.decode()
    seqs = [int(n) for n in re.findall(r'<td class="num mono">(\d+)</td>', page)]
    assert seqs and max(seqs) < before
    executing = viewer.get(url, {"log_kind": "CallExecuting"}).content.decode()
    rows = re.findall(r"<tr>\s*<td class=\"num mono\">", executing)
    assert len(rows) == 3 and "executing, attempt 1" in executing
    assert "batch of step" not in executing.split('id="log-h"')[1]


def test_search_by_operation_id(viewer, approval_run, new_run):
    run, _ = approval_run
    other = new_run()
    operation_id = run.calls[0].operation_id
    html = viewer.get(reverse("console:runs"), {"q": operation_id[:12]}).content.decode()
    assert f'id="run-{run.run_id}"' in html and f'id="run-{other.run_id}"' not in html


def test_approve_with_edited_arguments_keeps_the_models_beside_them(approver, approval_run):
    from runtime.coordinator import read_run
    from runtime.models import ToolCallRecord

    run, ticket_id = approval_run
    url = reverse("console:answer", args=[ticket_id])
    bad = approver.post(url, {"decision": "approve", "arguments": "[1]"}, headers=HX)
    assert bad.status_code == 422 and "must be a JSON object" in bad.content.decode()
    response = approver.post(
        url,
        {"decision": "approve", "arguments": '{"key": "invoice-43"}', "note": "typo"},
        headers=HX,
    )
    assert response.status_code == 200, response.content
    assert "Approved with edited arguments by abe" in response.content.decode()
    (call,) = read_run(run.run_id).batches[-1].calls
    assert call.approved and call.arguments == {"key": "invoice-43"}  # what the worker runs
    record = ToolCallRecord.objects.get(id=call.call_id)
    assert record.arguments == {"key": "invoice-43"}  # the projection agrees with the fold
    assert record.model_arguments == {"key": "invoice-42"}  # the model's, on record
    html = approver.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert "Arguments edited by <b>abe</b>" in html and "invoice-43" in html
    assert "invoice-42" in html


def test_respond_completes_the_call_with_a_supplied_result(approver, approval_run):
    from runtime.models import ToolCallRecord

    run, ticket_id = approval_run
    url = reverse("console:answer", args=[ticket_id])
    empty = approver.post(url, {"decision": "respond", "result": " "}, headers=HX)
    assert empty.status_code == 422
    response = approver.post(
        url, {"decision": "respond", "result": '{"recorded": "by hand"}'}, headers=HX
    )
    assert response.status_code == 200, response.content
    assert "Responded for the tool with a supplied result" in response.content.decode()
    record = ToolCallRecord.objects.get(ticket_id=ticket_id)
    assert record.phase == "completed" and not record.is_error and record.attempt == 0
    assert json.loads(record.result) == {"recorded": "by hand"}
    audit = approver.get(reverse("console:audit"), {"decision": "respond"}).content.decode()
    assert "ledger_approval" in audit


def test_bulk_cancel_by_filter_names_the_count_first(operator, new_run, approval_run):
    from runtime.models import Run

    running = [new_run(input=f"job {i}") for i in range(2)]
    url = reverse("console:bulk_cancel")
    ask = operator.post(url, {"state": "running"})
    assert 'data-testid="cancel-question"><b>Cancel 2 runs' in ask.content.decode()
    assert Run.objects.filter(state="ended").count() == 0  # nothing written yet
    new_run(input="a third one")  # the match changes: the old count is refused
    stale = operator.post(url, {"state": "running", "confirm": "yes", "expected": "2"})
    assert "changed since you were asked" in stale.content.decode()
    assert Run.objects.filter(state="ended").count() == 0
    done = operator.post(url, {"state": "running", "confirm": "yes", "expected": "3"})
    assert done.status_code == 302
    assert set(Run.objects.filter(state="ended").values_list("id", flat=True)) >= {
        r.run_id for r in running
    }
    assert Run.objects.get(id=approval_run[0].run_id).state == "awaiting"  # not matched


def test_run_again_starts_a_new_run_on_the_thread(operator, new_run):
    from runtime.models import MessageRecord, Run

    run = new_run(input="Summarise the ledger.")
    run.text_step("Done.", end=True)
    asked = operator.post(reverse("console:run_again", args=[run.run_id]))  # asks first
    assert asked.status_code == 200 and Run.objects.count() == 1
    assert b"called no tool with an external effect" in asked.content
    response = operator.post(reverse("console:run_again", args=[run.run_id]), {"confirm": "yes"})
    assert response.status_code == 302
    new = Run.objects.exclude(id=run.run_id).get()
    assert new.thread_id == run.view.thread_id and new.agent == "demo"
    assert MessageRecord.objects.get(run_id=new.id, role="user").content == (
        "Summarise the ledger."
    )
    again = operator.post(reverse("console:run_again", args=[new.id]), {"confirm": "yes"})
    assert again.status_code == 302 and Run.objects.count() == 2  # not ended: refused


def test_run_again_names_what_it_calls_again_before_starting(operator, viewer, new_run):
    """Issue 22, defect 1: "Run again" asks first, naming the tools with external effects it
    calls again and the original's applied and Indeterminate calls."""
    from runtime import operations
    from runtime.models import Run

    run = new_run(input="Charge and wait.")
    charged, waited, unsure = run.open_batch(
        {"name": "ledger_once", "arguments": {"key": "charge-1"}},
        {"name": "wait", "arguments": {"seconds": 1}, "effects": "none"},
        {"name": "ledger_replay", "arguments": {"key": "r"}, "effects": "idempotent"},
    )
    run.execute(charged)
    run.complete(charged, '{"recorded": "charge-1"}')
    run.execute(waited)
    run.complete(waited, '{"waited": 1}')
    run.execute(unsure)
    run.fail("the worker died during the call")
    url = reverse("console:run_again", args=[run.run_id])
    page = operator.get(url)
    html = page.content.decode()
    assert page.status_code == 200 and Run.objects.count() == 1
    assert [t["name"] for t in page.context["cost"]["tools"]] == ["ledger_once", "ledger_replay"]
    assert "<b>wait</b>" not in html  # no external effect: not named as a cost
    assert [c["call_id"] for c in page.context["cost"]["applied"]] == [charged.call_id]
    assert [c["call_id"] for c in page.context["cost"]["indeterminate"]] == [unsure.call_id]
    assert charged.operation_id in html and "not reconciled" in html
    assert "calling 2 tools with effects again" in html
    operations.reconcile(unsure.call_id, outcome="applied", evidence="row 9", actor="olga")
    cost = operator.get(url).context["cost"]
    assert [c["call_id"] for c in cost["applied"]] == [charged.call_id, unsure.call_id]
    assert cost["indeterminate"] == []
    assert "reconciled applied" in operator.get(url).content.decode()
    # the run page links to the question, not to a one-click start
    run_page = operator.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert f'href="{url}"' in run_page and 'action="' + url not in run_page
    assert viewer.post(url, {"confirm": "yes"}).status_code == 403
    assert operator.post(url, {"confirm": "yes"}).status_code == 302
    assert Run.objects.count() == 2
