"""The inbox and answering tickets: approve, deny with a reason, typed input from the
ticket's JSON schema (validated on the server), and every refusal with its cause."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from runtime.documents import run_document
from runtime.models import ThreadCommit, Ticket

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


def answer(client, ticket_id, htmx=True, **data):
    return client.post(
        reverse("console:answer", args=[ticket_id]), data, headers=HX if htmx else {}
    )


def call_of(run_id):
    return run_document(run_id)["batches"][-1]["calls"][0]


def test_inbox_lists_open_tickets_oldest_first(operator, approval_run, input_run, new_run):
    (first, first_ticket), (_, second_ticket) = approval_run, input_run
    response = operator.get(reverse("console:inbox"))
    html = response.content.decode()
    assert response.status_code == 200
    assert [c.ticket.id for c in response.context["cards"]] == [first_ticket, second_ticket]
    assert html.index(f'id="ticket-{first_ticket}"') < html.index(f'id="ticket-{second_ticket}"')
    assert "ledger_approval" in html and "ask_input" in html  # tool
    assert "invoice-42" in html  # arguments
    assert first.run_id[:8] in html and "· demo ·" in html  # run and agent
    assert 'data-testid="open-count">2<' in html
    assert "Which account?" in html  # the input ticket's question
    assert 'name="answer-account"' in html


def test_inbox_htmx_partial(operator, approval_run):
    html = operator.get(reverse("console:inbox"), headers=HX).content.decode()
    assert html.lstrip().startswith('<div id="tickets"') and "<html" not in html


def test_approve_in_place_records_who_and_when(approver, approval_run):
    run, ticket_id = approval_run
    response = answer(approver, ticket_id, decision="approve")
    assert response.status_code == 200
    html = response.content.decode()
    assert html.lstrip().startswith("<article")
    assert "Approved by abe at" in html
    ticket = Ticket.objects.get(id=ticket_id)
    assert (ticket.state, ticket.decision, ticket.closed_by) == ("consumed", "approve", "abe")
    assert ticket.closed_at is not None
    doc = run_document(run.run_id)
    assert doc["state"] == "running"
    assert call_of(run.run_id)["approved"] is True
    # the run page shows who answered
    page = approver.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert "call " in page and "resumed: approve" in page and ">abe<" in page


def test_deny_with_a_reason(approver, approval_run):
    run, ticket_id = approval_run
    response = answer(approver, ticket_id, decision="deny", reason="not this invoice")
    assert response.status_code == 200 and b"Denied by abe" in response.content
    call = call_of(run.run_id)
    assert call["phase"] == "completed" and call["is_error"]
    assert "not this invoice" in call["result"]
    # Issue 22, defect 6: a denial never looks like success, on the card or the run page.
    html = response.content.decode()
    assert 'class="notice denied"' in html and 'class="notice ok"' not in html
    assert "ticket-card kind-approval done denied" in html
    page = approver.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert 'badge phase-denied" data-testid="call-outcome">denied<' in page
    assert "phase-completed" not in page  # neither the call nor the batch summary
    assert "denied: the tool did not run" in page
    late = answer(approver, ticket_id, decision="approve")  # told later: still not green
    assert late.status_code == 409 and b'class="notice denied"' in late.content


def test_wrong_decision_for_the_kind(approver, approval_run, input_run):
    _, approval = approval_run
    _, input_ticket = input_run
    response = answer(approver, approval, decision="input")
    assert response.status_code == 400
    assert b"answered with: approve, deny" in response.content
    assert answer(approver, input_ticket, decision="approve").status_code == 400
    assert answer(approver, approval, decision="").status_code == 400
    assert Ticket.objects.filter(state="open").count() == 2


def test_input_form_is_generated_from_the_schema(operator, input_run):
    run, ticket_id = input_run
    html = operator.get(reverse("console:ticket", args=[ticket_id])).content.decode()
    assert 'name="answer-account"' in html and 'minlength="2"' in html
    assert 'name="answer-amount"' in html and 'type="number"' in html
    assert 'name="answer-count"' in html and 'max="10"' in html
    assert 'name="answer-urgent"' in html and '<option value="true">yes</option>' in html
    assert 'name="answer-currency"' in html and "&quot;EUR&quot;" in html
    assert 'name="answer-tags"' in html and "Type a JSON value" in html
    assert "account code" in html  # the description is the help text


def test_typed_input_answer(approver, input_run):
    run, ticket_id = input_run
    response = answer(
        approver,
        ticket_id,
        decision="input",
        **{
            "answer-account": "ACME-1",
            "answer-amount": "12.5",
            "answer-count": "3",
            "answer-urgent": "false",
            "answer-currency": '"USD"',
            "answer-tags": '["a", "b"]',
        },
    )
    assert response.status_code == 200, response.content
    assert b"Answered by abe" in response.content
    call = call_of(run.run_id)
    assert call["phase"] == "completed" and not call["is_error"]
    assert json.loads(call["result"]) == {
        "account": "ACME-1",
        "amount": 12.5,
        "count": 3,
        "urgent": False,
        "currency": "USD",
        "tags": ["a", "b"],
    }


def test_optional_fields_left_empty_are_left_out(approver, input_run):
    run, ticket_id = input_run
    response = answer(
        approver,
        ticket_id,
        decision="input",
        **{
            "answer-account": "AC",
            "answer-amount": "0",
            "answer-urgent": "",
            "answer-currency": "",
            "answer-count": "",
            "answer-tags": "",
        },
    )
    assert response.status_code == 200
    assert json.loads(call_of(run.run_id)["result"]) == {"account": "AC", "amount": 0.0}


def test_input_refused_by_the_form(approver, input_run):
    _, ticket_id = input_run
    response = answer(
        approver,
        ticket_id,
        decision="input",
        **{"answer-account": "", "answer-amount": "lots", "answer-count": "11"},
    )
    assert response.status_code == 422
    html = response.content.decode()
    assert "Check the highlighted fields" in html
    assert "This field is required" in html
    assert "Enter a number" in html
    assert "less than or equal to 10" in html
    assert Ticket.objects.get(id=ticket_id).state == "open"


def test_input_refused_by_the_server_schema_check(approver, input_run):
    """What the generated form does not model is still checked by operations.resume."""
    _, ticket_id = input_run
    response = answer(
        approver,
        ticket_id,
        decision="input",
        **{"answer-account": "AC", "answer-amount": "1", "answer-tags": "[1, 2]"},
    )
    assert response.status_code == 422
    assert b"input does not match the ticket&#x27;s schema" in response.content
    assert Ticket.objects.get(id=ticket_id).state == "open"
    # the form keeps what was typed
    assert b'value="AC"' in response.content


def test_second_answer_is_told_who_answered_and_when(client_for, approval_run):
    _, ticket_id = approval_run
    first, second = client_for("approvers", "first"), client_for("operators", "second")
    inbox = second.get(reverse("console:inbox"))  # the second has the form open too
    assert inbox.status_code == 200
    assert answer(first, ticket_id, decision="approve").status_code == 200
    commits = ThreadCommit.objects.count()
    late = answer(second, ticket_id, decision="deny", reason="too late")
    assert late.status_code == 409
    ticket = Ticket.objects.get(id=ticket_id)
    stamp = ticket.closed_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    html = late.content.decode()
    assert "Already answered: approved by first at <time" in html and f">{stamp}</time>." in html
    assert b'value="deny"' not in late.content  # the forms are gone
    assert ThreadCommit.objects.count() == commits


def test_answer_after_the_run_was_cancelled(operator, approver, approval_run):
    run, ticket_id = approval_run
    operator.post(reverse("console:cancel", args=[run.run_id]), {"confirm": "on"})
    late = answer(approver, ticket_id, decision="approve")
    assert late.status_code == 409
    assert b"Closed without an answer: the run ended (cancelled), by olga at" in late.content


def test_a_repeated_submit_gets_the_first_answer(approver, approval_run):
    run, ticket_id = approval_run
    key = "a" * 32
    assert answer(approver, ticket_id, decision="approve", key=key).status_code == 200
    commits = ThreadCommit.objects.count()
    # the ticket is consumed, so the view says so without asking the runtime again
    again = answer(approver, ticket_id, decision="approve", key=key)
    assert again.status_code == 409 and b"Already answered: approved by abe" in again.content
    assert ThreadCommit.objects.count() == commits


def test_answer_without_htmx_redirects_back(approver, approval_run):
    _, ticket_id = approval_run
    response = answer(approver, ticket_id, htmx=False, decision="approve", next="/inbox/")
    assert response.status_code == 302 and response["Location"] == "/inbox/"
    page = approver.get("/inbox/").content.decode()
    assert "Approved by abe" in page  # the flash message
    assert "Recently closed" in page


def test_answer_without_htmx_ignores_a_foreign_next(approver, approval_run):
    _, ticket_id = approval_run
    response = answer(
        approver, ticket_id, htmx=False, decision="approve", next="https://evil.example/"
    )
    assert response["Location"] == reverse("console:ticket", args=[ticket_id])


def test_refusal_without_htmx_renders_the_ticket_page(approver, input_run):
    _, ticket_id = input_run
    response = answer(approver, ticket_id, htmx=False, decision="input")
    assert response.status_code == 422
    html = response.content.decode()
    assert "<html" in html and "This field is required" in html


def test_ticket_page_of_a_closed_ticket(viewer, approver, approval_run):
    _, ticket_id = approval_run
    answer(approver, ticket_id, decision="approve")
    html = viewer.get(reverse("console:ticket", args=[ticket_id])).content.decode()
    assert "Already answered: approved by abe" in html


def test_unknown_ticket_404(approver):
    assert answer(approver, "nope", decision="approve").status_code == 404
    assert approver.get(reverse("console:ticket", args=["nope"])).status_code == 404
