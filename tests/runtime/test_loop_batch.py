"""A batch of three calls whose second is approval-gated, finished by one worker or by a fresh
worker after a crash.

The run awaits after the first call and the third does not run; approve runs the second once,
deny never runs it and publishes the denied result. The results are published in the model's
call order, and the next inference request is byte-identical whether built by the worker that
finished the batch or by a fresh worker that reads only committed state.
"""

from __future__ import annotations

import json

import pytest

from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.models import MessageRecord, ThreadCommit, Ticket
from runtime.operations import resume
from tests.runtime.support import (
    applied,
    assert_log_sound,
    assistant_messages,
    calls,
    ledger,
    rebuilt_request,
    run_row,
    text_step,
    tool_step,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

BATCH = tool_step(
    ("ledger_once", {"key": "first"}),
    ("ledger_approval", {"key": "second"}),
    ("ledger_replay", {"key": "third"}),
)
# Who finishes the batch after the resume: the worker that resumes it, or a fresh worker after
# the first one was killed at this point.
FINISHERS = ("same_worker", "call_completed", "batch_finalized")


def _finish(worker, finisher: str) -> None:
    if finisher == "same_worker":
        assert worker(worker_id="finisher")[0] == 0
        return
    code, err = worker(crash_at=finisher, worker_id="crasher")
    assert code == 137, err
    code, err = worker(worker_id="finisher")
    assert code == 0, err


def _normalized(run_id: str, request) -> bytes:
    """The request's canonical bytes with this run's operation ids replaced by their call
    index (the only run-specific values the results carry)."""
    raw = request.canonical()
    for call in calls(run_id):
        raw = raw.replace(call.operation_id.encode(), f"OP{call.index}".encode())
    return raw


@pytest.mark.parametrize("decision", [Decision.APPROVE, Decision.DENY])
def test_gated_second_call_same_or_fresh_worker(start, worker, decision):
    runs = {finisher: start(BATCH, text_step()) for finisher in FINISHERS}
    assert worker(worker_id="first")[0] == 0

    for run_id in runs.values():
        first, second, third = calls(run_id)
        assert run_row(run_id).state == "awaiting"
        assert (first.phase, applied(first)) == ("completed", 1)
        assert (second.phase, second.attempt, applied(second)) == ("awaiting", 0, 0)
        assert (third.phase, third.attempt, applied(third)) == ("requested", 0, 0)
        ticket = Ticket.objects.get(run_id=run_id, state="open")
        assert (ticket.kind, ticket.call_id) == ("approval", second.id)
        assert ticket.request["operation_id"] == second.operation_id
        assert not MessageRecord.objects.filter(run_id=run_id, role="tool").exists()

    requests = {}
    for finisher, run_id in runs.items():
        ticket = Ticket.objects.get(run_id=run_id, state="open")
        resume(
            run_id,
            ResumeCommand(
                ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=decision, reason="no"
            ),
        )
        _finish(worker, finisher)

        run = run_row(run_id)
        assert (run.state, run.end_cause, run.step) == ("ended", "natural", 2)
        first, second, third = calls(run_id)
        assert (applied(first), applied(third)) == (1, 1)
        # An approved second call's result commits with the third's Executing: a crash there
        # leaves the replay-safe third call Executing before its effect, so it replays. A
        # denial completes the second call in the resume, so the first result committed by the
        # worker is the third's, together with the publication.
        approved = decision is Decision.APPROVE
        replayed = finisher == "call_completed" and approved
        assert (first.attempt, third.attempt) == (1, 2 if replayed else 1)
        if decision is Decision.APPROVE:
            assert (second.phase, second.attempt, applied(second)) == ("completed", 1, 1)
        else:
            assert (second.phase, second.attempt, second.is_error) == ("completed", 0, True)
            assert second.result == "Denied by operator: no"
            assert second.operation_id not in ledger(run_id)
        # Published once, in the model's call order, in one commit before step 2.
        tools = list(MessageRecord.objects.filter(run_id=run_id, role="tool").order_by("idx"))
        assert [m.tool_call_id for m in tools] == ["call_1_0", "call_1_1", "call_1_2"]
        assert [m.content for m in tools] == [first.result, second.result, third.result]
        assert len({m.seq for m in tools}) == 1
        answer = assistant_messages(run_id)[-1]
        assert answer.seq > tools[0].seq
        # The worker that answered step 2 recorded the digest of the request it sent; a
        # fresh build from the committed state before that commit gives the same bytes.
        request = rebuilt_request(run_id, before_seq=answer.seq)
        assert answer.meta["request_sha256"] == request.digest()
        assert [m.role for m in request.messages] == ["user", "assistant", "tool", "tool", "tool"]
        requests[finisher] = _normalized(run_id, request)
        finalized_by = ThreadCommit.objects.get(thread_id=run.thread_id, seq=tools[0].seq).actor
        crasher_finalized = finisher == "batch_finalized" or (
            finisher == "call_completed" and not approved
        )
        assert finalized_by == ("worker:crasher" if crasher_finalized else "worker:finisher")
        assert_log_sound(run_id)

    assert requests["call_completed"] == requests["same_worker"]
    assert requests["batch_finalized"] == requests["same_worker"]
    assert b"Denied by operator" in requests["same_worker"] or decision is Decision.APPROVE
    assert json.loads(requests["same_worker"])["messages"][2]["tool_call_id"] == "call_1_0"
