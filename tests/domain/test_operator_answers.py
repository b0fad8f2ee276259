"""What a person may answer on each ticket kind: pure, no database.

The table is written out here from the seed ("call at Awaiting: accept only a command matching
the committed ticket and wait kind") and DESIGN.md's tickets, not imported: a delegation
ticket is answered only by its child run's end, a timer only fires (an operator may fire it
now), approvals and inputs are what people answer.
"""

from __future__ import annotations

from itertools import product

import pytest

from runtime.domain.commit import check_operator_decision
from runtime.domain.model import Decision, TicketKind
from runtime.errors import KindMismatch, TicketNotAnswerable

OK, NOT_ANSWERABLE, MISMATCH = "ok", "not answerable", "kind mismatch"
A, D, IN, RE = Decision.APPROVE, Decision.DENY, Decision.INPUT, Decision.RESPOND
PEOPLE_MAY_SEND = {
    TicketKind.APPROVAL: {A, D, RE},
    TicketKind.INPUT: {IN, D},
    TicketKind.DELEGATION: set(),
    TicketKind.TIMER: {A},
    TicketKind.PAUSE: {Decision.RESUME},  # an operator's pause: only a resume answers it
}
# What the runtime sends and a person may not: a child's end (any decision is refused as
# not answerable), and a timer's deny (which only older logs hold).
RUNTIME_ONLY = {TicketKind.DELEGATION: set(Decision), TicketKind.TIMER: {D}}


def expected(kind: TicketKind, decision: Decision) -> str:
    if decision in PEOPLE_MAY_SEND[kind]:
        return OK
    return NOT_ANSWERABLE if decision in RUNTIME_ONLY.get(kind, set()) else MISMATCH


def outcome(kind: TicketKind, decision: Decision | str, request: dict | None = None) -> str:
    try:
        check_operator_decision(kind, decision, request)
    except TicketNotAnswerable:
        return NOT_ANSWERABLE
    except KindMismatch:
        return MISMATCH
    return OK


@pytest.mark.parametrize(("kind", "decision"), list(product(TicketKind, Decision)))
def test_every_kind_and_decision(kind, decision):
    assert outcome(kind, decision) == expected(kind, decision)


@pytest.mark.parametrize("kind", list(TicketKind))
def test_text_from_a_form_is_judged_like_the_decision(kind):
    for decision in Decision:
        assert outcome(kind, decision.value) == expected(kind, decision)
    assert outcome(kind, "zzz") == (NOT_ANSWERABLE if kind is TicketKind.DELEGATION else MISMATCH)


def test_the_refusals_say_what_to_do_instead():
    with pytest.raises(TicketNotAnswerable) as refused:
        check_operator_decision(TicketKind.DELEGATION, D, {"child_run_id": "c" * 32})
    assert f"cancel the child run {'c' * 32}" in refused.value.message
    assert refused.value.detail == {
        "ticket_kind": "delegation",
        "decision": "deny",
        "allowed": [],
        "child_run_id": "c" * 32,
    }
    assert (refused.value.code, refused.value.status) == ("ticket_not_answerable", 409)
    due = "2026-01-01T00:00:00+00:00"
    with pytest.raises(TicketNotAnswerable) as refused:
        check_operator_decision(TicketKind.TIMER, D, {"due_at": due})
    assert f"fires by itself at {due}" in refused.value.message
    assert "fire it now (approve)" in refused.value.message
    assert "cancel the run" in refused.value.message
    assert refused.value.detail["allowed"] == ["approve"]
