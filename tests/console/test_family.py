"""The run page links a child to its parent and lists a parent's children; a timer's card
shows when it fires (absolute with zone, and relative) and fires it now, never denies it; a
delegation ticket offers no answer (its child's end answers it)."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from runtime.models import Run, Ticket
from runtime.operations import start_run
from runtime.worker import Worker

pytestmark = pytest.mark.django_db(transaction=True)


def drive() -> None:
    worker = Worker(worker_id="console-tests", until_idle=True)
    while worker.step():
        pass


def demo_run(*steps: dict) -> str:
    return start_run(agent="demo", input="go", metadata={"script": {"steps": list(steps)}})


def test_parent_lists_children_and_child_links_parent(operator):
    child_script = {
        "steps": [
            {"tool_calls": [{"name": "ledger_approval", "arguments": {"key": "g"}}]},
            {"text": "ok"},
        ]
    }
    parent_id = demo_run(
        {"tool_calls": [{"name": "delegate", "arguments": {"input": "x", "script": child_script}}]},
        {"text": "done"},
    )
    drive()
    child = Run.objects.get(parent_run_id=parent_id)
    page = operator.get(reverse("console:run", args=[parent_id])).content.decode()
    assert 'data-testid="children"' in page
    assert reverse("console:run", args=[child.id]) in page
    assert "every 3s" in page  # a live child: the page keeps its state fresh
    assert "Waiting for child run" in page  # the ticket the parent waits on names the child
    page = operator.get(reverse("console:run", args=[child.id])).content.decode()
    assert 'data-testid="parent-link"' in page
    assert reverse("console:run", args=[parent_id]) in page
    # People answer the child's approval; the parent's delegation ticket is the child's to end.
    delegation = Ticket.objects.get(run_id=parent_id)
    inbox = operator.get(reverse("console:inbox")).content.decode()
    assert Ticket.objects.get(run_id=child.id).id in inbox and delegation.id not in inbox
    # Its card offers no answer (the run page shows it as the parent's open ticket), and an
    # answer posted anyway is refused by the runtime's rule, naming the child to cancel.
    page = operator.get(reverse("console:run", args=[parent_id])).content.decode()
    assert reverse("console:answer", args=[delegation.id]) not in page
    assert "To stop it, cancel the child run" in page
    for decision in ("deny", "input", "approve"):
        refused = operator.post(
            reverse("console:answer", args=[delegation.id]), {"decision": decision}
        )
        assert refused.status_code == 409
        assert f"cancel the child run {child.id}" in refused.content.decode()
    delegation.refresh_from_db()
    assert delegation.state == "open"


def test_timer_card_shows_its_fire_time_and_fires_now(operator):
    run_id = demo_run({"tool_calls": [{"name": "wait", "arguments": {"seconds": 7200}}]})
    drive()
    ticket = Ticket.objects.get(run_id=run_id)
    page = operator.get(reverse("console:run", args=[run_id])).content.decode()
    assert f'datetime="{ticket.due_at.isoformat()}"' in page
    assert ticket.due_at.strftime("%Y-%m-%d %H:%M:%S UTC") in page
    assert "in 1\xa0hour, 59\xa0minutes" in page or "in 2\xa0hours" in page
    assert "Fire now" in page
    assert 'value="deny"' not in page  # a timer fires; it is not denied
    refused = operator.post(reverse("console:answer", args=[ticket.id]), {"decision": "deny"})
    assert refused.status_code == 409 and "may only fire it now" in refused.content.decode()
    ticket.refresh_from_db()
    assert ticket.state == "open"
    response = operator.post(reverse("console:answer", args=[ticket.id]), {"decision": "approve"})
    assert response.status_code in (200, 302)
    ticket.refresh_from_db()
    assert (ticket.state, ticket.closed_by, ticket.decision) == ("consumed", "olga", "approve")


def test_runtime_show_prints_parent_children_and_due_at():
    parent_id = demo_run(
        {
            "tool_calls": [
                {
                    "name": "delegate",
                    "arguments": {
                        "input": "wait",
                        "script": {
                            "steps": [
                                {"tool_calls": [{"name": "wait", "arguments": {"seconds": 600}}]}
                            ]
                        },
                    },
                }
            ]
        }
    )
    drive()
    child = Run.objects.get(parent_run_id=parent_id)
    timer = Ticket.objects.get(run_id=child.id)

    def show(run_id: str, *flags: str) -> str:
        out = StringIO()
        call_command("runtime_show", run_id, *flags, stdout=out)
        return out.getvalue()

    assert f"child run {child.id} agent=demo state=awaiting" in show(parent_id)
    text = show(child.id)
    assert f"parent run {parent_id} call {child.parent_call_id}" in text
    assert f"open ticket {timer.id} kind=timer due_at={timer.due_at.isoformat()}" in text
    document = json.loads(show(child.id, "--json"))
    assert document["parent"] == {"run": parent_id, "call": child.parent_call_id}
    assert document["ticket"]["due_at"] == timer.due_at.isoformat()


def test_runs_list_shows_a_child_runs_parent_as_a_short_link(operator):
    """Issue 32: "Started by run:<32 hex>" was one unbroken word that widened the runs list
    (50 rows 4,560 px high); a child's row links its parent by the id's first 8 characters,
    the full id in the title, with no query per row."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    CHILD = {"steps": [{"text": "ok"}]}

    def family() -> tuple[str, str, str, int]:
        parent_id = demo_run(
            {"tool_calls": [{"name": "delegate", "arguments": {"input": "x", "script": CHILD}}]},
            {"text": "done"},
        )
        drive()
        child = Run.objects.get(parent_run_id=parent_id)
        with CaptureQueriesContext(connection) as queries:
            page = operator.get(reverse("console:runs")).content.decode()
        return parent_id, child.id, page, len(queries.captured_queries)

    parent_id, child_id, _, one_child = family()
    _, _, page, two_children = family()
    assert f"run:{parent_id}" not in page
    link = (
        f'<a class="mono" data-testid="started-by-run"'
        f' href="{reverse("console:run", args=[parent_id])}" title="run {parent_id}">'
        f"run {parent_id[:8]}</a>"
    )
    row = page[page.index(f'id="run-{child_id}"') :]
    assert link in row[: row.index("</tr>")]
    assert two_children == one_child
