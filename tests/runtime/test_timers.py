"""Scheduled waits: a tool waits on a timer ticket holding no worker; the timer fires once.

Inline tests drive the real Worker in this process; the race and restart tests start real
worker processes. A fire is a committed ResumeCommand (actor ``timer``, or the operator who
fired it early); the consumed ticket and the expected-version check refuse any second fire.
"""

from __future__ import annotations

import json
import signal
from datetime import datetime

import pytest
from django.utils import timezone

from runtime import timers
from runtime.domain.events import CallResumed
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import TicketConsumed, TicketNotAnswerable
from runtime.models import ThreadCommit, Ticket
from runtime.operations import cancel, resume
from tests.runtime.support import (
    applied,
    assert_log_sound,
    calls,
    drafts,
    run_row,
    text_step,
    tool_step,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


def wait_step(seconds: float, *more: tuple[str, dict]) -> dict:
    return tool_step(("wait", {"seconds": seconds}), *more)


def timer_ticket(run_id: str) -> Ticket:
    (ticket,) = Ticket.objects.filter(run_id=run_id, kind="timer")
    return ticket


def fires(run_id: str) -> list[tuple[str, str]]:
    """Every committed resume of the run's timer tickets: (ticket id, actor)."""
    thread_id = run_row(run_id).thread_id
    return [
        (event.ticket_id, draft.actor)
        for _, draft in drafts(thread_id)
        for event in draft.events
        if isinstance(event, CallResumed)
    ]


def test_waits_without_a_worker_then_fires_when_due(start, work_inline):
    run_id = start(wait_step(0.3, ("ledger_once", {"key": "after"})), text_step())
    before = timezone.now()
    work_inline()
    ticket = timer_ticket(run_id)
    assert (run_row(run_id).state, ticket.state) == ("awaiting", "open")
    assert ticket.due_at is not None and ticket.due_at > before
    assert datetime.fromisoformat(ticket.request["due_at"]) == ticket.due_at
    wait_call, later = calls(run_id)
    assert (wait_call.phase, wait_call.attempt, later.phase) == ("awaiting", 1, "requested")
    assert timers.fire_due() == 0  # not due yet
    wait_for(lambda: timezone.now() >= ticket.due_at, what="the due time")
    work_inline()
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    wait_call, later = calls(run_id)
    assert (wait_call.phase, wait_call.attempt) == ("completed", 2)
    assert json.loads(wait_call.result) == {"waited": 0.3}
    assert applied(later) == 1
    assert fires(run_id) == [(ticket.id, "timer")]
    ticket.refresh_from_db()
    assert (ticket.state, ticket.closed_by, ticket.decision) == ("consumed", "timer", "approve")
    assert_log_sound(run_id)


def test_operator_fires_now_once(start, work_inline):
    run_id = start(wait_step(3600), text_step())
    work_inline()
    ticket = timer_ticket(run_id)
    document = timers.fire(run_id, ticket.id, actor="alice")
    assert document["state"] == "running"
    with pytest.raises(TicketConsumed):
        timers.fire(run_id, ticket.id, actor="bob")
    work_inline()
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert fires(run_id) == [(ticket.id, "alice")]
    assert_log_sound(run_id)


@pytest.mark.slow
def test_the_cli_fires_a_timer_but_does_not_deny_it(start, work_inline, command):
    """``runtime_resume --deny`` on a timer is refused (``ticket_not_answerable``, nothing
    written); ``--approve`` fires it now, as the console's "Fire now" does."""
    run_id = start(wait_step(3600), text_step())
    work_inline()
    ticket = timer_ticket(run_id)
    seen = ThreadCommit.objects.count()
    done = command("runtime_resume", run_id, "--ticket", ticket.id, "--deny", "--reason", "no")
    assert done.returncode == 1 and "ticket_not_answerable" in done.stderr, done.stderr
    assert "fire it now (approve)" in done.stderr
    assert ThreadCommit.objects.count() == seen
    done = command("runtime_resume", run_id, "--ticket", ticket.id, "--approve")
    assert done.returncode == 0, done.stderr
    ticket.refresh_from_db()
    assert (ticket.state, ticket.decision) == ("consumed", "approve")


def test_firing_a_timer_refuses_edited_arguments(start, work_inline):
    """A timer only fires: an ``arguments`` edit is an approval's, never a timer's (found by an
    adversarial pass: the fire was accepted and the woken attempt ran with the edit)."""
    run_id = start(wait_step(600), text_step())
    work_inline()
    ticket = timer_ticket(run_id)
    version = run_row(run_id).version
    command = ResumeCommand(
        ticket_id=ticket.id,
        kind=TicketKind.TIMER,
        decision=Decision.APPROVE,
        arguments={"seconds": 5},
    )
    with pytest.raises(TicketNotAnswerable) as refused:
        resume(run_id, command, actor="op")
    assert "no edited arguments" in refused.value.message
    assert run_row(run_id).version == version  # nothing written
    assert Ticket.objects.get(id=ticket.id).state == "open"


def test_cancel_voids_the_timer(start, work_inline):
    run_id = start(wait_step(0.2), text_step())
    work_inline()
    ticket = timer_ticket(run_id)
    cancel(run_id, actor="alice")
    wait_for(lambda: timezone.now() >= ticket.due_at, what="the due time")
    assert timers.fire_due() == 0
    ticket.refresh_from_db()
    assert ticket.state == "void"
    assert fires(run_id) == []
    (call,) = calls(run_id)
    assert call.phase == "indeterminate"
    assert_log_sound(run_id)


@pytest.mark.slow
def test_three_workers_race_and_it_fires_once(start, spawn_worker):
    run_id = start(wait_step(1.0), text_step())
    workers = [spawn_worker(until_idle=False, worker_id=f"w{i}") for i in range(3)]
    try:
        # A SIGTERM before a worker set its handlers would kill it (exit -15), not stop it.
        wait_for(lambda: all("started" in w.stderr for w in workers), what="the workers' starts")
        wait_for(lambda: run_row(run_id).state == "ended", timeout=60, what="the run's end")
    finally:
        for process in workers:
            process.signal(signal.SIGTERM)
        for process in workers:
            assert process.wait()[0] == 0
    ticket = timer_ticket(run_id)
    assert fires(run_id) == [(ticket.id, "timer")]
    assert run_row(run_id).end_cause == "natural"
    assert ThreadCommit.objects.filter(run_id=run_id, actor="timer").count() == 1
    assert_log_sound(run_id)


@pytest.mark.slow
def test_fires_when_a_worker_returns_after_the_due_time(start, worker):
    run_id = start(wait_step(0.2, ("ledger_replay", {"key": "k"})), text_step())
    assert worker(worker_id="before")[0] == 0  # parks the run, then nothing is running
    ticket = timer_ticket(run_id)
    wait_for(lambda: timezone.now() >= ticket.due_at, what="the due time")
    assert run_row(run_id).state == "awaiting"  # no worker is alive to fire it
    assert worker(worker_id="after")[0] == 0
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert fires(run_id) == [(ticket.id, "timer")]
    assert applied(calls(run_id)[1]) == 1
    assert_log_sound(run_id)
