"""A deploy changes an agent while its runs wait (issue 34, item 4).

A call the code now driving its run cannot run (its tool removed or renamed, its arguments
refused by the tool's new schema) is completed with the reason before any effect; the model
reads it on its next inference and the run goes on. A call whose ``once`` effect may have
started keeps its pinned policy and is sealed for Reconcile; any other becomes an error
result. No traceback loop and no poison end, whatever changed; a changed policy never
changes a call already requested (it is pinned).
"""

from __future__ import annotations

import logging

import pytest

from runtime import operations
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.inventory import unreconciled_calls
from runtime.models import MessageRecord, Ticket
from tests.console.support import RunDriver
from tests.runtime import deploy_agents
from tests.runtime.support import calls, run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def deploy(deploy):
    """The shared ``deploy`` (tests/conftest.py), with version 1 deployed first."""
    deploy("v1")
    return deploy


@pytest.fixture
def no_error_logged(caplog):
    caplog.set_level(logging.INFO)
    yield
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []


def _approve(run_id: str) -> None:
    ticket = Ticket.objects.get(run_id=run_id, kind="approval", state="open")
    command = ResumeCommand(
        ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE
    )
    operations.resume(run_id, command, actor="approver")


def _awaiting_refund(start, work_inline) -> str:
    run_id = start(tool_step(("refund", {"order": "o-1"})), text_step("told"), agent="deploy")
    work_inline()
    assert run_row(run_id).state == "awaiting"
    return run_id


def _tool_messages(run_id: str) -> list[str]:
    rows = MessageRecord.objects.filter(run_id=run_id, role="tool").order_by("seq", "idx")
    return list(rows.values_list("content", flat=True))


@pytest.mark.parametrize("version", ["removed", "renamed"])
def test_an_approved_call_whose_tool_is_gone_is_an_error_result_and_the_run_goes_on(
    deploy, start, work_inline, no_error_logged, version
):
    run_id = _awaiting_refund(start, work_inline)
    deploy(version)
    _approve(run_id)
    assert work_inline() == 1  # one claim: no retries, no poison

    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    [call] = calls(run_id)
    reason = "Not run: the tool 'refund' is not in agent 'deploy' as deployed now."
    assert (call.phase, call.is_error, call.result) == ("completed", True, reason)
    assert not call.effect_may_have_started
    assert _tool_messages(run_id) == [reason]  # what the model read next
    assert deploy_agents.APPLIED == []
    assert not unreconciled_calls().filter(run_id=run_id).exists()


def test_an_approved_call_the_new_schema_refuses_is_an_error_result(
    deploy, start, work_inline, no_error_logged
):
    run_id = _awaiting_refund(start, work_inline)
    deploy("new_argument")
    _approve(run_id)
    work_inline()

    assert run_row(run_id).end_cause == "natural"
    [call] = calls(run_id)
    assert (call.phase, call.is_error) == ("completed", True)
    assert call.result.startswith("Not run: the tool's current schema refuses the call's")
    assert "amount" in call.result  # the field the new version requires
    assert deploy_agents.APPLIED == []


def test_a_waiting_call_keeps_the_policy_pinned_when_it_was_requested(
    deploy, start, work_inline, no_error_logged
):
    run_id = _awaiting_refund(start, work_inline)
    deploy("new_policy")  # refund is now replayed, idempotent, and needs no approval
    _approve(run_id)
    work_inline()

    assert run_row(run_id).end_cause == "natural"
    [call] = calls(run_id)
    assert (call.phase, call.is_error, call.result) == ("completed", False, "refunded o-1")
    assert (call.policy, call.effects, call.permission) == ("indeterminate", "once", "ask")
    assert deploy_agents.APPLIED == [("refund", "new_policy", "o-1")]  # the new code ran it


def _executing(start, spec: dict) -> str:
    """A run of ``deploy`` whose call's attempt 1 is committed Executing, with no result: its
    worker stopped after the effect may have started."""
    run_id = start(tool_step((spec["name"], spec["arguments"])), text_step("told"), agent="deploy")
    driver = RunDriver(run_id)
    [call] = driver.open_batch(spec)
    driver.execute(call)
    return run_id


def test_an_executing_call_of_an_idempotent_tool_that_is_gone_is_an_error_result(
    deploy, start, work_inline, no_error_logged
):
    spec = {"name": "sync", "arguments": {"key": "k"}, "policy": "replay", "max_attempts": 2}
    run_id = _executing(start, {**spec, "effects": "idempotent"})
    deploy("removed")
    assert work_inline() == 1

    assert run_row(run_id).end_cause == "natural"
    [call] = calls(run_id)
    assert (call.phase, call.is_error, call.attempt) == ("completed", True, 1)
    assert call.result == (
        "the tool 'sync' is not in agent 'deploy' as deployed now; not run again after 1 attempt"
    )
    assert not unreconciled_calls().filter(run_id=run_id).exists()


def test_an_executing_call_of_a_once_tool_that_is_gone_is_sealed_for_reconcile(
    deploy, start, work_inline, no_error_logged
):
    spec = {"name": "charge", "arguments": {"order": "o-2"}, "policy": "reconnect"}
    run_id = _executing(start, {**spec, "max_attempts": 2, "effects": "once"})
    deploy("removed")
    assert work_inline() == 1

    assert run_row(run_id).end_cause == "natural"  # the model is told, and goes on
    [call] = calls(run_id)
    assert call.phase == "indeterminate"
    assert "the tool 'charge' is not in agent 'deploy' as deployed now" in call.result
    assert unreconciled_calls().filter(run_id=run_id).exists()
    assert deploy_agents.APPLIED == []
