"""Resume commands against the committed ticket: what is refused writes nothing; a repeat with
its idempotency key gets the first answer.

Refusals: another ticket, another kind (or a decision the kind does not take), input that
fails the ticket's JSON schema, a consumed ticket, an Ended run, a run that is not Awaiting.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from runtime.demo.agent import ask_input
from runtime.documents import run_document
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import (
    IdempotencyKeyReused,
    InvalidInput,
    KindMismatch,
    NotAwaiting,
    RunEnded,
    TicketConsumed,
    TicketMismatch,
)
from runtime.models import CommandRecord, Ticket
from runtime.operations import cancel, resume
from tests.runtime.support import (
    assert_log_sound,
    calls,
    commit_count,
    ledger,
    run_row,
    text_step,
    tool_step,
    twins,
)

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = {
    "type": "object",
    "properties": {"size": {"type": "integer", "minimum": 1}},
    "required": ["size"],
    "additionalProperties": False,
}
ASK = tool_step(("ask_input", {"question": "Which size?", "answer_schema": SCHEMA}))
APPROVE = tool_step(("ledger_approval", {"key": "k"}))


@pytest.fixture
def awaiting(start, work_inline):
    """Return a function starting a run whose first call waits on a ticket: (run id, ticket)."""

    def make(step: dict[str, Any]) -> tuple[str, Ticket]:
        run_id = start(step, text_step())
        work_inline()
        assert run_row(run_id).state == "awaiting"
        return run_id, Ticket.objects.get(run_id=run_id, state="open")

    return make


def _command(ticket: Ticket, **changes: Any) -> ResumeCommand:
    fields: dict[str, Any] = {"ticket_id": ticket.id, "kind": TicketKind(ticket.kind)}
    fields["decision"] = Decision.INPUT if ticket.kind == "input" else Decision.APPROVE
    fields["input"] = {"size": 2} if ticket.kind == "input" else None
    fields.update(changes)
    return ResumeCommand(**fields)


# (case, which ticket, what the command changes, the refusal)
REFUSALS = [
    ("other ticket", "input", {"ticket_id": "0" * 32}, TicketMismatch),
    ("other call", "input", {"call_id": "0" * 32}, TicketMismatch),
    (
        "approval to input",
        "input",
        {"kind": TicketKind.APPROVAL, "decision": Decision.APPROVE, "input": None},
        KindMismatch,
    ),
    (
        "input to approval",
        "approval",
        {"kind": TicketKind.INPUT, "decision": Decision.INPUT, "input": {"size": 2}},
        KindMismatch,
    ),
    (
        "input decision",
        "approval",
        {"decision": Decision.INPUT, "input": {"size": 2}},
        KindMismatch,
    ),
    ("approve an input", "input", {"decision": Decision.APPROVE, "input": None}, KindMismatch),
    ("wrong type", "input", {"input": {"size": "two"}}, InvalidInput),
    ("missing field", "input", {"input": {}}, InvalidInput),
    ("extra field", "input", {"input": {"size": 2, "colour": "red"}}, InvalidInput),
    ("below minimum", "input", {"input": {"size": 0}}, InvalidInput),
    ("not an object", "input", {"input": [2]}, InvalidInput),
    ("no input", "input", {"input": None}, InvalidInput),
]


def test_refused_resumes_write_nothing(awaiting):
    tickets = {"input": awaiting(ASK), "approval": awaiting(APPROVE)}
    for case, kind, changes, error in REFUSALS:
        run_id, ticket = tickets[kind]
        thread_id = run_row(run_id).thread_id
        before = commit_count(thread_id)
        with pytest.raises(error):
            resume(run_id, _command(ticket, **changes), idempotency_key="key-1")
        assert commit_count(thread_id) == before, case
        assert not CommandRecord.objects.exists(), case  # a refusal is not an answer to repeat
        ticket.refresh_from_db()
        assert (ticket.state, run_row(run_id).state) == ("open", "awaiting"), case
    # The right answer still works afterwards, even under the key the refusals carried.
    for run_id, ticket in tickets.values():
        before = commit_count(run_row(run_id).thread_id)
        document = resume(run_id, _command(ticket), idempotency_key="key-1")
        assert (document["state"], document["ticket"]) == ("running", None)
        assert commit_count(run_row(run_id).thread_id) == before + 1


@pytest.mark.parametrize("step", [ASK, APPROVE], ids=["input", "approval"])
def test_consumed_ticket_is_refused_to_any_other_command(awaiting, step):
    run_id, ticket = awaiting(step)
    thread_id = run_row(run_id).thread_id
    resume(run_id, _command(ticket), actor="op")
    seen = commit_count(thread_id)
    with pytest.raises(TicketConsumed):  # another answer
        resume(run_id, _command(ticket, decision=Decision.DENY, input=None), actor="op")
    with pytest.raises(TicketConsumed):  # another note
        resume(run_id, _command(ticket, reason="changed my mind"), actor="op")
    with pytest.raises(TicketConsumed):  # the same answer from someone else
        resume(run_id, _command(ticket), actor="someone-else")
    assert commit_count(thread_id) == seen


@pytest.mark.parametrize("step", [ASK, APPROVE], ids=["input", "approval"])
def test_the_same_command_again_gets_the_committed_answer_without_a_key(
    awaiting, work_inline, step
):
    """Issue 21, item 2: a client that never learnt its answer sends the command again,
    without an idempotency key: it gets the run document, and nothing is written twice,
    also after the run has gone on and ended."""
    run_id, ticket = awaiting(step)
    thread_id = run_row(run_id).thread_id
    first = resume(run_id, _command(ticket), actor="op")
    seen = commit_count(thread_id)
    again = resume(run_id, _command(ticket), actor="op")
    assert (again["id"], again["version"], again["state"]) == (run_id, first["version"], "running")
    assert commit_count(thread_id) == seen
    work_inline()
    assert resume(run_id, _command(ticket), actor="op")["end_cause"] == "natural"
    assert_log_sound(run_id)


def test_resume_to_an_ended_run_is_refused(awaiting):
    run_id, ticket = awaiting(ASK)
    cancel(run_id)
    thread_id = run_row(run_id).thread_id
    seen = commit_count(thread_id)
    with pytest.raises(RunEnded):
        resume(run_id, _command(ticket))
    with pytest.raises(RunEnded):
        resume(run_id, _command(ticket, ticket_id="0" * 32), idempotency_key="late")
    assert commit_count(thread_id) == seen
    assert not CommandRecord.objects.exists()


def test_resume_to_a_running_run_is_refused(start):
    run_id = start(text_step())
    seen = commit_count(run_row(run_id).thread_id)
    command = ResumeCommand(ticket_id="0" * 32, kind=TicketKind.APPROVAL, decision=Decision.APPROVE)
    with pytest.raises(NotAwaiting):
        resume(run_id, command)
    assert commit_count(run_row(run_id).thread_id) == seen


def test_repeated_resume_gets_the_first_answer(awaiting, work_inline):
    run_id, ticket = awaiting(ASK)
    thread_id = run_row(run_id).thread_id
    first = resume(run_id, _command(ticket), actor="op", idempotency_key="answer-1")
    assert (first["state"], first["ticket"]) == ("running", None)
    seen = commit_count(thread_id)
    assert resume(run_id, _command(ticket), actor="op", idempotency_key="answer-1") == first
    assert commit_count(thread_id) == seen

    work_inline()  # the run goes on and ends; the repeat still gets the first answer
    assert run_row(run_id).end_cause == "natural"
    assert resume(run_id, _command(ticket), idempotency_key="answer-1") == first
    with pytest.raises(IdempotencyKeyReused):
        resume(run_id, _command(ticket, input={"size": 3}), idempotency_key="answer-1")
    assert CommandRecord.objects.filter(run_id=run_id).count() == 1

    (call,) = calls(run_id)
    assert (call.phase, call.attempt, json.loads(call.result)) == ("completed", 0, {"size": 2})
    assert ledger(run_id) == {}
    assert_log_sound(run_id)


def test_twin_resumes_sent_at_once_get_the_first_answer(awaiting):
    # On PostgreSQL the second waits for the first one's commit and then finds the ticket
    # consumed: it must answer with the first one's document, not refuse.
    run_id, ticket = awaiting(APPROVE)
    before = commit_count(run_row(run_id).thread_id)
    first, second = twins(lambda: resume(run_id, _command(ticket), idempotency_key="twin"))
    assert isinstance(first, dict), first
    assert second == first
    assert commit_count(run_row(run_id).thread_id) == before + 1
    assert CommandRecord.objects.filter(run_id=run_id).count() == 1


@pytest.mark.parametrize("decision", [Decision.APPROVE, Decision.DENY])
def test_approval_resumed_then_run_once(awaiting, work_inline, decision):
    run_id, ticket = awaiting(APPROVE)
    resume(run_id, _command(ticket, decision=decision))
    work_inline()
    (call,) = calls(run_id)
    assert run_row(run_id).end_cause == "natural"
    effects = list(ledger(run_id))
    if decision is Decision.APPROVE:
        assert (call.phase, call.attempt, effects) == ("completed", 1, [call.operation_id])
    else:
        assert (call.phase, call.attempt, call.is_error, effects) == ("completed", 0, True, [])
    assert_log_sound(run_id)


def test_an_edited_approval_runs_the_edit_and_every_projection_says_so(awaiting, work_inline):
    """Issue 21, item 4: the call's row and the run document show the arguments that ran,
    the model's beside them, and the log checker finds nothing after the approval or the end."""
    run_id, ticket = awaiting(APPROVE)  # the model asked for {"key": "k"}
    resume(run_id, _command(ticket, arguments={"key": "edited-key"}), actor="op")
    assert_log_sound(run_id)
    (call,) = calls(run_id)
    assert (call.arguments, call.model_arguments) == ({"key": "edited-key"}, {"key": "k"})
    assert call.arguments_text == '{"key": "edited-key"}'
    work_inline()
    assert run_row(run_id).end_cause == "natural"
    assert_log_sound(run_id)
    assert [effect["key"] for effect in ledger(run_id).values()] == ["edited-key"]
    (shown,) = run_document(run_id)["batches"][0]["calls"]
    assert (shown["arguments"], shown["model_arguments"]) == ({"key": "edited-key"}, {"key": "k"})


def test_an_approval_without_an_edit_keeps_no_model_arguments(awaiting, work_inline):
    run_id, ticket = awaiting(APPROVE)
    resume(run_id, _command(ticket))
    work_inline()
    (shown,) = run_document(run_id)["batches"][0]["calls"]
    assert (shown["arguments"], shown["model_arguments"]) == ({"key": "k"}, None)
    assert_log_sound(run_id)


@pytest.mark.slow
def test_cli_refusals_write_nothing(awaiting, command):
    (ask_run, ask_ticket), (approval_run, approval_ticket) = awaiting(ASK), awaiting(APPROVE)
    cases = [
        (approval_run, ["--ticket", "0" * 32, "--approve"], "ticket_mismatch"),
        (approval_run, ["--ticket", approval_ticket.id, "--input", '{"size": 2}'], "kind_mismatch"),
        (ask_run, ["--ticket", ask_ticket.id, "--input", '{"size": "two"}'], "invalid_input"),
        (ask_run, ["--ticket", ask_ticket.id, "--input", "{size: 2"], "--input: not valid JSON"),
    ]
    for run_id, args, error in cases:
        thread_id = run_row(run_id).thread_id
        seen = commit_count(thread_id)
        done = command("runtime_resume", run_id, *args)
        assert (done.returncode, error in done.stderr) == (1, True), done.stderr
        assert commit_count(thread_id) == seen


def test_ask_input_without_a_schema_says_nothing_was_asked_and_why(start, work_inline):
    """Issue 21, item 7: such a run ended ``natural`` with pydantic's "Field required" as the
    only trace. The call completes at once with an error result that says no input was asked
    and names the missing argument; no ticket is opened; the next step sees it."""
    run_id = start(tool_step(("ask_input", {"question": "How many?"})), text_step("asked"))
    work_inline()
    (call,) = calls(run_id)
    assert (call.phase, call.is_error, call.attempt) == ("completed", True, 0)
    assert call.result == (
        "invalid arguments for ask_input: (root): no input was asked: answer_schema is"
        " required, the JSON schema the person's answer must match (for free text:"
        ' {"type": "string"})'
    )
    assert not Ticket.objects.filter(run_id=run_id).exists()
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert_log_sound(run_id)


def test_ask_input_tells_the_model_that_answer_schema_is_required():
    schema = ask_input.parameters
    assert schema["required"] == ["question", "answer_schema"]
    assert "for free text" in schema["properties"]["answer_schema"]["description"]
