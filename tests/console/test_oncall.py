"""What an on-call operator must be able to trust (issue 22): who holds a run, what it waits
on, the timeline, the bulk-cancel button after an in-place filter, names a screen reader
reads, and the smaller truths of item 8."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from runtime import operations
from runtime.domain.delegation import ChildLink
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.models import Run, WorkerProcess
from runtime.stuck import holders

pytestmark = pytest.mark.django_db

HX = {"HX-Request": "true"}


def _worker(worker_id: str, *, beat_ago: float, stopped: bool = False) -> WorkerProcess:
    now = timezone.now()
    return WorkerProcess.objects.create(
        id=worker_id,
        host="h",
        pid=1,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(seconds=beat_ago),
        stopped_at=now if stopped else None,
    )


def _held(run_id: str, owner: str | None, expires_in: float | None) -> None:
    Run.objects.filter(id=run_id).update(
        lease_owner=owner,
        lease_expires_at=timezone.now() + timedelta(seconds=expires_in) if expires_in else None,
    )


def test_a_run_held_by_a_dead_worker_says_so_on_its_page_and_the_list(viewer, new_run):
    """Defect 5: 30 s after SIGKILL of its only worker, the run still looked healthy."""
    run = new_run(input="Charge the card.")
    (call,) = run.open_batch({"name": "ledger_once", "arguments": {"key": "c"}})
    run.execute(call, worker="w-dead")
    _worker("w-dead", beat_ago=30)
    _held(run.run_id, "w-dead", expires_in=-15)  # the lease ran out 15 s ago

    page = viewer.get(reverse("console:run", args=[run.run_id]))
    html = page.content.decode()
    assert page.context["holder"].status == "lease_expired"
    assert "no live worker" in html and "none is running" in html and "w-dead" in html
    assert "last heartbeat" in html
    assert "Pending call" in html and "attempt 1 of 1" in html and "#0 ledger_once" in html
    listing = viewer.get(reverse("console:runs")).content.decode()
    assert 'data-holder="lease_expired"' in listing and "no live worker" in listing

    # Another worker is alive: the run will be taken over, and the page says when.
    _worker("w-live", beat_ago=1)
    _held(run.run_id, "w-dead", expires_in=10)
    holder = viewer.get(reverse("console:run", args=[run.run_id])).context["holder"]
    assert holder.status == "owner_silent" and holder.live_workers == 1
    part = viewer.get(reverse("console:run", args=[run.run_id]), {"part": "holder"}, headers=HX)
    text = part.content.decode()
    assert "no live worker" in text and "will be taken over at" in text
    assert "lease expires" in text and "<html" not in text

    # A live owner: its id, heartbeat and lease, nothing alarming.
    _held(run.run_id, "w-live", expires_in=10)
    text = viewer.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert 'data-holder="owned"' in text and "no live worker" not in text
    assert "lease until" in text and "last heartbeat" in text


def test_holders_of_a_page_of_runs_take_three_queries(new_run, django_assert_num_queries):
    runs = [new_run() for _ in range(5)]
    _worker("w", beat_ago=1)
    for r in runs:
        _held(r.run_id, "w", expires_in=10)
    rows = list(Run.objects.all())
    with django_assert_num_queries(3):  # the owners, the live workers, their versions
        found = holders(rows)
    assert {h.status for h in found.values()} == {"owned"}
    _worker("gone", beat_ago=0, stopped=True)
    _held(runs[0].run_id, "gone", expires_in=10)
    again = holders(list(Run.objects.all()))
    assert again[runs[0].run_id].status == "owner_silent"


def test_where_a_run_waits_and_its_timeline(operator, approval_run):
    run, ticket_id = approval_run
    page = operator.get(reverse("console:run", args=[run.run_id]))
    waiting = page.context["waiting"]
    assert waiting.on == "ticket" and "approve or deny #0 ledger_approval" in waiting.what
    assert waiting.since is not None
    operations.resume(
        run.run_id,
        ResumeCommand(
            ticket_id=ticket_id,
            kind=TicketKind.APPROVAL,
            decision=Decision.DENY,
            reason="no",
        ),
        actor="abe",
    )
    run.finalize()
    run.text_step("ok", end=True)
    page = operator.get(reverse("console:run", args=[run.run_id]))
    steps = page.context["timeline"]
    assert [s.step for s in steps] == [1, 2]
    (span,) = steps[0].calls
    assert (span.number, span.name, span.outcome) == (1, "ledger_approval", "denied")
    assert [(a["decision"], a["actor"]) for a in span.answers] == [("deny", "abe")]
    assert span.duration is not None and steps[0].finalized_at is not None
    html = page.content.decode()
    assert 'data-testid="timeline"' in html and "denied by <b>abe</b>" in html
    assert "call 1" in html


def test_bulk_cancel_is_offered_after_an_in_place_filter(operator, new_run):
    """Defect 3: the button came only with a full reload; the htmx partial now carries it."""
    new_run()
    partial = operator.get(
        reverse("console:runs"), {"agent": "demo", "state": "running"}, headers=HX
    ).content.decode()
    assert partial.lstrip().startswith('<section id="listing"')
    assert "Cancel the matching runs" in partial
    assert 'name="agent" value="demo"' in partial and 'name="state" value="running"' in partial
    unfiltered = operator.get(reverse("console:runs"), headers=HX).content.decode()
    assert "Cancel the matching runs" not in unfiltered


def test_count_chips_follow_the_other_filters(viewer, new_run):
    new_run()
    operations.start_run(agent="assistant", input="x", actor="t")
    counts = viewer.get(reverse("console:runs"), {"agent": "demo"}).context["counts"]
    assert counts["total"] == 1 and dict(counts["states"])["running"] == 1
    html = viewer.get(reverse("console:runs"), {"agent": "demo"}).content.decode()
    assert 'href="?agent=demo&amp;state=running"' in html
    assert viewer.get(reverse("console:runs")).context["counts"]["total"] == 2


def test_inbox_cards_and_buttons_say_the_run_and_the_tool(approver, approval_run):
    """Defect 7: 25 cards read "approval #0 ledger_approval" with "Approve" and "Deny"."""
    run, ticket_id = approval_run
    html = approver.get(reverse("console:inbox")).content.decode()
    short = run.run_id[:8]
    assert (
        f'aria-label="approval ticket: #0 ledger_approval of run {short} (demo); '
        'input: Record invoice-42."' in html
    )
    assert f'aria-label="Approve #0 ledger_approval of run {short}"' in html
    assert f'aria-label="Deny #0 ledger_approval of run {short}"' in html
    assert f"Reason for denying #0 ledger_approval, run {short}" in html


def test_a_childs_card_names_its_parent_and_the_parent_lists_what_children_do(approver, new_run):
    """Item 8: a child's inbox card names its parent; child runs show input and answer."""
    from tests.console.support import RunDriver

    parent = new_run(input="Delegate it.")
    parent.open_batch({"name": "delegate", "arguments": {"input": "find alpha"}})
    child_id = operations.start_run(
        agent="demo",
        input="find alpha",
        actor="t",
        child=ChildLink(
            run_id="c" * 32,
            parent_run_id=parent.run_id,
            parent_call_id=parent.calls[0].call_id,
            depth=1,
        ),
    )
    child = RunDriver(child_id)
    (call,) = child.open_batch(
        {"name": "ledger_approval", "arguments": {"key": "k"}, "permission": "ask"},
        text="alpha needs approval",
    )
    child.await_ticket(call, "approval")
    html = approver.get(reverse("console:inbox")).content.decode()
    assert f"child of run {parent.run_id[:8]}" in html and 'data-testid="parent-run"' in html
    page = approver.get(reverse("console:run", args=[parent.run_id])).content.decode()
    assert 'data-testid="child-input">find alpha<' in page
    assert 'data-testid="child-answer">alpha needs approval<' in page


def test_the_inbox_tab_counts_what_the_inbox_lists(viewer, approval_run, new_run):
    """Item 8: the badge counted delegation tickets the list does not show."""
    parent = new_run()
    (call,) = parent.open_batch({"name": "delegate", "arguments": {"input": "x"}})
    parent.execute(call)
    parent.await_ticket(call, "delegation", request={"child_run_id": "d" * 32})
    listed = viewer.get(reverse("console:inbox")).context["open_total"]
    tab = viewer.get(reverse("console:tab_count", args=["inbox"])).context["n"]
    assert listed == tab == 1


def test_the_audit_page_lists_people_not_timer_fires(viewer, new_run):
    """Item 8: automatic timer fires filled a page that says "operator decisions"."""
    run = new_run()
    (call,) = run.open_batch({"name": "wait", "arguments": {"seconds": 1}, "effects": "none"})
    run.execute(call)
    ticket = run.await_ticket(call, "timer", request={"due_at": timezone.now().isoformat()})
    operations.resume(
        run.run_id,
        ResumeCommand(ticket_id=ticket, kind=TicketKind.TIMER, decision=Decision.APPROVE),
        actor="timer",
    )
    assert viewer.get(reverse("console:audit")).context["entries"] == []
    shown = viewer.get(reverse("console:audit"), {"runtime": "on"}).context["entries"]
    assert [(e.actor, e.decision) for e in shown] == [("timer", "approve")]


def test_a_long_run_numbers_its_calls_run_wide(viewer, new_run):
    """Item 8: in a run of many calls, "call 57" is findable (not only "Step 3, #8")."""
    run = new_run()
    for _ in range(3):
        batch = run.open_batch(
            *({"name": "ledger_replay", "arguments": {"key": "k"}} for _ in range(4))
        )
        for call in batch:
            run.execute(call)
            run.complete(call, "{}")
        run.finalize()
    html = viewer.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert 'id="call-n12">call 12<' in html and "call 9: #0 ledger_replay" in html


def test_fork_from_a_step_in_the_console(operator, viewer, new_run):
    """Item 4: the run page forks after a chosen step; both runs link to each other."""
    run = new_run(input="Record a, then b.")
    (a,) = run.open_batch({"name": "ledger_once", "arguments": {"key": "a"}})
    run.execute(a)
    run.complete(a, '{"recorded": "a"}')
    run.finalize()
    (b,) = run.open_batch({"name": "ledger_once", "arguments": {"key": "b"}})
    run.execute(b)
    run.complete(b, '{"recorded": "b"}')
    run.finalize()
    run.text_step("done", end=True)
    page = operator.get(reverse("console:run", args=[run.run_id]))
    said = dict(page.context["finished_steps"])
    assert list(said) == [1, 2, 3]
    # Issue 32: the form says what a fork after each step runs again, before the click.
    assert said[1] == (
        "This run's steps 2–3 are not copied: the fork asks the model for step 2 now, and"
        " may call again what steps 2–3 called: ledger_once (effect once) (as new operations)."
    )
    assert said[2] == (
        "This run's step 3 is not copied: the fork asks the model for step 3 now; step 3"
        " called no tools."
    )
    assert said[3] == "Nothing of this run is repeated: the fork asks the model for step 4."
    assert f'data-testid="fork-statement" aria-live="polite">{said[3]}<' in page.content.decode()
    assert 'action="' + reverse("console:fork", args=[run.run_id]) in page.content.decode()
    assert 'id="fork"' not in viewer.get(reverse("console:run", args=[run.run_id])).content.decode()
    url = reverse("console:fork", args=[run.run_id])
    assert viewer.post(url, {"at_step": "1"}).status_code == 403
    refused = operator.post(url, {"at_step": "7"}, follow=True)
    assert (
        "Not forked: run" in refused.content.decode()
        and "has no step 7" in refused.content.decode()
    )
    response = operator.post(url, {"at_step": "1", "input": "only a, then c"})
    assert response.status_code == 302
    fork = Run.objects.exclude(thread_id=Run.objects.get(id=run.run_id).thread_id).get()
    assert response["Location"] == reverse("console:run", args=[fork.id])
    html = operator.get(response["Location"]).content.decode()
    assert 'data-testid="forked-from"' in html and run.run_id[:8] in html
    assert "forked from run" in html  # the fork point in its commit log
    assert "only a, then c" in html
    source = operator.get(reverse("console:run", args=[run.run_id])).content.decode()
    assert 'data-testid="forks"' in source and fork.id[:8] in source and "by olga" in source


def test_search_runs_in_the_console(viewer, new_run):
    """Item 5: free text in input, answers and tool arguments; more filters; keyset pages."""
    acme = new_run(input="Charge ACME", metadata={"customer": "acme"})
    acme.open_batch({"name": "ledger_once", "arguments": {"key": "invoice-42"}})
    other = new_run(input="Refund Globex")
    other.text_step("Refunded 30 euros.", end=True)

    def shown(**query) -> list[str]:
        response = viewer.get(reverse("console:runs"), query)
        assert response.status_code == 200
        return [r.id for r in response.context["runs"]]

    assert shown(q="acme") == [acme.run_id]
    assert shown(q="euros") == [other.run_id]
    assert shown(q="invoice-42") == [acme.run_id]
    assert shown(q=other.run_id[:8]) == [other.run_id]
    assert shown(tool="ledger_once") == [acme.run_id]
    assert shown(meta_key="customer", meta_value="acme") == [acme.run_id]
    assert shown(since="2000-01-01T00:00", until="2000-01-02") == []
    assert len(shown(since="2000-01-01T00:00")) == 2
    html = viewer.get(reverse("console:runs"), {"tool": "ledger_once"}).content.decode()
    assert "More filters" in html and 'details class="more-filters" open' in html
    bad = viewer.get(reverse("console:runs"), {"since": "soon"}).content.decode()
    assert "Not applied: Started from" in bad
