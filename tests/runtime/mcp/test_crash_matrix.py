"""Every crash point against every tool of a real MCP server (stdio), with real workers killed.

The effects server counts each application by the operation id it receives in the request's
``_meta``, so "applied twice" is visible on the server's side. Each tool gets the policy its
annotations suggest (read-only ``fail`` and idempotent ``upsert``: replay; destructive
``delete``: indeterminate) or the agent's override (``lookup_effects``: reconnect through
``find_effect``). A crash after Executing is committed and before the server is called, or
after the server answered and before the result is committed, must give exactly what the
pinned policy says: replay calls again with the same operation id, reconnect asks first,
indeterminate never guesses.
"""

from __future__ import annotations

import json

import pytest

from tests.runtime.support import (
    assert_log_sound,
    calls,
    executing_workers,
    run_row,
    text_step,
    tool_step,
)
from tests.runtime.test_crash_matrix import CLEAN_POINTS, IN_FLIGHT

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TOOLS = {  # offered name -> pinned policy
    "effects__lookup_effects": "reconnect",
    "effects__upsert": "replay",
    "effects__delete": "indeterminate",
    "effects__fail": "replay",
}


def expected(point: str, policy: str) -> tuple[str, int, int]:
    """(final phase, attempts committed, server applications): the same table as the demo
    tools' crash matrix, counted on the MCP server."""
    return IN_FLIGHT.get((point, policy), ("completed", 1, 1))


def _check_result(call, tool: str) -> None:
    if call.phase == "indeterminate":
        assert call.effect_may_have_started and call.is_error
        assert call.operation_id in call.result and "MCP server 'effects'" in call.result
    elif tool == "effects__fail":
        assert call.is_error and "cannot do k" in call.result
    else:
        assert not call.is_error and call.operation_id in call.result


@pytest.mark.parametrize("point", [*CLEAN_POINTS, "executing_committed", "effect_applied"])
def test_takeover_after_crash(start, crashers, worker, effects, mcp_env, point):
    waiting = crashers(len(TOOLS), point, **mcp_env())
    runs = {
        tool: start(tool_step((tool, {"key": "k"})), text_step(), agent="mcp_stdio")
        for tool in TOOLS
    }
    for crasher in waiting:
        code, err = crasher.wait(120)
        assert code == 137, err
    code, err = worker(worker_id="recoverer", timeout=120, **mcp_env())
    assert code == 0, err

    outcomes = {}
    for tool, run_id in runs.items():
        assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
        (call,) = calls(run_id)
        assert call.policy == TOOLS[tool]
        assert (call.source["server"], call.source["tool"]) == ("effects", tool.split("__")[1])
        _check_result(call, tool)
        workers = [w for _, w in executing_workers(run_id)[call.id]]
        assert workers[1:] == ["recoverer"] * (len(workers) - 1)
        outcomes[tool] = (call.phase, call.attempt, effects.applied(call.operation_id))
        assert_log_sound(run_id)
    assert outcomes == {tool: expected(point, policy) for tool, policy in TOOLS.items()}
    # One row per operation id on the server: nothing ran under another id.
    assert len(effects.rows()) == sum(1 for n in outcomes.values() if n[2])


def test_recovery_uses_the_pinned_schema_and_policy(start, worker, effects, mcp_env):
    """The server changes between the crash and the recovery (``upsert`` now says it is
    destructive, so a fresh listing derives "indeterminate"): the recovering worker still
    replays the call under the policy and source it pinned, with the same operation id."""
    run_id = start(tool_step(("effects__upsert", {"key": "k"})), text_step(), agent="mcp_stdio")
    code, err = worker(crash_at="executing_committed", **mcp_env())
    assert code == 137, err
    (call,) = calls(run_id)
    pinned = dict(call.source)
    code, err = worker(worker_id="recoverer", **mcp_env(MCP_EFFECTS_CHANGED="1"))
    assert code == 0, err
    (call,) = calls(run_id)
    assert pinned["annotations"] == {"destructiveHint": False, "idempotentHint": True}
    assert (call.phase, call.policy, call.attempt, call.source) == (
        "completed",
        "replay",
        2,
        pinned,
    )
    assert effects.applied(call.operation_id) == 1
    assert json.loads(call.result.split("\n\n")[0])["operation_id"] == call.operation_id
    assert_log_sound(run_id)


@pytest.mark.parametrize(
    ("failure", "said"),
    [("error", "the effect store is unreachable"), ("exit", "Connection closed")],
)
def test_a_lookup_that_cannot_answer_seals_the_call(start, worker, effects, mcp_env, failure, said):
    """A reconnect call found Executing (its effect applied, its result lost with the worker)
    whose lookup cannot answer (the server's error result, or the server dying in it) is
    sealed Indeterminate on the recovering claim, for a person to reconcile: unknown is not
    "never seen", so the tool is not sent again, and the claim does not fail (no poison
    budget spent, the run goes on and ends naturally)."""
    run_id = start(
        tool_step(("effects__lookup_effects", {"key": "k"})), text_step(), agent="mcp_stdio"
    )
    code, err = worker(crash_at="effect_applied", **mcp_env())
    assert code == 137, err
    (call,) = calls(run_id)
    assert (call.phase, call.policy, effects.applied(call.operation_id)) == (
        "executing",
        "reconnect",
        1,
    )
    code, err = worker(worker_id="recoverer", **mcp_env(MCP_EFFECTS_LOOKUP_FAILS=failure))
    assert code == 0, err

    (call,) = calls(run_id)
    assert (call.phase, call.attempt, call.effect_may_have_started) == ("indeterminate", 1, True)
    assert "the lookup by operation id could not answer" in call.result and said in call.result
    assert call.operation_id in call.result and "MCP server 'effects'" in call.result
    assert effects.applied(call.operation_id) == 1  # never sent again
    run = run_row(run_id)
    assert (run.state, run.end_cause, run.failures) == ("ended", "natural", 0)
    assert len(executing_workers(run_id)[call.id]) == 1  # the recoverer started no attempt
    assert_log_sound(run_id)
