"""Open streams lose access within seconds once it is taken away (issue 12, item 6).

A real daphne process serves a run that keeps waiting (an approval ticket), so its streams
stay open; the test then revokes the token, removes the user from ``viewers`` or
deactivates the user, and expects the stream to end within a few seconds.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from console.management.groups import ensure_groups
from console.models import ApiToken
from tests.api.conftest import APPROVAL, BASE, drive

pytestmark = pytest.mark.django_db(transaction=True)

WITHIN = 8.0  # seconds: the streams re-check access every 2 s; slack for a loaded machine


def test_a_revoked_token_ends_an_open_event_stream(make_user, start, daphne) -> None:
    user, token = make_user("rita", "read")
    run = start(APPROVAL)
    drive()
    ended = threading.Event()
    chunks: list[str] = []

    def follow() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.stream(
            "GET", f"{daphne}{BASE}/runs/{run['id']}/events", headers=headers, timeout=60
        ) as response:
            assert response.status_code == 200
            for chunk in response.iter_text():
                chunks.append(chunk)
        ended.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not any("event: commit" in c for c in chunks):  # the stream is open and serving
        assert time.monotonic() < deadline and not ended.is_set(), chunks
        time.sleep(0.05)
    ApiToken.objects.get(user=user).revoke()
    revoked = time.monotonic()
    assert ended.wait(WITHIN + 5), "the stream kept going after its token was revoked"
    assert time.monotonic() - revoked < WITHIN
    reader.join(5)


def _signed_in_viewer(name: str) -> tuple[object, str]:
    """A new member of ``viewers`` and the session cookie of a console sign-in."""
    user = get_user_model().objects.create_user(name)
    user.groups.add(ensure_groups()["viewers"])
    client = Client()
    client.force_login(user)
    return user, f"sessionid={client.cookies['sessionid'].value}"


@pytest.mark.parametrize("take_away", ["remove_from_viewers", "deactivate"])
def test_a_viewer_who_loses_access_loses_the_socket(start, daphne, take_away) -> None:
    run = start(APPROVAL)
    drive()
    user, cookie = _signed_in_viewer(f"vera-{take_away}")
    url = daphne.replace("http://", "ws://") + f"/ws/runs/{run['id']}/"
    with connect(url, additional_headers={"Cookie": cookie, "Origin": daphne}) as socket:
        assert '"hello"' in socket.recv(timeout=10)
        if take_away == "deactivate":
            user.is_active = False  # type: ignore[attr-defined]
            user.save(update_fields=["is_active"])  # type: ignore[attr-defined]
        else:
            user.groups.clear()  # type: ignore[attr-defined]
        taken = time.monotonic()
        with pytest.raises(ConnectionClosed) as closed:
            while time.monotonic() - taken < WITHIN + 5:
                socket.recv(timeout=WITHIN + 5)
        assert time.monotonic() - taken < WITHIN
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
