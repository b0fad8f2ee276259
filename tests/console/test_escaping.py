"""Model output, tool arguments and results are untrusted: they render as inert text."""

from __future__ import annotations

import pytest
from django.urls import reverse

from runtime.models import LateEvidence

pytestmark = pytest.mark.django_db

PAYLOADS = [
    "<script>alert('xss')</script>",
    '<img src=x onerror="alert(1)">',
    '"><svg onload=alert(2)>',
    "javascript:alert(3)",
]
RAW_MARKERS = ["<script>alert", "<img src=x", "<svg onload"]


def assert_inert(html: str) -> None:
    for marker in RAW_MARKERS:
        assert marker not in html, marker
    assert "&lt;script&gt;alert(" in html


def test_run_page_escapes_model_output_and_tool_data(operator, new_run):
    run = new_run(input=PAYLOADS[0])
    run.text_step(" ".join(PAYLOADS))
    (call,) = run.open_batch(
        {
            "name": "ledger_approval",
            "arguments": {"key": PAYLOADS[0], "x": PAYLOADS[1]},
            "permission": "ask",
        },
        text=PAYLOADS[2],
    )
    run.await_ticket(call, "approval", request={"question": PAYLOADS[0]})
    html = operator.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert_inert(html)
    assert "&lt;img src=x onerror=" in html


def test_unparsed_arguments_and_results_are_escaped(operator, new_run):
    run = new_run()
    (call,) = run.open_batch(
        {
            "name": "ledger_replay",
            "arguments": None,
            "arguments_text": PAYLOADS[0] + "{",
            "policy": "replay",
        }
    )
    run.execute(call)
    run.complete(call, PAYLOADS[0])
    html = operator.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert_inert(html)


def test_inbox_and_ticket_escape_questions_and_arguments(operator, new_run):
    run = new_run()
    schema = {
        "type": "object",
        "properties": {
            PAYLOADS[1]: {"type": "string", "description": PAYLOADS[0], "title": PAYLOADS[0]}
        },
    }
    (call,) = run.open_batch(
        {"name": "ask_input", "arguments": {"question": PAYLOADS[0], "answer_schema": schema}}
    )
    ticket_id = run.await_ticket(call, "input", request={"question": PAYLOADS[0]}, schema=schema)
    for url in (reverse("console:inbox"), reverse("console:ticket", args=[ticket_id])):
        html = operator.get(url).content.decode()
        assert_inert(html)


def test_reconciliation_escapes_arguments_and_evidence(operator, new_run):
    run = new_run()
    (call,) = run.open_batch({"name": "ledger_once", "arguments": {"key": PAYLOADS[0]}})
    run.execute(call, worker=PAYLOADS[1])
    run.fail(PAYLOADS[0])
    LateEvidence.objects.create(call_id=call.call_id, result=PAYLOADS[0], worker=PAYLOADS[1])
    html = operator.get(reverse("console:reconcile")).content.decode()
    assert_inert(html)


def test_runs_list_escapes_actor_names(operator, new_run):
    new_run(actor=PAYLOADS[0])
    html = operator.get(reverse("console:runs")).content.decode()
    assert_inert(html)
