"""Both state machines, table-driven over every (from, to) pair: pure, no database.

The expected tables are written out here from the seed (the tool-call and Run state diagrams),
not imported, so a change to the code's table shows up as a failing test.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import product

import pytest

from runtime.domain import transitions as t
from runtime.domain.commit import CommitDraft, apply_commit
from runtime.domain.model import (
    CallPhase,
    Decision,
    Disposition,
    Effects,
    EndCause,
    Permission,
    RecoveryPolicy,
    RunState,
    RunView,
    ThreadHead,
    TicketKind,
    ToolCall,
)
from runtime.errors import IllegalTransition, RunEnded
from tests.domain import drafts
from tests.domain.drafts import Ids, Log

R, X, A, C, I = (  # noqa: E741 - the seed's initials, as in transitions.py
    CallPhase.REQUESTED,
    CallPhase.EXECUTING,
    CallPhase.AWAITING,
    CallPhase.COMPLETED,
    CallPhase.INDETERMINATE,
)

# The seed's tool-call diagram, edge by edge.
SEED_CALL_EDGES = {
    (R, X),  # first executor attempt committed
    (X, X),  # retry under the pinned policy
    (R, A),  # gate or external input
    (X, A),  # delegated or scheduled wait
    (A, X),  # matching typed resume
    (R, C),  # immediate block or supplied result
    (X, C),  # ToolOutput committed
    (A, C),  # denied or externally completed
    (R, I),  # run ends before completion
    (X, I),  # outcome cannot be classified safely
    (A, I),  # owning run ends
}
CALL_PAIRS = list(product(CallPhase, CallPhase))


def call_in(phase: CallPhase) -> ToolCall:
    """A call of a generous pinned policy sitting in ``phase`` (an approved wait when
    Awaiting), so that only the machine itself can refuse a move."""
    call = ToolCall(
        call_id="c1",
        index=0,
        tool_call_id="tu1",
        name="echo",
        arguments={},
        arguments_text="{}",
        operation_id="op1",
        policy=RecoveryPolicy.REPLAY,
        permission=Permission.ALLOW,
        max_attempts=5,
    )
    return {
        R: call,
        X: replace(call, phase=X, attempt=1),
        A: replace(call, phase=A, attempt=1, ticket_id="t1", approved=True),
        C: replace(call, phase=C, attempt=1, result="ok"),
        I: replace(call, phase=I, attempt=1, result="?", is_error=True),
    }[phase]


# The one function that makes each move (Requested has none: nothing ever returns to it).
MOVERS = {
    X: lambda call: t.start_attempt(call, call.attempt + 1),
    A: lambda call: t.await_ticket(call, "t2"),
    C: lambda call: t.complete(call, "result", is_error=False),
    I: lambda call: t.seal_indeterminate(call, "the run ended"),
}


def assert_names_the_edge(error: IllegalTransition, machine: str, from_: str, to: str) -> None:
    assert error.detail["machine"] == machine
    assert error.detail["from_state"] == from_
    assert error.detail["to_state"] == to
    assert error.detail["why"]
    assert f"{from_} -> {to}" in str(error)
    assert error.detail["why"] in str(error)


def test_the_code_table_is_the_seed_table():
    assert t.LEGAL_CALL_TRANSITIONS == SEED_CALL_EDGES


@pytest.mark.parametrize(("from_", "to"), CALL_PAIRS, ids=lambda p: p.value)
def test_call_machine_check_accepts_exactly_the_seed_edges(from_, to):
    call = call_in(from_)
    if (from_, to) in SEED_CALL_EDGES:
        t.check_call_transition(call, to)
        return
    with pytest.raises(IllegalTransition) as excinfo:
        t.check_call_transition(call, to)
    assert_names_the_edge(excinfo.value, "tool call", from_.value, to.value)
    assert excinfo.value.detail["call_id"] == "c1"


@pytest.mark.parametrize(
    ("from_", "to"), [p for p in CALL_PAIRS if p[1] is not R], ids=lambda p: p.value
)
def test_call_machine_movers_follow_the_table(from_, to):
    call = call_in(from_)
    if (from_, to) in SEED_CALL_EDGES:
        moved = MOVERS[to](call)
        assert moved.phase is to
        assert moved.approved is False
        return
    with pytest.raises(IllegalTransition) as excinfo:
        MOVERS[to](call)
    assert_names_the_edge(excinfo.value, "tool call", from_.value, to.value)


@pytest.mark.parametrize(
    ("from_", "why"),
    [
        (X, "Executing is never turned back into Requested"),
        (R, "not an edge"),
        (A, "not an edge"),
        (C, "a terminal call never changes again"),
        (I, "a terminal call never changes again"),
    ],
)
def test_nothing_returns_to_requested(from_, why):
    with pytest.raises(IllegalTransition) as excinfo:
        t.check_call_transition(call_in(from_), R)
    assert why in excinfo.value.detail["why"]


@pytest.mark.parametrize(
    ("change", "attempt", "why"),
    [
        ({"permission": Permission.DENY}, 1, "permission denies"),
        ({"permission": Permission.ASK}, 1, "asks for approval first"),
        ({"phase": A, "ticket_id": "t1", "approved": False}, 1, "no matching resume"),
        ({"phase": X, "attempt": 1, "policy": RecoveryPolicy.INDETERMINATE}, 2, "never retries"),
        ({}, 2, "attempt must be 1, got 2"),
        ({"phase": X, "attempt": 1}, 1, "attempt must be 2, got 1"),
        ({"phase": X, "attempt": 5}, 6, "allows 5 attempts"),
        ({"max_attempts": 0}, 1, "allows 0 attempts"),
    ],
)
def test_start_attempt_guards_of_the_pinned_policy(change, attempt, why):
    call = replace(call_in(R), **change)
    with pytest.raises(IllegalTransition) as excinfo:
        t.start_attempt(call, attempt)
    assert why in excinfo.value.detail["why"]
    assert excinfo.value.detail["to_state"] == "executing"


@pytest.mark.parametrize(
    ("change", "attempt"),
    [
        ({}, 1),
        ({"phase": X, "attempt": 1, "policy": RecoveryPolicy.REPLAY}, 2),
        ({"phase": X, "attempt": 1, "policy": RecoveryPolicy.RECONNECT}, 2),
        ({"phase": A, "ticket_id": "t1", "approved": True, "permission": Permission.ASK}, 1),
    ],
)
def test_start_attempt_counts_attempts(change, attempt):
    moved = t.start_attempt(replace(call_in(R), **change), attempt)
    assert (moved.phase, moved.attempt, moved.approved) == (X, attempt, False)


@pytest.mark.parametrize(("from_", "started"), [(R, False), (X, True), (A, True)])
def test_seal_says_whether_an_effect_may_have_started(from_, started):
    call = call_in(from_)
    sealed = t.seal_indeterminate(call, "worker lost")
    assert sealed.phase is I and sealed.is_error
    assert sealed.effect_may_have_started is started
    assert call.operation_id in (sealed.result or "")
    assert ("may have taken effect" in (sealed.result or "")) is started


@pytest.mark.parametrize("from_", [R, X, A])
@pytest.mark.parametrize("effects", list(Effects))
def test_a_tool_without_external_effects_leaves_nothing_to_check(from_, effects):
    """Issue 22: the pinned effects decide with the attempt; "none" is never reconciled."""
    sealed = t.seal_indeterminate(replace(call_in(from_), effects=effects), "the run was cancelled")
    started = from_ is not R
    assert sealed.phase is I and sealed.is_error
    assert sealed.effect_may_have_started is (started and effects is not Effects.NONE)
    text = sealed.result or ""
    assert text.startswith("No external effect; nothing to check: the run was cancelled") is (
        started and effects is Effects.NONE
    )
    assert "op1" in text


def test_a_call_logged_before_effects_reads_as_once():
    assert ToolCall.__dataclass_fields__["effects"].default is Effects.ONCE


def test_seal_from_requested_after_an_awaiting_call_never_started():
    call = replace(call_in(R), phase=A, ticket_id="t1")  # awaited before any attempt
    assert t.seal_indeterminate(call, "run ended").effect_may_have_started is False


@pytest.mark.parametrize(
    ("decision", "phase", "approved", "is_error"),
    [
        (Decision.APPROVE, A, True, False),
        (Decision.DENY, C, False, True),
        (Decision.INPUT, C, False, False),
    ],
)
def test_resume_call(decision, phase, approved, is_error):
    call = replace(call_in(A), approved=False)
    resumed = t.resume_call(call, "t1", decision, "answer")
    assert (resumed.phase, resumed.approved, resumed.is_error) == (phase, approved, is_error)


def test_an_edit_runs_instead_of_the_models_arguments_which_stay_beside_it():
    call = replace(call_in(A), approved=False, arguments={"key": "m"}, arguments_text='{"key":"m"}')
    edit = {"z": 1, "key": "edited"}
    resumed = t.resume_call(call, "t1", Decision.APPROVE, "", edit)
    assert (resumed.arguments, resumed.model_arguments) == (edit, {"key": "m"})
    # Sorted keys: a fold of the log (whose JSON may come back reordered) writes the same text.
    assert resumed.arguments_text == '{"key": "edited", "z": 1}'
    unedited = t.resume_call(call, "t1", Decision.APPROVE, "")
    assert (unedited.arguments, unedited.model_arguments) == ({"key": "m"}, None)


@pytest.mark.parametrize(
    "call",
    [
        replace(call_in(A), approved=False, ticket_id="other"),
        call_in(A),  # already approved: the ticket was consumed
        call_in(X),
        call_in(C),
    ],
    ids=["other-ticket", "approved", "executing", "completed"],
)
def test_resume_call_refuses_anything_but_the_open_wait(call):
    with pytest.raises(IllegalTransition) as excinfo:
        t.resume_call(call, "t1", Decision.APPROVE, "")
    assert "not awaiting ticket t1" in excinfo.value.detail["why"]


# -- the Run machine, through the commit rule book ------------------------------------------

NEW = None  # a run that has not crossed its first commit (RunActivation is input)
SEED_RUN_EDGES = {
    (NEW, RunState.RUNNING),  # RunActivation
    (RunState.RUNNING, RunState.RUNNING),  # committed Step or batch progress
    (RunState.RUNNING, RunState.AWAITING),  # commit ResumeTicket
    (RunState.AWAITING, RunState.RUNNING),  # validated ResumeCommand
    (RunState.RUNNING, RunState.ENDED),  # commit EndCause
    (RunState.AWAITING, RunState.ENDED),  # cancel, stop or failure
}
RUN_PAIRS = list(product([NEW, *RunState], RunState))


def run_in(state: RunState | None) -> tuple[Log, str]:
    """A log whose run ``r1`` is in ``state``: Running and Awaiting sit on an open batch of
    one call, so every target state has a legal-looking commit to try."""
    ids = Ids("x")
    log = Log("th1")
    if state is NEW:
        return log, "r1"
    log.apply(drafts.activate(log.head, "r1"))
    call = drafts.make_call(0, ids=ids, permission=Permission.ASK)
    log.apply(drafts.infer_tools(log.head, log.run("r1"), (call,)))
    if state is RunState.AWAITING:
        log.apply(drafts.wait(log.head, log.run("r1"), call.call_id, "tk1"))
    if state is RunState.ENDED:
        log.apply(drafts.end(log.head, log.run("r1"), EndCause.CANCELLED))
    return log, "r1"


def move_to(log: Log, run_id: str, to: RunState) -> CommitDraft:
    """The commit that would move the run to ``to`` from where it is."""
    head = log.head
    run = log.runs.get(run_id)
    if run is None:  # a new run: its activation, with the disposition under test
        draft = drafts.activate(head, run_id)
        bare = RunView(run_id=run_id, thread_id=head.thread_id, agent="demo")
        ticket = drafts.ticket_for(bare, "c0", "tk0", TicketKind.APPROVAL)
        disposition = {
            RunState.RUNNING: Disposition.running(),
            RunState.AWAITING: Disposition.awaiting(ticket),
            RunState.ENDED: Disposition.ended(EndCause.NATURAL),
        }[to]
        return replace(draft, disposition=disposition)
    call = run.batches[-1].calls[0]
    if to is RunState.ENDED:
        return drafts.end(head, run, EndCause.CANCELLED)
    if run.state is RunState.AWAITING:
        if to is RunState.RUNNING:
            return drafts.resume(head, run, Decision.APPROVE)
        assert run.ticket is not None  # a second wait on the same call
        return replace(drafts.wait(head, run, call.call_id, "tk2"), events=())
    if run.state is RunState.ENDED and to is RunState.RUNNING:
        return drafts.infer_text(head, run)
    if to is RunState.RUNNING:
        return drafts.complete(head, run, call.call_id)
    return drafts.wait(head, run, call.call_id, "tk2")


def _name(value: RunState | None) -> str:
    return "(new)" if value is None else value.value


@pytest.mark.parametrize(("from_", "to"), RUN_PAIRS, ids=_name)
def test_run_machine_accepts_exactly_the_seed_edges(from_, to):
    log, run_id = run_in(from_)
    draft = move_to(log, run_id, to)
    if (from_, to) in SEED_RUN_EDGES:
        head, run = apply_commit(log.head, log.runs.get(run_id), draft)
        assert run is not None and run.state is to
        assert head.version == log.head.version + 1
        assert head.active_run_id == (None if to is RunState.ENDED else run_id)
        return
    expected = RunEnded if from_ is RunState.ENDED else IllegalTransition
    with pytest.raises(expected) as excinfo:
        apply_commit(log.head, log.runs.get(run_id), draft)
    assert_names_the_edge_of_run(excinfo.value, _name(from_), to.value)


def assert_names_the_edge_of_run(error, from_: str, to: str) -> None:
    assert error.detail["machine"] == "run"
    assert error.detail["from_state"] == from_
    assert error.detail["to_state"] == to
    assert error.detail["why"]


def test_an_awaiting_run_is_resumed_only_by_a_resume():
    log, run_id = run_in(RunState.AWAITING)
    run = log.run(run_id)
    draft = replace(drafts.resume(log.head, run, Decision.APPROVE), events=())
    with pytest.raises(IllegalTransition) as excinfo:
        apply_commit(log.head, run, draft)
    assert "only a validated ResumeCommand" in excinfo.value.detail["why"]


def test_an_awaiting_run_changes_only_by_resume_or_end():
    log, run_id = run_in(RunState.AWAITING)
    run = log.run(run_id)
    draft = drafts.infer_text(log.head, run)
    with pytest.raises(IllegalTransition) as excinfo:
        apply_commit(log.head, run, draft)
    assert "changes only by resume or end" in excinfo.value.detail["why"]


def test_a_running_run_with_an_unanswered_wait_is_refused():
    log, run_id = run_in(RunState.RUNNING)
    run = log.run(run_id)
    draft = replace(
        drafts.wait(log.head, run, run.batches[-1].calls[0].call_id, "tk9"),
        disposition=Disposition.running(),
    )
    with pytest.raises(IllegalTransition) as excinfo:
        apply_commit(log.head, run, draft)
    assert excinfo.value.detail["to_state"] == "running"
    assert "must be Awaiting" in excinfo.value.detail["why"]


def test_an_ending_run_must_seal_its_open_batch():
    log, run_id = run_in(RunState.RUNNING)
    run = log.run(run_id)
    draft = replace(drafts.end(log.head, run), events=(), messages=())
    with pytest.raises(IllegalTransition) as excinfo:
        apply_commit(log.head, run, draft)
    assert "seals and finalizes its open batch" in excinfo.value.detail["why"]


def test_an_ended_run_is_absorbing_for_every_move():
    log, run_id = run_in(RunState.ENDED)
    run = log.run(run_id)
    assert run.state is RunState.ENDED and run.open_batch is None
    for draft in (
        drafts.infer_text(log.head, run),
        drafts.end(log.head, run, EndCause.FAILED),
        drafts.resume(
            log.head, replace(run, ticket=drafts.ticket_for(run, "c", "tk1")), Decision.APPROVE
        ),
    ):
        with pytest.raises(RunEnded) as excinfo:
            apply_commit(log.head, run, draft)
        assert excinfo.value.detail["end_cause"] == "cancelled"


def test_thread_head_is_unchanged_by_a_refusal():
    log, run_id = run_in(RunState.ENDED)
    head = log.head
    with pytest.raises(RunEnded):
        apply_commit(head, log.run(run_id), drafts.infer_text(head, log.run(run_id)))
    assert head == ThreadHead(thread_id="th1", version=3, active_run_id=None)


def test_an_approved_call_completes_without_running_only_as_an_error():
    """An approval lets a call run and never stands in for its result; the worker may still
    complete it as an error, not run, when the code driving the run cannot run it (its tool
    removed by a deploy, issue 34)."""
    log, run_id = run_in(RunState.AWAITING)
    log.apply(drafts.resume(log.head, log.run(run_id), Decision.APPROVE))
    run = log.run(run_id)
    call_id = run.batches[-1].calls[0].call_id
    with pytest.raises(IllegalTransition) as excinfo:
        apply_commit(log.head, run, drafts.complete(log.head, run, call_id, result="made up"))
    assert excinfo.value.detail["why"] == "an approved call must execute first"
    log.apply(drafts.complete(log.head, run, call_id, result="Not run: gone", is_error=True))
    assert log.run(run_id).batches[-1].calls[0].phase is CallPhase.COMPLETED
