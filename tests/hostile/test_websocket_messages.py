"""What a client sends on the live WebSocket (issue 21, item 2): the stream takes nothing from
clients, so a message that is not untrusted JSON we accept closes the socket with 4400 and the
reason, logged in one line, and the consumer never raises (each of these closed with 1011 and
a traceback). A message over the size limit served by ``runtime_serve`` gets a close frame
(1009) instead of a dropped connection."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.test import Client
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from console.consumers import BAD_MESSAGE, REASON_BYTES
from console.management.groups import ensure_groups
from console.routing import websocket_urlpatterns
from tests.hostile.corpus import DEEP, HUGE_DIGITS
from tests.servers import free_port, serving

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 1 << 20  # the size limit of these tests: room for 100,000 nested brackets

# What a client sends (text, or bytes for a binary frame) and how the reason begins.
MESSAGES: dict[str, tuple[str | bytes, str]] = {
    "invalid": ("{nope", "message: not valid JSON"),
    "raw_nul": ('{"a": "x\x00y"}', "message: not valid JSON: Invalid control character"),
    "escaped_nul": ('{"a": "x\\u0000y"}', "message: text may not contain NUL characters"),
    "surrogate": ('{"a": "x\\ud800y"}', "message: text must be valid Unicode"),
    "deep": ("[" * 100_000 + "]" * 100_000, "message: nesting deeper than 32 levels"),
    "deep_object": ('{"a":' * DEEP + "1" + "}" * DEEP, "message: nesting deeper than 32 levels"),
    "huge_int": ("9" * HUGE_DIGITS, "integers have at most 100 digits"),
    "nan": ('{"n": NaN}', "NaN is not JSON"),
    "binary": (b"\x00\xff\x00", "binary messages are not accepted"),
    "too_large": ('"' + "é" * LIMIT + '"', f"message too large: {2 * LIMIT + 2} bytes (at most"),
}


async def _viewer():
    def make():
        user = get_user_model().objects.create_user(f"wes-{uuid.uuid4().hex[:8]}")
        user.groups.add(ensure_groups()["viewers"])
        return user

    return await sync_to_async(make)()


async def _connected(path: str) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    comm.scope["user"] = await _viewer()
    connected, _ = await comm.connect()
    assert connected
    assert (await comm.receive_json_from(timeout=5))["event"] == "hello"
    return comm


async def _send(comm: WebsocketCommunicator, message: str | bytes) -> None:
    if isinstance(message, bytes):
        await comm.send_to(bytes_data=message)
    else:
        await comm.send_to(text_data=message)


@pytest.mark.asyncio
@pytest.mark.parametrize("name", sorted(MESSAGES))
async def test_a_message_that_cannot_be_parsed_closes_4400_with_the_reason(
    name, caplog, settings
) -> None:
    settings.RUNTIME_WS_MAX_MESSAGE_BYTES = LIMIT
    message, reason = MESSAGES[name]
    comm = await _connected("/ws/runs/")
    with caplog.at_level(logging.WARNING):
        await _send(comm, message)
        error = await comm.receive_json_from(timeout=5)
        closed = await comm.receive_output(timeout=5)
        await _send(comm, message)  # dropped unread: no second refusal, no second line
        assert await comm.receive_nothing(timeout=0.1)
    assert error["event"] == "error" and error["code"] == BAD_MESSAGE, error
    assert error["reason"].startswith(reason), error
    assert closed == {"type": "websocket.close", "code": BAD_MESSAGE, "reason": error["reason"]}
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in lines] == ["console.consumers"], lines
    assert lines[0].getMessage() == f"websocket /ws/runs/: closed 4400: {error['reason']}"
    await comm.disconnect()  # re-raises whatever the consumer raised


@pytest.mark.asyncio
async def test_a_run_stream_refuses_the_same_way_and_ignores_valid_json(start) -> None:
    run_id = await sync_to_async(start)({"text": "hi"})
    comm = await _connected(f"/ws/runs/{run_id}/")
    await comm.send_to(text_data='{"ping": 1}')  # valid: ignored, the stream goes on
    assert await comm.receive_nothing(timeout=0.2)
    await comm.send_to(text_data="{nope")
    assert (await comm.receive_json_from(timeout=5))["event"] == "error"
    closed = await comm.receive_output(timeout=5)
    assert closed["code"] == BAD_MESSAGE
    await comm.disconnect()


@pytest.mark.asyncio
async def test_the_limit_is_a_setting_and_the_reason_fits_a_close_frame(settings) -> None:
    settings.RUNTIME_WS_MAX_MESSAGE_BYTES = 1024
    comm = await _connected("/ws/runs/")
    await comm.send_to(text_data="[" + "1," * 600 + "1]")
    error = await comm.receive_json_from(timeout=5)
    assert error["reason"] == "message too large: 1203 bytes (at most 1024)"
    await comm.receive_output(timeout=5)
    await comm.disconnect()
    comm = await _connected("/ws/runs/")
    await comm.send_to(text_data="{" + '"' + "k" * 600 + '": ' + "}")  # a long parser message
    await comm.receive_json_from(timeout=5)
    closed = await comm.receive_output(timeout=5)
    assert len(closed["reason"].encode()) <= REASON_BYTES
    await comm.disconnect()


def _session_cookie() -> str:
    user = get_user_model().objects.create_user("sam")
    user.groups.add(ensure_groups()["viewers"])
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


@pytest.mark.slow
def test_runtime_serve_closes_on_an_oversized_or_hostile_message(
    subprocess_env, tmp_path: Path
) -> None:
    """A message over the limit gets daphne's close frame (1009), not a dropped connection,
    as does a text frame that is not UTF-8 (1007); a hostile one gets the consumer's 4400 and
    error event; the server logs no traceback.

    The message is 4 KB over a 1 KB limit, read by the server at once: the bytes of a 10 MB
    one keep arriving after the server closed, and the kernel's reset for them could overtake
    the close frame on a loaded machine (the client then saw only a dropped connection)."""
    port, log = free_port(), tmp_path / "serve.log"
    command = [sys.executable, "manage.py", "runtime_serve", "--no-worker", "--port", str(port)]
    cookie = _session_cookie()
    env = {**subprocess_env(), "RUNTIME_WS_MAX_MESSAGE_BYTES": "1024"}
    with serving(env, log, command=command, port=port, timeout=60) as url:
        ws_url = url.replace("http://", "ws://") + "/ws/runs/"
        headers = {"Cookie": cookie, "Origin": url}
        with connect(ws_url, additional_headers=headers, open_timeout=30) as socket:
            assert '"hello"' in str(socket.recv(timeout=30))
            with pytest.raises(ConnectionClosed) as closed:
                socket.send("x" * 4096)
                socket.recv(timeout=30)
            assert closed.value.rcvd is not None, "dropped without a close frame"
            assert closed.value.rcvd.code == 1009
        with connect(ws_url, additional_headers=headers, open_timeout=30) as socket:
            assert '"hello"' in str(socket.recv(timeout=30))
            socket.send("{nope")
            assert '"error"' in str(socket.recv(timeout=30))
            with pytest.raises(ConnectionClosed) as closed:
                socket.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == BAD_MESSAGE
        with connect(ws_url, additional_headers=headers, open_timeout=30) as socket:
            assert '"hello"' in str(socket.recv(timeout=30))
            with pytest.raises(ConnectionClosed) as closed:
                socket.send(b'"\xff\xfe"', text=True)  # a text frame that is not UTF-8
                socket.recv(timeout=30)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]
