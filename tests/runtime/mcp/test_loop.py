"""MCP tools in the loop, in this process: offered, pinned, executed, results converted."""

from __future__ import annotations

import json

import pytest

from runtime.documents import run_document
from tests.runtime.support import assert_log_sound, calls, run_row, text_step, tool_step

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_calls_pin_their_source_and_policy(start, work_inline, effects):
    run_id = start(
        tool_step(
            ("effects__upsert", {"key": "a"}),
            ("effects__fail", {"key": "b"}),
            ("effects__mixed", {"key": "c"}),
        ),
        text_step(),
        agent="mcp_stdio",
    )
    work_inline()
    rows = calls(run_id)
    print([(c.name, c.phase, c.policy, c.permission, c.result) for c in rows])
    print(run_row(run_id).state, run_row(run_id).error)
    print(effects.rows())
    print(json.dumps(run_document(run_id)["batches"][0]["calls"][0]["source"]))
    assert_log_sound(run_id)
