"""Accessibility (issue 22): axe-core, run in Chromium on every page of the console in light
and dark mode, reports no serious or critical violation.

axe-core comes from npm, vendored for the tests only (``tests/browser/vendor/``): it is
injected into each page after it loaded, never served by the product.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import expect

from runtime import operations
from runtime.models import WorkerProcess
from tests.browser.conftest import off_loop
from tests.browser.test_inbox import approval_ticket
from tests.console.support import INPUT_SCHEMA, RunDriver

pytestmark = [pytest.mark.browser, pytest.mark.slow]

AXE = Path(__file__).parent / "vendor" / "axe.min.js"


@pytest.fixture(scope="module", autouse=True)
def _orm_beside_playwright() -> Any:
    """Playwright's sync API runs an event loop in this thread from the module's browser on;
    the ORM calls the fixtures make are plain synchronous calls (as the ``page`` fixture
    allows them)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        yield


BLOCKING = ("serious", "critical")


def axe_violations(page: Any, rules: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """The violations axe-core finds on the page as it is now: the serious and critical ones
    of every rule, or, given ``rules`` (axe rule ids), every violation of those rules
    whatever its impact."""
    page.add_script_tag(path=str(AXE))
    found = page.evaluate(
        "async (rules) => (await axe.run(document, rules.length"
        " ? {resultTypes: ['violations'], runOnly: {type: 'rule', values: rules}}"
        " : {resultTypes: ['violations']})).violations"
        ".map(v => ({id: v.id, impact: v.impact, help: v.help,"
        " nodes: v.nodes.slice(0, 5).map(n => n.target.join(' ') + ' :: ' + n.failureSummary)}))",
        list(rules),
    )
    return found if rules else [v for v in found if v["impact"] in BLOCKING]


def _data() -> dict[str, str]:
    """Runs in the states the pages show: awaiting an approval and an input, ended with an
    Indeterminate call that was reconciled, a finished run to fork and run again, a worker."""
    from django.utils import timezone

    run_id, ticket = approval_ticket("invoice-42")
    asking = RunDriver(operations.start_run(agent="demo", input="Which account?", actor="olga"))
    (ask,) = asking.open_batch(
        {"name": "ask_input", "arguments": {"question": "Which account?", "answer_schema": {}}}
    )
    input_ticket = asking.await_ticket(
        ask, "input", request={"question": "Which account?"}, schema=INPUT_SCHEMA
    )
    lost = RunDriver(operations.start_run(agent="demo", input="Pay supplier 7", actor="olga"))
    (pay,) = lost.open_batch({"name": "ledger_once", "arguments": {"key": "payment-7"}})
    lost.execute(pay, worker="w-gone")
    lost.fail("the worker died during the call")
    done = RunDriver(operations.start_run(agent="demo", input="Record a", actor="olga"))
    (a,) = done.open_batch({"name": "ledger_replay", "arguments": {"key": "a"}})
    done.execute(a)
    done.complete(a, '{"recorded": "a"}')
    done.finalize()
    done.text_step("Recorded a.", end=True)
    other = RunDriver(operations.start_run(agent="demo", input="Record b", actor="olga"))
    (b,) = other.open_batch({"name": "ledger_once", "arguments": {"key": "b"}})
    other.execute(b)
    other.fail()
    operations.reconcile(b.call_id, outcome="applied", evidence="ledger row 9", actor="olga")
    # Tool arguments far taller than their box (it scrolls): 80 lines of JSON.
    long = RunDriver(operations.start_run(agent="demo", input="Record many", actor="olga"))
    (many,) = long.open_batch(
        {"name": "ledger_replay", "arguments": {"key": "many", "rows": list(range(80))}}
    )
    long.execute(many)
    long.complete(many, json.dumps({"recorded": list(range(80))}))
    now = timezone.now()
    WorkerProcess.objects.create(
        id="w-live", host="h", pid=1, started_at=now, heartbeat_at=now, concurrency=2
    )
    return {
        "approval_run": run_id,
        "ticket": ticket,
        "input_ticket": input_ticket,
        "lost": lost.run_id,
        "done": done.run_id,
        "long_arguments": long.run_id,
    }


def _viewer() -> None:
    from django.contrib.auth import get_user_model

    from console.management.groups import ensure_groups

    user = get_user_model().objects.create_user(username="vera", password="pw-vera-1234")
    user.groups.add(ensure_groups()["viewers"])


def pages(ids: dict[str, str]) -> list[tuple[str, str]]:
    return [
        ("runs", "/"),
        ("runs, searched", "/?q=invoice&state=awaiting"),
        ("run awaiting approval", f"/runs/{ids['approval_run']}/"),
        ("run with an Indeterminate call", f"/runs/{ids['lost']}/"),
        ("ended run", f"/runs/{ids['done']}/"),
        ("run with long tool arguments", f"/runs/{ids['long_arguments']}/"),
        ("run again?", f"/runs/{ids['done']}/again/"),
        ("start a run", "/runs/new/"),
        ("inbox", "/inbox/"),
        ("ticket", f"/tickets/{ids['ticket']}/"),
        ("input ticket's form", f"/tickets/{ids['input_ticket']}/"),
        ("reconcile", "/reconcile/"),
        ("reconcile, all", "/reconcile/?show=all"),
        ("audit", "/audit/"),
        ("workers", "/workers/"),
        ("tokens", "/tokens/"),
        ("not found", "/runs/" + "0" * 32 + "/"),
    ]


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_no_serious_or_critical_violation_on_any_page(stack, browser, operator_user, scheme):
    ids = off_loop(_data)
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
    context.set_default_timeout(20_000)
    page = context.new_page()
    report: dict[str, list[dict[str, Any]]] = {}
    try:
        page.goto(stack.base_url + "/login/")
        report["sign in"] = axe_violations(page)
        page.fill("#id_username", operator_user[0])
        page.fill("#id_password", operator_user[1])
        page.click("button[type=submit]")
        page.wait_for_url(stack.base_url + "/")
        for name, path in pages(ids):
            page.goto(stack.base_url + path)
            expect(page.locator("main")).to_be_visible()
            report[name] = axe_violations(page)
        # A confirmation that only a POST shows: cancel the runs a filter matches.
        page.goto(stack.base_url + "/?state=awaiting")
        page.get_by_role("button", name="Cancel the matching runs…").click()
        expect(page.get_by_test_id("cancel-question")).to_be_visible()
        report["cancel the matching runs?"] = axe_violations(page)
        # Forms with their answers open: the bulk confirmation of the inbox.
        page.goto(stack.base_url + "/inbox/")
        page.locator("input.select").first.check()
        page.get_by_role("button", name="Approve selected…").click()
        expect(page.locator("#bulk-confirm .confirm")).to_be_visible()
        report["inbox, bulk confirmation"] = axe_violations(page)
        # What a viewer is refused: the 403 page.
        off_loop(_viewer)
        refused = browser.new_context(color_scheme=scheme)
        other = refused.new_page()
        other.goto(stack.base_url + "/login/")
        other.fill("#id_username", "vera")
        other.fill("#id_password", "pw-vera-1234")
        other.click("button[type=submit]")
        other.wait_for_url(stack.base_url + "/")
        response = other.goto(stack.base_url + "/runs/new/")
        assert response is not None and response.status == 403
        report["forbidden"] = axe_violations(other)
        refused.close()
    finally:
        context.close()
    failing = {name: found for name, found in report.items() if found}
    assert not failing, json.dumps(failing, indent=2)


# Issue 32: the violations the review found, whatever axe-core's impact (heading-order is
# moderate, empty-table-header minor), on the pages where it found them.
REVIEWED_RULES = ("scrollable-region-focusable", "heading-order", "empty-table-header")


def test_reviewed_rules_hold_on_the_pages_that_broke_them(stack, browser, operator_user):
    ids = off_loop(_data)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    report: dict[str, list[dict[str, Any]]] = {}
    try:
        page.goto(stack.base_url + "/login/")
        page.fill("#id_username", operator_user[0])
        page.fill("#id_password", operator_user[1])
        page.click("button[type=submit]")
        page.wait_for_url(stack.base_url + "/")
        for name, path in pages(ids):
            page.goto(stack.base_url + path)
            expect(page.locator("main")).to_be_visible()
            report[name] = axe_violations(page, REVIEWED_RULES)
        failing = {name: found for name, found in report.items() if found}
        assert not failing, json.dumps(failing, indent=2)
        # The long arguments do scroll (the rule had something to judge) and take the focus.
        page.goto(stack.base_url + f"/runs/{ids['long_arguments']}/")
        args = page.get_by_role("group", name="Arguments of #0 ledger_replay")
        assert args.evaluate("el => el.scrollHeight > el.clientHeight")
        args.focus()
        expect(args).to_be_focused()
    finally:
        context.close()
