"""A parent and its child in the console, and a timer fired now, in a real browser against
daphne and a real worker process."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from runtime.models import Run
from tests.browser.conftest import off_loop

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHILD = {
    "steps": [
        {"tool_calls": [{"name": "wait", "arguments": {"seconds": 7200}}]},
        {"text": "The child waited and answers 42."},
    ]
}
PARENT = {
    "steps": [
        {
            "tool_calls": [
                {"name": "delegate", "arguments": {"input": "wait, then answer", "script": CHILD}}
            ]
        },
        {"text": "The child said 42."},
    ]
}


def test_follow_parent_to_child_and_fire_its_timer_now(stack, page, sign_in):
    from runtime import operations

    stack.worker(worker_id="w-family")
    sign_in(page)
    parent_id = off_loop(
        operations.start_run,
        agent="demo",
        input="delegate",
        actor="olga",
        metadata={"script": PARENT},
    )
    page.goto(f"{stack.base_url}/runs/{parent_id}/")
    children = page.locator("[data-testid=children]")
    expect(children.locator("a")).to_have_count(1, timeout=20_000)
    expect(page.locator("[data-testid=run-state]")).to_contain_text("awaiting", timeout=20_000)
    children.locator("a").click()

    expect(page.locator("[data-testid=parent-link]")).to_contain_text(parent_id[:8])
    due = page.locator("[data-testid=timer-due]")
    expect(due).to_contain_text("UTC", timeout=20_000)
    expect(due).to_contain_text("in 1")  # in 1 hour, 59 minutes
    page.locator("button:has-text('Fire now')").click()
    expect(page.locator("[data-testid=run-state]")).to_contain_text(
        "ended · natural", timeout=20_000
    )

    page.locator("[data-testid=parent-link]").click()
    expect(page.locator("[data-testid=run-state]")).to_contain_text(
        "ended · natural", timeout=20_000
    )
    expect(page.locator("#committed .messages")).to_contain_text("The child waited and answers 42.")
    expect(page.locator("[data-testid=children]")).to_contain_text("natural")
    child = Run.objects.get(parent_run_id=parent_id)
    assert (child.state, child.end_cause) == ("ended", "natural")
