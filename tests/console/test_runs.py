"""The runs list and the run page, starting and cancelling runs."""

from __future__ import annotations

import json

import pytest
from django.urls import reverse

from runtime.models import Run, ThreadCommit

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


def test_runs_list_counts_filters_and_search(operator, new_run, approval_run, indeterminate_call):
    running = new_run()
    awaiting, _ = approval_run
    failed, _ = indeterminate_call
    page = operator.get(reverse("console:runs"))
    assert page.status_code == 200
    html = page.content.decode()
    for run in (running, awaiting, failed):
        assert f'id="run-{run.run_id}"' in html
    counts = page.context["counts"]
    assert counts["total"] == 3
    assert dict(counts["states"]) == {"running": 1, "awaiting": 1, "ended": 1}
    assert dict(counts["causes"])["failed"] == 1

    def ids(**params):
        response = operator.get(reverse("console:runs"), params)
        return {r.id for r in response.context["runs"]}

    assert ids(state="awaiting") == {awaiting.run_id}
    assert ids(state="ended", cause="failed") == {failed.run_id}
    assert ids(cause="cancelled") == set()
    assert ids(agent="demo") == {running.run_id, awaiting.run_id, failed.run_id}
    assert ids(agent="nope") == set()
    assert ids(q=running.run_id[:10]) == {running.run_id}
    thread_id = Run.objects.get(id=failed.run_id).thread_id
    assert ids(q=thread_id) == {failed.run_id}
    assert ids(state="bogus") == {running.run_id, awaiting.run_id, failed.run_id}


def test_runs_list_keyset_pages(operator, new_run, monkeypatch):
    from console.views import runs as views

    monkeypatch.setattr(views, "PAGE_SIZE", 2)
    made = [new_run().run_id for _ in range(5)]
    newest_first = list(Run.objects.order_by("-created_at", "-id").values_list("id", flat=True))
    assert sorted(made) == sorted(newest_first)
    seen, params = [], {}
    while True:
        response = operator.get(reverse("console:runs"), params)
        seen += [r.id for r in response.context["runs"]]
        if not response.context["next_query"]:
            break
        params = dict(pair.split("=", 1) for pair in response.context["next_query"].split("&"))
        from urllib.parse import unquote

        params = {k: unquote(v) for k, v in params.items()}
    assert seen == newest_first
    # a junk cursor is ignored, not an error
    assert operator.get(reverse("console:runs"), {"after": "junk"}).status_code == 200


def test_runs_list_htmx_renders_the_listing_partial(operator, new_run):
    new_run()
    response = operator.get(reverse("console:runs"), {"state": "running"}, headers=HX)
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="listing"')
    assert "<html" not in html
    assert "last commit" in operator.get(reverse("console:runs")).content.decode().lower()


def test_runs_list_query_count_does_not_grow_with_rows(
    operator, new_run, django_assert_num_queries
):
    new_run()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as few:
        operator.get(reverse("console:runs"), headers=HX)
    for _ in range(6):
        new_run()
    with django_assert_num_queries(len(few.captured_queries)):
        operator.get(reverse("console:runs"), headers=HX)


def test_run_page_query_count_does_not_grow_with_commits_calls_or_tickets(
    operator, new_run, django_assert_num_queries
):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    small = new_run()  # awaiting as the big one does: a Running run's page also asks why
    small.await_ticket(
        small.open_batch({"name": "ledger_approval", "permission": "ask"})[0], "approval"
    )
    with CaptureQueriesContext(connection) as few:
        operator.get(reverse("console:run", args=[small.run_id]))
    big = new_run()
    specs = [{"name": "ledger_once", "arguments": {"key": f"k-{i}"}} for i in range(4)]
    calls = big.open_batch(*specs, {"name": "ledger_approval", "permission": "ask"})
    for call in calls[:4]:
        big.execute(call)
        big.complete(call, "ok")
    big.await_ticket(calls[4], "approval")  # an open ticket: its card shows the run's agent
    with django_assert_num_queries(len(few.captured_queries)) as many:
        response = operator.get(reverse("console:run", args=[big.run_id]))
    assert response.context["open_ticket"] is not None
    assert len(response.context["log"]) == 11
    # Run.snapshot grows with the run: read once per ticket it made long runs' pages quadratic.
    assert not [q["sql"] for q in many.captured_queries if '"snapshot"' in q["sql"]]


def test_run_page_shows_committed_state(operator, approval_run):
    run, ticket_id = approval_run
    response = operator.get(reverse("console:run", args=[run.run_id]))
    html = response.content.decode()
    assert response.status_code == 200
    view = run.view
    assert "Committed state" in html and "as of commit #" in html
    assert f'data-testid="run-version">{view.version}<' in html
    assert 'data-testid="run-state">awaiting' in html
    call = run.calls[0]
    assert call.operation_id in html
    assert "Pinned policy" in html and ">indeterminate<" in html
    assert "open batch" in html
    assert "phase-awaiting" in html
    assert "Let me record that." in html  # committed assistant message
    assert "invoice-42" in html
    assert f'action="{reverse("console:answer", args=[ticket_id])}"' in html
    assert 'value="approve"' in html and 'value="deny"' in html
    # the commit log: sequence, disposition, events, who
    log = response.context["log"]
    assert [c.seq for c in log] == list(range(1, view.version + 1))
    assert "awaiting approval ticket" in html
    assert "run activated (demo)" in html
    assert ">starter<" in html and ">worker-test<" in html
    # the live panel
    assert f'data-ws-path="/ws/runs/{run.run_id}/"' in html
    assert "live, unconfirmed" in html


def test_run_page_htmx_returns_committed_partial(operator, approval_run):
    run, _ = approval_run
    html = operator.get(reverse("console:run", args=[run.run_id]), headers=HX).content.decode()
    assert html.lstrip().startswith('<div id="committed"')
    assert "Live stream" not in html


def test_run_page_404(operator):
    response = operator.get(reverse("console:run", args=["nope"]))
    assert response.status_code == 404
    assert b"run nope does not exist" in response.content


def test_run_page_shows_attempts_and_results(operator, new_run):
    run = new_run()
    (call,) = run.open_batch(
        {"name": "ledger_replay", "arguments": {"key": "k"}, "policy": "replay", "max_attempts": 3}
    )
    run.execute(call, worker="worker-x")
    run.complete(call, '{"recorded": "k"}')
    html = operator.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert "attempt 1/3" in html
    assert "worker-x" in html
    assert "phase-completed" in html
    assert "&quot;recorded&quot;: &quot;k&quot;" in html


def test_cancel_needs_confirmation(operator, approval_run):
    run, _ = approval_run
    response = operator.post(reverse("console:cancel", args=[run.run_id]), {"reason": "x"})
    assert response.status_code == 400
    assert b"Confirm that the run should be cancelled" in response.content
    assert Run.objects.get(id=run.run_id).state == "awaiting"


def test_cancel_records_who_and_seals_calls(operator, approval_run):
    run, ticket_id = approval_run
    response = operator.post(
        reverse("console:cancel", args=[run.run_id]),
        {"reason": "wrong invoice", "confirm": "on"},
        follow=True,
    )
    assert response.status_code == 200
    row = Run.objects.get(id=run.run_id)
    assert (row.state, row.end_cause) == ("ended", "cancelled")
    last = ThreadCommit.objects.filter(run_id=run.run_id).order_by("-seq").first()
    assert last.actor == "olga"
    html = response.content.decode()
    assert "Run cancelled" in html
    assert "ended (cancelled)" in html and ">olga<" in html
    assert "Cancel this run" not in html
    assert "phase-indeterminate" in html
    # the ticket shows who closed it
    from runtime.models import Ticket

    ticket = Ticket.objects.get(id=ticket_id)
    assert ticket.state == "void" and ticket.closed_by == "olga"


def test_cancel_of_an_ended_run_changes_nothing(operator, indeterminate_call):
    run, _ = indeterminate_call
    before = ThreadCommit.objects.count()
    response = operator.post(
        reverse("console:cancel", args=[run.run_id]), {"confirm": "on"}, follow=True
    )
    assert b"had already ended (failed)" in response.content
    assert ThreadCommit.objects.count() == before


def test_cancel_unknown_run_404(operator):
    assert (
        operator.post(reverse("console:cancel", args=["nope"]), {"confirm": "on"}).status_code
        == 404
    )


def test_start_page_offers_agents_and_examples(operator):
    response = operator.get(reverse("console:start"), {"example": "input"})
    html = response.content.decode()
    assert response.status_code == 200
    assert '<option value="demo" selected>demo</option>' in html
    assert "ask_input" in html  # the example script is filled in
    assert "ledger_approval" in html  # the agent's tools are listed


def test_start_a_scripted_run(operator):
    script = {"steps": [{"text": "hello", "chunks": 2}]}
    response = operator.post(
        reverse("console:start"),
        {"agent": "demo", "input": "Say hello", "script": json.dumps(script)},
    )
    assert response.status_code == 302
    run = Run.objects.get()
    assert response["Location"] == reverse("console:run", args=[run.id])
    assert run.created_by == "olga"
    assert run.metadata == {"script": script}
    assert ThreadCommit.objects.get(run_id=run.id).actor == "olga"


@pytest.mark.parametrize(
    ("data", "status", "text"),
    [
        ({"agent": "demo", "input": ""}, 400, "This field is required"),
        ({"agent": "nobody", "input": "x"}, 400, "Select a valid choice"),
        ({"agent": "demo", "input": "x", "script": "{nope"}, 400, "not valid JSON"),
        ({"agent": "demo", "input": "x", "script": "[1]"}, 400, "the script is a JSON object"),
        (
            {"agent": "demo", "input": "x", "script": '{"steps": [{"bogus": 1}]}'},
            422,
            "the script is malformed",
        ),
        ({"agent": "demo", "input": "x", "thread_id": "nope"}, 404, "does not exist"),
    ],
)
def test_start_refusals(operator, data, status, text):
    response = operator.post(reverse("console:start"), data)
    assert response.status_code == status
    assert text in response.content.decode()
    assert not Run.objects.exists()


def test_start_refuses_a_script_for_an_agent_with_a_real_model(operator):
    """The form comes filled with a demo script; left there for the `assistant` agent (an
    OpenAI-compatible model) it would have replaced the model without a word."""
    script = json.dumps({"steps": [{"text": "hello"}]})
    response = operator.post(
        reverse("console:start"), {"agent": "assistant", "input": "x", "script": script}
    )
    assert response.status_code == 400
    assert "answers with its model (openai)" in response.content.decode()
    assert not Run.objects.exists()


def test_start_on_a_thread_with_an_active_run_is_refused(operator, new_run):
    run = new_run()
    thread_id = Run.objects.get(id=run.run_id).thread_id
    response = operator.post(
        reverse("console:start"), {"agent": "demo", "input": "x", "thread_id": thread_id}
    )
    assert response.status_code == 409
    assert b"already has a run that has not ended" in response.content


def test_start_refuses_scripts_when_disabled(operator, settings):
    settings.RUNTIME_ALLOW_SCRIPTED = False
    response = operator.post(
        reverse("console:start"),
        {"agent": "demo", "input": "x", "script": '{"steps": []}'},
    )
    assert response.status_code == 422
    assert b"scripted runs are disabled" in response.content
