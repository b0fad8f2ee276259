"""MCP tools in the loop, driven in this process by the real Worker: offered beside the agent's
own, pinned with their source, called with the operation id in ``_meta``, results converted,
gates honoured, sessions closed with the claim."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from pathlib import Path

import pytest
from django.db import connection

from runtime.agents import Agent, registry
from runtime.documents import run_document
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.mcp import StdioServer
from runtime.models import MessageRecord, Ticket
from runtime.operations import resume
from tests.runtime.support import (
    assert_log_sound,
    calls,
    run_row,
    text_step,
    tool_step,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def _servers_running() -> list[int]:
    """Pids of this process's children that run the effects server (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"effects_server.py" in cmdline:
            found.append(int(entry.name))
    return found


def test_tools_are_offered_pinned_and_called_with_the_operation_id(start, work_inline, effects):
    run_id = start(
        tool_step(
            ("effects__upsert", {"key": "a"}),
            ("effects__fail", {"key": "b"}),
            ("effects__upsert", {"key": 3}),  # refused by the pinned schema: never sent
        ),
        text_step(),
        agent="mcp_stdio",
    )
    work_inline()
    assert _servers_running() == []  # the claim ended: its stdio server was stopped
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    upsert, fail, refused = calls(run_id)
    assert (upsert.policy, upsert.permission, upsert.max_attempts) == ("replay", "allow", 3)
    assert upsert.source["input_schema"]["required"] == ["key"]
    assert upsert.source["server_info"] == {"name": "effects", "version": "1.0"}
    assert json.loads(upsert.result) == {"recorded": "a", "operation_id": upsert.operation_id}
    assert (fail.is_error, fail.result) == (True, "Error executing tool fail: cannot do b")
    assert refused.is_error and "key" in refused.result and refused.attempt == 0
    # The server saw each call's operation id in _meta, once.
    assert {op: row["applied"] for op, row in effects.rows().items()} == {
        upsert.operation_id: 1,
        fail.operation_id: 1,
    }
    # The model sees the error result as a tool message, like any other.
    published = MessageRecord.objects.filter(run_id=run_id, role="tool").order_by("idx")
    assert [m.content for m in published] == [upsert.result, fail.result, refused.result]
    source = run_document(run_id)["batches"][0]["calls"][0]["source"]
    assert (source["kind"], source["server"], source["tool"]) == ("mcp", "effects", "upsert")
    assert_log_sound(run_id)


def test_the_agent_offers_its_own_and_the_servers_tools(start, work_inline, effects):
    """A request carries the agent's tools and every listed MCP tool with its schema."""
    from runtime.sources import attached

    async def offered_tools() -> None:
        async with attached(registry()["mcp_gated"]) as agent:
            offered = {t.name: t for t in agent.tools}
            assert set(offered) == {
                "effects__lookup_effects",
                "effects__upsert",
                "effects__delete",
                "effects__fail",
                "effects__find_effect",
                "effects__mixed",
            }
            assert offered["effects__upsert"].parameters["properties"] == {
                "key": {"title": "Key", "type": "string"}
            }
            assert _servers_running() != []

    asyncio.run(offered_tools())
    assert _servers_running() == []


def test_a_gated_tool_asks_and_runs_once_after_approval(start, work_inline, effects):
    run_id = start(tool_step(("effects__mixed", {"key": "m"})), text_step(), agent="mcp_gated")
    work_inline()
    ticket = Ticket.objects.get(run_id=run_id, state="open")
    (call,) = calls(run_id)
    assert (call.phase, call.policy, call.permission) == ("awaiting", "indeterminate", "ask")
    assert ticket.request["tool"] == "effects__mixed"
    resume(
        run_id,
        ResumeCommand(ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE),
    )
    work_inline()
    (call,) = calls(run_id)
    assert call.phase == "completed" and not call.is_error
    assert call.result == "about m\n\n[image content: image/png, 8 bytes]"
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert_log_sound(run_id)


BROKEN = Agent(
    name="mcp_broken",
    instructions="",
    sources=(StdioServer(name="gone", command="/nonexistent/mcp-server", connect_timeout=1),),
)


def test_a_server_that_cannot_start_fails_the_step_not_the_worker(
    start, work_inline, settings, effects
):
    settings.RUNTIME_AGENTS = [*settings.RUNTIME_AGENTS, "tests.runtime.mcp.test_loop.BROKEN"]
    broken = start(text_step(), agent="mcp_broken")
    fine = start(text_step(), agent="demo")
    assert work_inline() == 2  # the worker went on to the next run
    run = run_row(broken)
    assert (run.state, run.end_cause, run.error["type"]) == (
        "ended",
        "failed",
        "mcp_server_unavailable",
    )
    assert "gone" in run.error["message"] and "/nonexistent/mcp-server" in run.error["message"]
    assert (run_row(fine).state, run_row(fine).end_cause) == ("ended", "natural")


@pytest.mark.parametrize(
    ("tool", "expected"),
    [
        # replay: sent again with the same operation id to a freshly started server
        ("effects__upsert", ("completed", 2, 2)),
        # indeterminate: never sent again; the model is told to verify with the server
        ("effects__delete", ("indeterminate", 1, 1)),
    ],
)
def test_a_stdio_server_dying_mid_call(start, work_inline, effects, monkeypatch, tool, expected):
    """The server applies the call, then hangs; the test kills it (the worker, driven here in a
    thread, sees its session end). The call's pinned policy decides."""
    monkeypatch.setenv("MCP_EFFECTS_HOLD", "upsert,delete")
    run_id = start(tool_step((tool, {"key": "k"})), text_step(), agent="mcp_stdio")
    working = threading.Thread(target=_work_then_close, args=(work_inline,))
    working.start()
    wait_for(lambda: calls(run_id) and effects.applied(calls(run_id)[0].operation_id) == 1)
    (server,) = _servers_running()
    os.kill(server, signal.SIGKILL)
    working.join(60)
    assert not working.is_alive()

    (call,) = calls(run_id)
    assert (call.phase, call.attempt, effects.applied(call.operation_id)) == expected
    if call.phase == "indeterminate":
        assert call.effect_may_have_started
        assert "Connection closed" in call.result and call.operation_id in call.result
        assert "MCP server 'effects' (tool 'delete')" in call.result
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert _servers_running() == []
    assert_log_sound(run_id)


def _work_then_close(work_inline) -> None:
    try:
        work_inline()
    finally:
        connection.close()
