"""Pages served to someone who may not read runs open no live connection: the sign-in page
(also where ``/`` sends a visitor) logs no console error, and none of those pages, nor a 404 or
403 page, opens a WebSocket (the server would refuse it, and the script would retry it)."""

from __future__ import annotations

import time

import pytest
from django.contrib.auth import get_user_model

pytestmark = [pytest.mark.browser, pytest.mark.slow]

SETTLE_MS = 2500  # the script opens its socket at once and retries a refused one after 1 s


def watch(page) -> tuple[list[str], list[str]]:
    """Record every WebSocket the page opens (its URL) and every console error (its text)."""
    sockets: list[str] = []
    errors: list[str] = []
    page.on("websocket", lambda ws: sockets.append(ws.url))
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    return sockets, errors


def visit(page, url: str) -> None:
    page.goto(url)
    page.wait_for_load_state("load")
    page.wait_for_timeout(SETTLE_MS)


def test_the_sign_in_page_opens_no_live_connection(stack, page, sign_in):
    sockets, errors = watch(page)
    visit(page, stack.base_url + "/login/")
    visit(page, stack.base_url + "/")  # sent to the sign-in page
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
