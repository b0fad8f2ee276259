"""End-to-end flows in a real browser against daphne and real worker processes."""

from __future__ import annotations

import json
import re
import time

import pytest
from playwright.sync_api import expect

from runtime.demo.models import LedgerEffect
from runtime.models import Run, ToolCallRecord
from tests.browser.conftest import RESULTS, off_loop

pytestmark = [pytest.mark.browser, pytest.mark.slow]

APPROVAL_SCRIPT = {
    "steps": [
        {
            "text": "Let me record that. The ledger needs an approval first, so I ask for it.",
            # ~15 s of streaming: room for a loaded machine to open the page and see the text
            # before it commits
            "chunks": 60,
            "delay_ms": 250,
            "tool_calls": [{"name": "ledger_approval", "arguments": {"key": "invoice-42"}}],
        },
        {"text": "Recorded invoice-42 once, after the approval.", "chunks": 8, "delay_ms": 60},
    ]
}
ONCE_SCRIPT = {
    "steps": [
        {
            "text": "Recording payment-7.",
            "tool_calls": [{"name": "ledger_once", "arguments": {"key": "payment-7"}}],
        },
        {"text": "The outcome is unknown; an operator must check.", "chunks": 4},
    ]
}


def start_from_form(page, base_url: str, script: dict, text: str) -> str:
    page.goto(base_url + "/runs/new/")
    page.select_option("#id_agent", "demo")
    page.fill("#id_input", text)
    page.fill("#id_script", json.dumps(script))
    page.click("button:has-text('Start run')")
    page.wait_for_url(re.compile(r"/runs/[0-9a-f]{32}/$"))
    return page.url.rstrip("/").rsplit("/", 1)[-1]


def test_approval_flow_live_then_committed(stack, page, browser, sign_in):
    """Start a gated run, watch the unconfirmed text stream, approve it in the inbox, and
    watch the run page reach Ended without a reload."""
    stack.worker(worker_id="w-approve")
    sign_in(page)
    run_id = start_from_form(page, stack.base_url, APPROVAL_SCRIPT, "Record invoice-42.")
    page.evaluate("window.__notReloaded = true")

    live = page.locator("#live-text")
    # The page subscribes after the first deltas went out: the worker's checkpoint in the
    # hello still shows the opening words (issue 11, defect 10). On a loaded machine a delta
    # can still be missed; the page then draws a gap mark there (issue 29), so the check is
    # that every piece drawn is text the model sent, in its order, never that none is missed.
    expect(live).to_contain_text("Le", timeout=15_000)
    sent = APPROVAL_SCRIPT["steps"][0]["text"]
    deadline = time.monotonic() + 15
    while not _drawn_in_order(live.inner_text(), sent, at_least=len("Let me record that")):
        assert time.monotonic() < deadline, f"live text {live.inner_text()!r} is not {sent!r}"
        page.wait_for_timeout(100)
    expect(page.locator("#live .badge.unconfirmed")).to_have_text("live, unconfirmed")
    # while streaming, the text is not a committed message yet
    assert "record that" not in page.locator("#committed .messages").inner_text()
    page.screenshot(path=str(_shot("approval-streaming")), full_page=True)

    expect(page.locator("[data-testid=run-state]")).to_contain_text("awaiting", timeout=15_000)
    expect(page.locator("#committed .messages")).to_contain_text("Let me record that.")
    expect(live).to_be_hidden()  # cleared when the commit landed
    expect(page.locator("#committed")).to_contain_text("open batch")

    inbox = page.context.new_page()
    inbox.goto(stack.base_url + "/inbox/")
    card = inbox.locator(".ticket-card", has_text="ledger_approval")
    expect(card).to_contain_text("invoice-42")
    card.get_by_role("button", name=re.compile(r"^Approve #")).click()
    # the card stays where it was, showing its outcome; "recently closed" follows the log
    expect(card.locator("[data-outcome]")).to_contain_text("Approved by olga")
    expect(inbox.locator("#recent")).to_contain_text("ledger_approval")
    inbox.close()

    expect(page.locator("[data-testid=run-state]")).to_contain_text(
        "ended · natural", timeout=20_000
    )
    assert page.evaluate("window.__notReloaded") is True
    expect(page.locator("#committed .messages")).to_contain_text("Recorded invoice-42 once")
    expect(page.locator("#committed")).to_contain_text("resumed: approve")
    expect(page.locator("#committed table.log")).to_contain_text("olga")
    assert LedgerEffect.objects.get(key="invoice-42").applied == 1
    assert Run.objects.get(id=run_id).end_cause == "natural"


def _drawn_in_order(drawn: str, sent: str, *, at_least: int) -> bool:
    """True when `drawn`, split at the page's gap marks, is pieces of `sent` in order that
    together hold at least `at_least` characters."""
    position, shown = 0, 0
    for piece in (p.strip() for p in drawn.split("…")):
        found = sent.find(piece, position)
        if found < 0:
            return False
        position, shown = found + len(piece), shown + len(piece)
    return shown >= at_least


def test_crashed_call_becomes_indeterminate_and_is_reconciled(stack, page, sign_in):
    """A worker dies right after committing Executing for a never-retried call; a fresh
    worker marks it Indeterminate; an operator records the downstream outcome."""
    crashing = stack.worker(worker_id="w-crash", RUNTIME_CRASH_AT="executing_committed")
    sign_in(page)
    run_id = start_from_form(page, stack.base_url, ONCE_SCRIPT, "Record payment-7.")
    assert crashing.wait(timeout=30) == 137
    stack.worker(worker_id="w-fresh")
    deadline = time.monotonic() + 30
    # the fresh worker seals the call, then the run goes on to its end
    while Run.objects.get(id=run_id).state != "ended":
        assert time.monotonic() < deadline, "the run never ended"
        time.sleep(0.2)
    call = ToolCallRecord.objects.get(run_id=run_id)
    assert call.phase == "indeterminate" and call.effect_may_have_started
    assert LedgerEffect.objects.filter(operation_id=call.operation_id).count() == 0

    page.goto(stack.base_url + "/reconcile/")
    card = page.locator(f"#rc-{call.id}")
    expect(card).to_contain_text(call.operation_id)
    expect(card).to_contain_text("w-crash")  # the attempt's worker
    expect(card).to_contain_text("payment-7")
    card.get_by_label("Not applied").check()
    card.locator("textarea").fill("ledger has no row for this operation id")
    card.locator("select").select_option("demo")
    card.locator("button:has-text('Record outcome')").click()
    expect(card).to_contain_text("Outcome recorded as commit")
    expect(card).to_contain_text("by olga")
    follow = card.get_by_role("link", name="Open the follow-up run")
    follow.click()
    expect(page.locator("[data-testid=run-state]")).to_contain_text("ended", timeout=20_000)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    expect(page.locator("#committed")).to_contain_text("Reconciliations")
    expect(page.locator("#committed")).to_contain_text("not applied")


def test_runs_list_updates_as_runs_commit(stack, page, sign_in):
    from runtime import operations

    sign_in(page)
    page.evaluate("window.__notReloaded = true")
    run_id = off_loop(
        operations.start_run,
        agent="demo",
        input="hi",
        actor="script",
        metadata={"script": {"steps": [{"text": "Hello.", "chunks": 3, "delay_ms": 200}]}},
    )
    stack.worker(worker_id="w-list")
    row = page.locator(f"#run-{run_id}")
    expect(row).to_contain_text("natural", timeout=20_000)
    assert page.evaluate("window.__notReloaded") is True
    expect(page.locator("[data-live-status]")).to_have_text("Live: connected.")


def _shot(name: str):
    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}.png"
