"""The log and its projections agree after every kind of operator command (issue 21, item 4).

Hypothesis draws how an operator answers a real run of the demo agent (scripted model, the
real worker's loop inline): each approval is approved, approved with edited arguments,
answered with a supplied result or denied; the input ticket is answered or denied; the timer
is fired early; or the run is cancelled at one of its tickets; after the end, the calls that
were sealed Indeterminate are reconciled, and a reconciliation that contradicts an earlier one
is recorded as a correction. The log checker (``fsck.check_thread``, with the no-Requested-
after-Executing checks of ``assert_log_sound``) must find nothing after each command and after
the run's end. The explicit examples make sure every command kind is driven on every run of
the suite, whatever the draws.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import ReconciliationContradicts
from runtime.models import Ticket, ToolCallRecord
from runtime.operations import cancel, reconcile, resume
from tests.runtime.support import assert_log_sound, run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)

ANSWER_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
# One batch that asks for every kind of ticket a person answers: an approval, an input, a
# timer, and a second approval; then a text step that ends the run.
SCRIPT = (
    tool_step(
        ("ledger_approval", {"key": "a"}),
        ("ask_input", {"question": "How many?", "answer_schema": ANSWER_SCHEMA}),
        ("wait", {"seconds": 600}),
        ("ledger_approval", {"key": "b"}),
    ),
    text_step(),
)
APPROVALS = ("approve", "approve_edited", "respond", "deny")
INPUTS = ("input", "deny")
OUTCOMES = ("applied", "not_applied", "unknown")


@dataclass(frozen=True)
class Plan:
    """How the operator answers: one answer per approval (in order), the input's answer,
    the ticket (0-3, in the order they open) at which the run is cancelled instead, and the
    reconciliations recorded after the end."""

    approvals: tuple[str, str]
    input: str
    cancel_at: int | None
    outcomes: tuple[str, ...]


plans = st.builds(
    Plan,
    approvals=st.tuples(st.sampled_from(APPROVALS), st.sampled_from(APPROVALS)),
    input=st.sampled_from(INPUTS),
    cancel_at=st.none() | st.integers(0, 3),
    outcomes=st.lists(st.sampled_from(OUTCOMES), max_size=3).map(tuple),
)


def _answer(ticket: Ticket, plan: Plan, approvals_seen: int) -> ResumeCommand:
    """The plan's command for the open ``ticket``."""
    kind = TicketKind(ticket.kind)
    command = ResumeCommand(ticket_id=ticket.id, kind=kind, decision=Decision.APPROVE)
    if kind is TicketKind.TIMER:
        return command  # fired now, by a person
    if kind is TicketKind.INPUT:
        if plan.input == "deny":
            return replace(command, decision=Decision.DENY, reason="no")
        return replace(command, decision=Decision.INPUT, input={"n": 3})
    answer = plan.approvals[approvals_seen]
    if answer == "approve_edited":
        return replace(command, arguments={"key": f"edited-{ticket.id[:6]}"}, reason="typo")
    if answer == "respond":
        return replace(command, decision=Decision.RESPOND, input={"recorded": "by hand"})
    if answer == "deny":
        return replace(command, decision=Decision.DENY, reason="not now")
    return command


def _reconcile(call: ToolCallRecord, outcome: str) -> None:
    """Record ``outcome`` for ``call``; one that contradicts an earlier decisive record is
    recorded as a correction, as an operator must."""
    evidence = "ledger row 7" if outcome == "applied" else ""
    try:
        reconcile(call.id, outcome=outcome, evidence=evidence, actor="op")
    except ReconciliationContradicts:
        reconcile(call.id, outcome=outcome, evidence=evidence, actor="op", correction=True)


def _drive(plan: Plan, start: Any, work_inline: Any) -> str:
    """Run the script under ``plan``, checking the log after every command; return the run."""
    run_id = start(*SCRIPT)
    work_inline()
    opened = approvals_seen = 0
    while run_row(run_id).state == "awaiting":
        ticket = Ticket.objects.get(run_id=run_id, state="open")
        if plan.cancel_at == opened:
            cancel(run_id, actor="op", reason="stop")
        else:
            resume(run_id, _answer(ticket, plan, approvals_seen), actor="op")
            approvals_seen += ticket.kind == "approval"
        assert_log_sound(run_id)
        opened += 1
        work_inline()
    assert run_row(run_id).state == "ended"
    assert_log_sound(run_id)
    return run_id


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(plan=plans)
@example(plan=Plan(("approve_edited", "approve"), "input", None, ()))
@example(plan=Plan(("respond", "deny"), "deny", None, ()))
@example(plan=Plan(("approve", "approve"), "input", 2, ("applied", "not_applied", "unknown")))
def test_fsck_is_clean_after_every_operator_command(start, work_inline, plan: Plan) -> None:
    run_id = _drive(plan, start, work_inline)
    sealed = list(ToolCallRecord.objects.filter(run_id=run_id, phase="indeterminate"))
    for i, outcome in enumerate(plan.outcomes):
        if sealed:
            _reconcile(sealed[i % len(sealed)] if outcome == "unknown" else sealed[0], outcome)
            assert_log_sound(run_id)
