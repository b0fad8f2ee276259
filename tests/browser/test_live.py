"""The live panel: unconfirmed deltas, dropped failed attempts, commits, reconnection.

Deltas are sent through the Redis channel layer exactly as a worker sends them
(runtime.live's message shapes), so each case is deterministic.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runtime import operations
from runtime.live import run_group
from tests.browser.conftest import off_loop, send_live
from tests.console.support import RunDriver

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def delta(run_id: str, step: int, attempt: int, text: str = "", **extra) -> dict:
    return {
        "type": "run.delta",
        "run_id": run_id,
        "step": step,
        "attempt": attempt,
        "kind": extra.pop("kind", "text"),
        "text": text,
        "index": extra.pop("index", 0),
        "name": extra.pop("name", None),
        "call_id": extra.pop("call_id", None),
    }


def test_deltas_stream_unconfirmed_and_failed_attempts_are_dropped(stack, page, sign_in):
    run_id = off_loop(operations.start_run, agent="demo", input="hi", actor="olga")
    group = run_group(run_id)
    sign_in(page)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    expect(page.locator("#live [data-live-status]")).to_have_text("Live: connected.")
    live = page.locator("#live-text")

    send_live(group, delta(run_id, 1, 1, "Hello wor"))
    send_live(group, delta(run_id, 1, 1, "ld <script>alert(1)</script>"))
    expect(live).to_have_text("Hello world <script>alert(1)</script>")  # text, not markup
    assert page.locator("#live script").count() == 0
    expect(page.locator("#live-step")).to_contain_text("Step 1, attempt 1 (unconfirmed)")

    # attempt 2 of the same step: attempt 1 failed, so its text is dropped
    send_live(group, delta(run_id, 1, 2, "Fresh start"))
    expect(live).to_have_text("Fresh start")
    expect(page.locator("#live-step")).to_contain_text("Attempt 1 failed; its text was dropped")
    send_live(group, delta(run_id, 1, 1, " stale"))  # a late delta of the failed attempt
    send_live(group, delta(run_id, 1, 2, " again"))
    expect(live).to_have_text("Fresh start again")

    # tool-call argument deltas stream by index
    send_live(group, delta(run_id, 1, 2, kind="tool_call", name="ledger_once", call_id="c1"))
    send_live(group, delta(run_id, 1, 2, '{"key": ', kind="tool_call"))
    send_live(group, delta(run_id, 1, 2, '"payment-7"}', kind="tool_call"))
    tools = page.locator("#live-tools")
    expect(tools).to_contain_text("#0 ledger_once")
    expect(tools).to_contain_text('{"key": "payment-7"}')
    page.screenshot(path=str(stack_shot("live-streaming")), full_page=True)

    # a commit notice clears the live text and refreshes the committed panels
    version = off_loop(lambda: RunDriver(run_id).view.version)
    send_live(
        group,
        {
            "type": "run.commit",
            "run_id": run_id,
            "thread_id": "t",
            "seq": version,
            "state": "running",
        },
    )
    expect(live).to_be_hidden()
    expect(tools).to_be_empty()
    expect(page.locator("#live-step")).to_contain_text(f"Commit #{version} landed")


def test_reconnect_shows_committed_state_first(stack, page, sign_in):
    run_id = off_loop(operations.start_run, agent="demo", input="hi", actor="olga")
    sign_in(page)
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    page.evaluate("window.__notReloaded = true")
    status = page.locator("#live [data-live-status]")
    expect(status).to_have_text("Live: connected.")
    send_live(run_group(run_id), delta(run_id, 1, 1, "half a sentence"))
    expect(page.locator("#live-text")).to_have_text("half a sentence")

    # the server goes away; meanwhile a worker commits (nobody is told)
    stack.server.terminate()
    stack.server.wait(timeout=10)
    expect(status).to_contain_text("Disconnected")
    driver = RunDriver(run_id)
    off_loop(
        lambda: driver.open_batch(
            {"name": "ledger_approval", "arguments": {"key": "k"}, "permission": "ask"},
            text="half a sentence, finished",
        )
    )
    stack.restart_server()

    # on reconnect: the committed state is fetched, the stale live text is gone
    expect(status).to_have_text("Live: connected.", timeout=20_000)
    expect(page.locator("#committed")).to_contain_text("open batch")
    expect(page.locator("#committed .messages")).to_contain_text("half a sentence, finished")
    expect(page.locator("#live-text")).to_be_hidden()
    assert page.evaluate("window.__notReloaded") is True


def stack_shot(name: str):
    from tests.browser.conftest import RESULTS

    RESULTS.mkdir(parents=True, exist_ok=True)
    return RESULTS / f"{name}.png"
