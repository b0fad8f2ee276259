"""A tour of every page with realistic data, at 1280 px and on a phone, as screenshots.

Each page is also checked for what a person needs to see on it. With
``RUNTIME_UPDATE_SCREENSHOTS=1`` the screenshots refresh ``docs/screenshots/`` (committed);
otherwise they go under ``test-results/screenshots/tour/``.
"""

from __future__ import annotations

import json
import os
import re

import pytest
from playwright.sync_api import expect

from runtime import operations
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.live import run_group
from runtime.models import LateEvidence
from tests.browser.conftest import DOCS, RESULTS, off_loop, send_live
from tests.console.support import INPUT_SCHEMA, RunDriver

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PHONE = {"width": 390, "height": 844}


def out_dir():
    target = DOCS if os.environ.get("RUNTIME_UPDATE_SCREENSHOTS") == "1" else RESULTS / "tour"
    target.mkdir(parents=True, exist_ok=True)
    return target


def seed() -> dict[str, str]:
    """Runs in every state a console shows, committed as a worker would commit them."""
    ids: dict[str, str] = {}

    done = RunDriver(operations.start_run(agent="demo", input="Say hello.", actor="olga"))
    done.text_step("Hello! Nothing to record today.", end=True)

    replay = RunDriver(operations.start_run(agent="demo", input="Record order-17.", actor="olga"))
    (call,) = replay.open_batch(
        {
            "name": "ledger_replay",
            "arguments": {"key": "order-17"},
            "policy": "replay",
            "max_attempts": 3,
        },
        text="Recording order-17 (safe to replay).",
    )
    replay.execute(call, worker="host-a:4121")
    replay.complete(call, json.dumps({"recorded": "order-17", "operation_id": call.operation_id}))
    ids["replay"] = replay.run_id

    crashed = RunDriver(operations.start_run(agent="demo", input="Pay invoice 7.", actor="abe"))
    (call,) = crashed.open_batch(
        {"name": "ledger_once", "arguments": {"key": "payment-7"}},
        text="Recording payment-7. This tool is never retried.",
    )
    crashed.execute(call, worker="host-b:977")
    crashed.fail("the worker stopped after the call started; its policy never guesses")
    LateEvidence.objects.create(
        call_id=call.call_id,
        worker="host-b:977",
        result=json.dumps({"recorded": "payment-7", "operation_id": call.operation_id}),
    )
    ids["crashed"] = crashed.run_id

    cancelled = RunDriver(operations.start_run(agent="demo", input="Record x.", actor="olga"))
    operations.cancel(cancelled.run_id, actor="olga", reason="wrong customer")

    asking = RunDriver(operations.start_run(agent="demo", input="Charge the client.", actor="olga"))
    args = {"question": "Which account should be charged?", "answer_schema": INPUT_SCHEMA}
    (call,) = asking.open_batch(
        {"name": "ask_input", "arguments": args}, text="I need to know which account to charge."
    )
    ids["input_ticket"] = asking.await_ticket(
        call, "input", request={"question": args["question"]}, schema=INPUT_SCHEMA
    )
    ids["input"] = asking.run_id

    gated = RunDriver(
        operations.start_run(agent="demo", input="Record invoice-42 <b>now</b>.", actor="olga")
    )
    (call,) = gated.open_batch(
        {
            "name": "ledger_approval",
            "arguments": {"key": "invoice-42", "note": "<script>x</script>"},
            "permission": "ask",
        },
        text="Let me record invoice-42. The ledger needs an approval first.",
    )
    ids["approval_ticket"] = gated.await_ticket(call, "approval", request={"tool": call.name})
    ids["approval"] = gated.run_id

    ids["running"] = operations.start_run(agent="demo", input="Summarise the ledger.", actor="olga")
    return ids


def test_tour_of_every_page(stack, page, browser, sign_in):
    ids = off_loop(seed)
    shots = out_dir()
    base = stack.base_url

    page.goto(base + "/login/")
    page.screenshot(path=str(shots / "login.png"))
    sign_in(page)

    page.goto(base + "/")
    expect(page.locator("table.runs tbody tr")).to_have_count(7)
    page.screenshot(path=str(shots / "runs.png"), full_page=True)

    # the run page mid-stream: deltas of the next step arrive while it is Running
    page.goto(f"{base}/runs/{ids['running']}/")
    expect(page.locator("#live [data-live-status]")).to_have_text("Live: connected.")
    for piece in ("The ledger holds ", "three entries so far: ", "order-17, "):
        send_live(
            run_group(ids["running"]),
            {
                "type": "run.delta",
                "run_id": ids["running"],
                "step": 1,
                "attempt": 1,
                "kind": "text",
                "text": piece,
                "index": 0,
                "name": None,
                "call_id": None,
            },
        )
    expect(page.locator("#live-text")).to_contain_text("order-17,")
    page.screenshot(path=str(shots / "run-live.png"), full_page=True)

    page.goto(f"{base}/runs/{ids['approval']}/")
    expect(page.locator("[data-testid=run-state]")).to_contain_text("awaiting")
    page.screenshot(path=str(shots / "run-awaiting-approval.png"), full_page=True)

    page.goto(f"{base}/runs/{ids['replay']}/")
    page.screenshot(path=str(shots / "run-tool-batch.png"), full_page=True)

    page.goto(base + "/inbox/")
    expect(page.locator("[data-testid=open-count]")).to_have_text("2")
    page.screenshot(path=str(shots / "inbox.png"), full_page=True)

    page.goto(f"{base}/tickets/{ids['input_ticket']}/")
    page.fill("#id_answer-account", "ACME")
    page.fill("#id_answer-amount", "12.5")
    page.fill("#id_answer-tags", "[urgent")  # checked on the server only
    page.locator("button:has-text('Send answer')").click()
    expect(page.locator(".ticket-card")).to_contain_text("not valid JSON")
    page.screenshot(path=str(shots / "ticket-input-form.png"), full_page=True)

    page.goto(base + "/reconcile/")
    expect(page.locator(".call-card")).to_have_count(1)
    page.screenshot(path=str(shots / "reconcile.png"), full_page=True)

    page.goto(base + "/runs/new/")
    page.screenshot(path=str(shots / "start.png"), full_page=True)

    page.goto(base + "/tokens/")
    page.fill("#id_name", "CI pipeline")
    page.locator("button:has-text('Create token')").click()
    expect(page.locator("[data-testid=new-token]")).to_have_value(re.compile(r"^rt_"))
    page.screenshot(path=str(shots / "tokens.png"), full_page=True)

    # keyboard: the approve button is reachable with Tab and works with Enter
    page.goto(base + "/inbox/")
    approve = page.locator(f"#ticket-{ids['approval_ticket']}").get_by_role(
        "button", name=re.compile(r"^Approve #")
    )
    approve.focus()
    page.keyboard.press("Enter")
    expect(page.locator(f"#ticket-{ids['approval_ticket']} [data-outcome]")).to_contain_text(
        "Approved by olga"
    )

    phone = browser.new_context(
        viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=2
    )
    mobile = phone.new_page()
    for cookie in page.context.cookies():
        phone.add_cookies([cookie])
    for name, path in (("runs", "/"), ("run", f"/runs/{ids['crashed']}/"), ("inbox", "/inbox/")):
        mobile.goto(base + path)
        width = mobile.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"{path} scrolls sideways on a phone ({width}px)"
        mobile.screenshot(path=str(shots / f"phone-{name}.png"), full_page=True)
    phone.close()


SCREEN = 900  # px: the desktop viewport's height


def seed_at_scale() -> dict[str, str]:
    """40 open approvals over three tools, some decisions for the audit page, and a long run
    of 25 finalized batches of 4 calls (100 calls)."""
    ids: dict[str, str] = {}
    tools = ("ledger_approval", "ledger_approval", "ledger_once", "ledger_replay")
    for i in range(40):
        gated = RunDriver(
            operations.start_run(
                agent="demo", input=f"Pay supplier invoice INV-{1000 + i}.", actor="olga"
            )
        )
        (call,) = gated.open_batch(
            {"name": tools[i % 4], "arguments": {"key": f"INV-{1000 + i}"}, "permission": "ask"},
            text=f"Invoice INV-{1000 + i} is due; paying it needs an approval.",
        )
        ticket_id = gated.await_ticket(call)
        if i < 4:  # decisions for the audit page
            decision = Decision.APPROVE if i % 2 else Decision.DENY
            operations.resume(
                gated.run_id,
                ResumeCommand(
                    ticket_id=ticket_id,
                    kind=TicketKind.APPROVAL,
                    decision=decision,
                    reason="matches the purchase order" if i % 2 else "duplicate invoice",
                ),
                actor="abe" if i % 2 else "olga",
            )
    cancelled = RunDriver(operations.start_run(agent="demo", input="Record x.", actor="olga"))
    operations.cancel(cancelled.run_id, actor="olga", reason="wrong customer")

    long = RunDriver(
        operations.start_run(agent="demo", input="Reconcile the March ledger.", actor="olga")
    )
    for step in range(25):
        calls = long.open_batch(
            *[
                {"name": "ledger_replay", "arguments": {"key": f"M-{step}-{n}"}, "policy": "replay"}
                for n in range(4)
            ],
            text=f"Batch {step + 1} of 25.",
        )
        for call in calls:
            assert call.arguments is not None
            long.execute(call, worker="host-a:4121")
            long.complete(call, json.dumps({"recorded": call.arguments["key"]}))
        long.finalize()
    ids["long"] = long.run_id
    return ids


def test_tour_at_scale_light_and_dark(stack, page, browser, sign_in):
    ids = off_loop(seed_at_scale)
    shots = out_dir()
    base = stack.base_url
    sign_in(page)

    page.goto(base + "/inbox/")
    expect(page.get_by_test_id("open-count")).to_have_text("36")
    expect(page.locator("#tickets .ticket-card")).to_have_count(25)  # one keyset page
    page.screenshot(path=str(shots / "inbox-scale.png"))

    page.goto(base + "/audit/")
    expect(page.locator("table.audit tbody tr")).to_have_count(5)
    page.screenshot(path=str(shots / "audit.png"), full_page=True)

    page.goto(f"{base}/runs/{ids['long']}/")
    expect(page.locator("details.batch")).to_have_count(25)
    height = page.evaluate("document.documentElement.scrollHeight")
    assert height < 5 * SCREEN, f"a run of 100 calls is {height}px before expanding anything"
    page.screenshot(path=str(shots / "run-long.png"), full_page=True)

    dark = browser.new_context(viewport={"width": 1280, "height": SCREEN}, color_scheme="dark")
    phone_dark = browser.new_context(
        viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=2, color_scheme="dark"
    )
    phone = browser.new_context(
        viewport=PHONE, is_mobile=True, has_touch=True, device_scale_factor=2
    )
    try:
        for context, suffix in ((dark, "-dark"), (phone, ""), (phone_dark, "-dark")):
            context.add_cookies(page.context.cookies())
            other = context.new_page()
            prefix = "phone-" if context is not dark else ""
            for name, path in (
                ("inbox-scale", "/inbox/"),
                ("audit", "/audit/"),
                ("run-long", f"/runs/{ids['long']}/"),
                ("runs", "/"),
            ):
                other.goto(base + path)
                expect(other.locator("main h1")).to_be_visible()
                if prefix:
                    width = other.evaluate("document.documentElement.scrollWidth")
                    assert width <= PHONE["width"], f"{path} scrolls sideways ({width}px)"
                other.screenshot(path=str(shots / f"{prefix}{name}{suffix}.png"))
    finally:
        for context in (dark, phone, phone_dark):
            context.close()
