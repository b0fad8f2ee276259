"""``runtime_show``: a failed run says why; an ended run shows its final answer."""

from __future__ import annotations

from io import StringIO

from django.core.management import call_command

from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.models import Ticket
from runtime.operations import resume
from tests.runtime.support import run_row, text_step, tool_step


def show(run_id: str) -> str:
    out = StringIO()
    call_command("runtime_show", run_id, stdout=out)
    return out.getvalue()


def test_a_failed_run_prints_its_error(start, work_inline):
    run_id = start({"error": "fatal"})
    work_inline()
    assert run_row(run_id).end_cause == "failed"
    lines = show(run_id).splitlines()
    assert lines[0].startswith(f"run {run_id} agent=demo state=ended (failed)")
    assert lines[1] == "  error: model_error (scripted): scripted fatal error"
    assert not any(line.startswith("  answer:") for line in lines)


def test_an_ended_run_prints_its_final_answer(start, work_inline):
    run_id = start(tool_step(("ledger_replay", {"key": "a"})), text_step("All recorded."))
    work_inline()
    lines = show(run_id).splitlines()
    assert lines[-1] == "  answer: All recorded."
    assert "    [0] ledger_replay completed attempt=1" in "\n".join(lines)


def test_a_running_run_has_no_answer_yet(start):
    run_id = start(text_step("later"))
    assert "answer:" not in show(run_id)


def test_a_denied_call_says_so(start, work_inline):
    run_id = start(tool_step(("ledger_approval", {"key": "b"})), text_step())
    work_inline()
    ticket = Ticket.objects.get(run_id=run_id, state="open")
    command = ResumeCommand(ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.DENY)
    resume(run_id, command)
    work_inline()
    (line,) = [line for line in show(run_id).splitlines() if "ledger_approval" in line]
    assert " completed attempt=0 " in line and " error: Denied by operator" in line
