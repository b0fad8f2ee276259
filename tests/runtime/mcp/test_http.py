"""The effects server over streamable HTTP on loopback, a real subprocess killed mid-call.

The server records the call's effect and then hangs (MCP_EFFECTS_HOLD); the test kills it.
The pinned policy decides what the worker does with the broken call: an idempotent tool is
called again with the same operation id (on a server restarted on the same port), a
destructive one becomes Indeterminate, naming the server and the operation id.
"""

from __future__ import annotations

import subprocess

import pytest

from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.models import Ticket
from runtime.operations import resume
from tests.runtime.mcp.support import TOKEN, free_port
from tests.runtime.support import (
    assert_log_sound,
    calls,
    run_row,
    text_step,
    tool_step,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _kill_mid_call(server: subprocess.Popen, effects, run_id: str) -> None:
    """Wait until the server has applied the run's call (and hangs in it); kill it."""
    # The worker starts, claims and connects first: seconds on a loaded machine, up to the
    # server's connect_timeout (agents.mcp_http).
    wait_for(
        lambda: calls(run_id) and effects.applied(calls(run_id)[0].operation_id) == 1,
        timeout=120,
        what="the server to apply the call",
    )
    (call,) = calls(run_id)
    assert (call.phase, call.attempt) == ("executing", 1)
    server.kill()
    server.wait()


def test_idempotent_call_is_replayed_after_the_server_dies(
    start, spawn_worker, effects, mcp_env, http_server
):
    port = free_port()
    server = http_server(port)
    env = mcp_env(MCP_EFFECTS_URL=f"http://127.0.0.1:{port}/mcp", MCP_EFFECTS_TOKEN=TOKEN)
    run_id = start(tool_step(("effects__upsert", {"key": "k"})), text_step(), agent="mcp_http")
    worker = spawn_worker(**env)
    _kill_mid_call(server, effects, run_id)
    http_server(port)  # the server is back on its address; the replay reconnects
    code, err = worker.wait(120)
    assert code == 0, err

    (call,) = calls(run_id)
    assert (call.phase, call.policy, call.attempt, call.is_error) == (
        "completed",
        "replay",
        2,
        False,
    )
    assert effects.applied(call.operation_id) == 2  # same operation id both times
    assert call.source["transport"] == "http" and call.source["target"].endswith(f":{port}/mcp")
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert_log_sound(run_id)


def test_destructive_call_becomes_indeterminate_when_the_server_dies(
    start, spawn_worker, worker, effects, mcp_env, http_server
):
    port = free_port()
    server = http_server(port)
    env = mcp_env(MCP_EFFECTS_URL=f"http://127.0.0.1:{port}/mcp", MCP_EFFECTS_TOKEN=TOKEN)
    run_id = start(tool_step(("effects__delete", {"key": "k"})), text_step(), agent="mcp_http")
    code, err = worker(**env)  # the destructive tool asks first
    assert code == 0, err
    ticket = Ticket.objects.get(run_id=run_id, state="open")
    assert ticket.request["tool"] == "effects__delete"
    resume(
        run_id,
        ResumeCommand(ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
    )
    running = spawn_worker(**env)
    _kill_mid_call(server, effects, run_id)
    code, err = running.wait(120)
    assert code == 0, err

    (call,) = calls(run_id)
    assert (call.phase, call.policy, call.attempt) == ("indeterminate", "indeterminate", 1)
    assert call.effect_may_have_started and call.is_error
    assert call.operation_id in call.result and "MCP server 'effects'" in call.result
    assert effects.applied(call.operation_id) == 1  # never sent again
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert_log_sound(run_id)


def test_missing_header_variable_fails_the_step_not_the_worker(start, worker, mcp_env):
    """The header's environment variable is unset: no session can open at claim time."""
    run_id = start(tool_step(("effects__upsert", {"key": "k"})), text_step(), agent="mcp_http")
    code, err = worker(**mcp_env(MCP_EFFECTS_TOKEN=None))
    assert code == 0, err
    run = run_row(run_id)
    assert (run.state, run.end_cause, run.error["type"]) == (
        "ended",
        "failed",
        "mcp_server_unavailable",
    )
    assert "MCP_EFFECTS_TOKEN" in run.error["message"]
