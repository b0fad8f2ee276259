"""Pages served to someone who may not read runs open no live connection: the sign-in page
(also where ``/`` sends a visitor) logs no console error, and none of those pages, nor a 404 or
403 page, opens a WebSocket (the server would refuse it, and the script would retry it)."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import ConsoleMessage, Page

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def watch(page: Page) -> tuple[list[str], list[str]]:
    """Record every WebSocket the page opens (its URL) and every console error (its text)."""
    sockets: list[str] = []
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(message.text)

    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.on("console", on_console)
    return sockets, errors


def visit(page: Page, url: str) -> str | None:
    """Load ``url`` and wait until the console's script has decided whether to go live (it
    opens its socket, if at all, before it marks the body ``data-script``); return the mark."""
    page.goto(url)
    page.wait_for_selector("body[data-script]", state="attached")
    return page.get_attribute("body", "data-script")


def test_the_sign_in_page_opens_no_live_connection(stack, page, sign_in):
    sockets, errors = watch(page)
    assert visit(page, stack.base_url + "/login/") == "static"
    assert visit(page, stack.base_url + "/") == "static"  # sent to the sign-in page
    assert page.url.startswith(stack.base_url + "/login/")
    assert (sockets, errors) == ([], [])

    visit(page, stack.base_url + "/no-such-page/")  # a 404 page (its status is an error line)
    assert sockets == []

    # A signed-in user without the read permission gets 403 pages: no socket either.
    get_user_model().objects.create_user(username="nemo", password="pw-nemo-1234")
    sign_in(page, "nemo", "pw-nemo-1234")
    visit(page, stack.base_url + "/")
    assert "Not allowed" in page.content()
    assert sockets == []

    # The same listeners see the socket of a page that may be live (they are not blind).
    page.context.clear_cookies()
    errors.clear()
    sign_in(page)
    deadline = time.monotonic() + 10
    while not sockets and time.monotonic() < deadline:
        page.wait_for_timeout(100)
    assert sockets == [stack.base_url.replace("http://", "ws://") + "/ws/runs/"]
    assert errors == []
