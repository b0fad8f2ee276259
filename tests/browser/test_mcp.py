"""An approval-gated MCP call, approved in the browser, runs once on its server."""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from runtime import agents
from runtime.models import Run, ToolCallRecord
from tests.runtime.mcp.support import register_effects

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SCRIPT = {
    "steps": [
        {
            "text": "Deleting k-7 needs an approval.",
            "tool_calls": [{"name": "effects__delete", "arguments": {"key": "k-7"}}],
        },
        {"text": "Deleted k-7 once, after the approval."},
    ]
}


@pytest.fixture
def effects(tmp_path, monkeypatch, settings):
    """Set before ``stack``, so that daphne and the workers see the MCP agents too."""
    yield register_effects(tmp_path, monkeypatch, settings)
    agents._registry.cache_clear()


def test_gated_mcp_call_is_approved_in_the_browser_and_runs_once(effects, stack, page, sign_in):
    stack.worker(worker_id="w-mcp")
    sign_in(page)
    page.goto(stack.base_url + "/runs/new/")
    page.select_option("#id_agent", "mcp_gated")
    page.fill("#id_input", "Delete k-7.")
    page.fill("#id_script", json.dumps(SCRIPT))
    page.click("button:has-text('Start run')")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f]{32}/$"))
    run_id = page.url.rstrip("/").rsplit("/", 1)[-1]

    expect(page.locator("[data-testid=run-state]")).to_contain_text("awaiting", timeout=30_000)
    call_row = page.locator(".call", has_text="effects__delete")
    expect(call_row.locator("[data-testid=mcp-source]")).to_contain_text(
        "server effects · tool delete"
    )
    expect(call_row).to_contain_text("indeterminate")  # the pinned policy of a destructive tool

    inbox = page.context.new_page()
    inbox.goto(stack.base_url + "/inbox/")
    card = inbox.locator(".ticket-card", has_text="effects__delete")
    expect(card).to_contain_text("k-7")
    expect(card.locator("[data-testid=mcp-source]")).to_contain_text("MCP server effects")
    card.get_by_role("button", name=re.compile(r"^Approve #")).click()
    expect(card.locator("[data-outcome]")).to_contain_text("Approved by olga")
    inbox.close()

    expect(page.locator("[data-testid=run-state]")).to_contain_text(
        "ended · natural", timeout=30_000
    )
    expect(page.locator("[data-testid=mcp-servers]")).to_contain_text("effects")
    expect(page.locator("[data-testid=mcp-servers]")).to_contain_text("tools delete")
    call = ToolCallRecord.objects.get(run_id=run_id)
    assert (call.phase, call.attempt, call.is_error) == ("completed", 1, False)
    assert {op: row["applied"] for op, row in effects.rows().items()} == {call.operation_id: 1}
    assert Run.objects.get(id=run_id).end_cause == "natural"
