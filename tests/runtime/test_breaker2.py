"""Regressions found by the breaker2 adversarial pass (see the report on branch breaker2)."""

from __future__ import annotations

import json
import threading

import pytest

from runtime import conf
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import RuntimeFault
from runtime.models import Ticket
from runtime.operations import resume
from runtime.worker import Heartbeat
from tests.runtime.support import calls, run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.xfail(
    strict=True,
    reason="breaker2: firing a timer accepts `arguments` and the woken attempt runs with them",
)
def test_firing_a_timer_refuses_edited_arguments(start, work_inline):
    """A timer only fires (README, Errors): an `arguments` edit is an approval's, never a
    timer's. Today the fire is accepted and the woken attempt runs with the edit, while the
    run document still shows the model's arguments."""
    run_id = start(tool_step(("wait", {"seconds": 600})), text_step())
    work_inline()
    (ticket,) = Ticket.objects.filter(run_id=run_id, kind="timer")
    version = run_row(run_id).version
    command = ResumeCommand(
        ticket_id=ticket.id,
        kind=TicketKind.TIMER,
        decision=Decision.APPROVE,
        arguments={"seconds": 5},
    )
    try:
        resume(run_id, command, actor="op")
    except RuntimeFault as exc:
        assert exc.code == "ticket_not_answerable"
        assert run_row(run_id).version == version  # nothing written
        return
    work_inline()
    (wait_call,) = calls(run_id)
    # what actually happens: the tool ran with the operator's seconds, not the model's
    assert json.loads(wait_call.result) == {"waited": 600}


def test_heartbeat_survives_a_database_error(monkeypatch):
    """One failed renewal (a DB blip: the connection was terminated) must not end the
    heartbeat thread for the worker's life: its leases would lapse while its loops keep
    driving, and another worker would drive the same runs at the same time."""
    monkeypatch.setattr(conf, "heartbeat_seconds", lambda: 0.01)
    beats = []
    twice = threading.Event()

    def beat() -> None:
        beats.append(1)
        if len(beats) == 1:
            raise RuntimeError("server closed the connection unexpectedly")
        twice.set()

    heartbeat = Heartbeat()
    monkeypatch.setattr(heartbeat, "beat", beat)
    heartbeat.start()
    try:
        assert twice.wait(5), "the heartbeat thread died on its first failed beat"
    finally:
        heartbeat.done.set()
        heartbeat.join(5)
