"""The inbox under an operator's hands: nothing moves under the pointer, refusals are said in
place, the keyboard approves, notes are kept, bulk answers are confirmed once (issue 11)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from runtime import operations
from tests.browser.conftest import off_loop
from tests.console.support import RunDriver

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def approval_ticket(key: str, tool: str = "ledger_approval") -> tuple[str, str]:
    """A run awaiting approval of ``tool`` with arguments {"key": key}: (run id, ticket id)."""
    run_id = operations.start_run(agent="demo", input=f"Record {key}.\nThen stop.", actor="olga")
    driver = RunDriver(run_id)
    (call,) = driver.open_batch(
        {"name": tool, "arguments": {"key": key}, "permission": "ask"},
        text=f"Recording {key} needs an approval.",
    )
    return run_id, driver.await_ticket(call)


def card_under(page, x: float, y: float) -> str | None:
    return page.evaluate(
        "([x, y]) => { const el = document.elementFromPoint(x, y);"
        " const card = el && el.closest('.ticket-card'); return card ? card.id : null; }",
        [x, y],
    )


def test_an_answered_card_stays_under_the_pointer_and_takes_the_focus(stack, page, sign_in):
    first = off_loop(approval_ticket, "payment-1")
    off_loop(approval_ticket, "payment-2")
    sign_in(page)
    page.goto(stack.base_url + "/inbox/")
    card = page.locator(f"#ticket-{first[1]}")
    expect(card).to_contain_text("Record payment-1.")  # the run's input, first line
    box = card.locator("form.inline button[value=approve]").bounding_box()
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.click(x, y)

    expect(card.locator("[data-outcome]")).to_contain_text("Approved by olga at")
    # the commit reached the page (the live counter moved), and still nothing moved
    expect(page.get_by_test_id("open-count")).to_have_text("1")
    expect(page.get_by_test_id("tab-count-inbox")).to_have_text("1")
    assert card_under(page, x, y) == f"ticket-{first[1]}"
    focused = page.evaluate("document.activeElement.closest('.ticket-card')?.id")
    assert focused == f"ticket-{first[1]}"  # not <body>

    # The operator's own act (Dismiss) is what removes it.
    card.locator("[data-dismiss-card]").click()
    expect(card).to_have_count(0)


def test_a_refused_answer_says_who_answered_in_place(stack, page, sign_in):
    _, ticket_id = off_loop(approval_ticket, "payment-3")
    sign_in(page)
    page.goto(stack.base_url + "/inbox/")
    other = page.context.new_page()
    other.goto(stack.base_url + "/inbox/")
    other.locator(f"#ticket-{ticket_id} form.inline button[value=approve]").click()
    expect(other.locator(f"#ticket-{ticket_id} [data-outcome]")).to_contain_text("Approved")
    other.close()

    card = page.locator(f"#ticket-{ticket_id}")
    expect(page.get_by_test_id("open-count")).to_have_text("0")  # the page heard the commit
    card.locator("input[name=reason]").fill("too late")
    card.locator("button[value=deny]").click()
    expect(card.locator("[data-outcome]")).to_contain_text("Already answered: approved by olga at")
    expect(card.locator("[data-outcome]")).to_contain_text("UTC")
    expect(page.locator("#flash")).not_to_contain_text("not sent")


def test_keyboard_only_approval_in_three_presses(stack, page, sign_in):
    _, ticket_id = off_loop(approval_ticket, "payment-4")
    sign_in(page)
    page.goto(stack.base_url + "/inbox/")
    expect(page.locator(f"#ticket-{ticket_id}")).to_be_visible()
    page.keyboard.press("j")  # 1: the first card
    page.keyboard.press("a")  # 2: a visible confirmation, its button focused
    confirm = page.locator(f"#ticket-{ticket_id} .key-confirm")
    expect(confirm).to_contain_text("Approve #0 ledger_approval?")
    page.keyboard.press("Enter")  # 3: approved
    expect(page.locator(f"#ticket-{ticket_id} [data-outcome]")).to_contain_text("Approved by olga")


def test_an_approval_note_is_kept_and_shown(stack, page, sign_in):
    run_id, ticket_id = off_loop(approval_ticket, "payment-5")
    sign_in(page)
    page.goto(stack.base_url + "/inbox/")
    card = page.locator(f"#ticket-{ticket_id}")
    card.locator("form.inline input[name=note]").fill("checked with finance, ref 77")
    card.locator("form.inline button[value=approve]").click()
    expect(card.locator("[data-outcome]")).to_contain_text("Note: checked with finance, ref 77")
    expect(page.locator("#recent")).to_contain_text("checked with finance, ref 77")
    page.goto(f"{stack.base_url}/tickets/{ticket_id}/")
    expect(page.locator("[data-outcome]")).to_contain_text("checked with finance, ref 77")
    page.goto(f"{stack.base_url}/runs/{run_id}/")
    expect(page.get_by_test_id("note")).to_have_text("checked with finance, ref 77")


def test_bulk_approval_is_confirmed_once_naming_count_and_tools(stack, page, sign_in):
    tickets = [
        off_loop(approval_ticket, "bulk-1"),
        off_loop(approval_ticket, "bulk-2"),
        off_loop(approval_ticket, "bulk-3", tool="ledger_once"),
    ]
    sign_in(page)
    page.goto(stack.base_url + "/inbox/")
    for _, ticket_id in tickets:
        page.locator(f"#ticket-{ticket_id} input.select").check()
    expect(page.get_by_test_id("selected-count")).to_have_text("3")
    page.locator("#bulk button[value=approve]").click()
    confirm = page.locator("#bulk-confirm")
    expect(confirm).to_contain_text("Approve 3 tickets?")
    expect(confirm).to_contain_text("ledger_approval ×2, ledger_once")
    assert off_loop(lambda: operations_open_count()) == 3  # nothing written before confirming
    confirm.locator("button[name=confirm]").click()
    expect(page.get_by_test_id("bulk-result")).to_contain_text("3 of 3 tickets approved")
    for _, ticket_id in tickets:
        expect(page.locator(f"#ticket-{ticket_id} [data-outcome]")).to_contain_text("Approved")


def operations_open_count() -> int:
    from runtime.models import Ticket

    return Ticket.objects.filter(state="open").count()


def test_times_show_the_browsers_zone_and_relative_on_request(stack, page, browser, sign_in):
    run_id, _ = off_loop(approval_ticket, "payment-6")
    context = browser.new_context(timezone_id="Asia/Tokyo", viewport={"width": 1280, "height": 900})
    page = context.new_page()  # the fixture page (UTC) is left unused
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        sign_in(page)
        page.goto(f"{stack.base_url}/runs/{run_id}/")
        started = page.locator(".facts time[data-local]").first
        expect(started).to_contain_text("GMT+9")  # the browser's zone, named
        expect(page.locator("table.log time").first).to_contain_text("GMT+9")  # dated rows
        page.locator("[data-time-toggle]").click()
        expect(started).to_contain_text("ago")
        expect(started).to_have_attribute("title", re.compile(r"GMT\+9 · .* UTC$"))
    finally:
        context.close()
    assert not errors, errors
