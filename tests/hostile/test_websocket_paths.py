"""WebSocket upgrades for odd run ids close with 4404, like an unknown run (never a 500)."""

from __future__ import annotations

import pytest
from asgiref.sync import sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator

from console.consumers import NOT_FOUND
from console.routing import websocket_urlpatterns

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

ODD_IDS = ["~x~", "a" * 100, "a.b", "%00", "x" * 64 + "y", "\u00e9t\u00e9", "unknown"]


@pytest.mark.parametrize("run_id", ODD_IDS)
async def test_odd_run_ids_close_4404(make_user, run_id) -> None:
    user, _ = await _user(make_user)
    comm = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/runs/{run_id}/")
    comm.scope["user"] = user
    connected, _ = await comm.connect()
    assert connected
    message = await comm.receive_output(timeout=5)
    assert message == {"type": "websocket.close", "code": NOT_FOUND}
    await comm.disconnect()


async def _user(make_user):
    return await sync_to_async(make_user)("viv", "read")
