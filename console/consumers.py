"""WebSocket consumers of the live stream: thin by design.

Each one authenticates, checks the read permission, joins a Channels group of
``runtime.live`` and forwards its messages as JSON. Nothing sent here is thread truth: a
``delta`` is unconfirmed model output, a ``commit`` tells the page to fetch committed state
from the server. On connect the run consumer first sends the run's committed version, so a
page that reconnects refreshes committed state before it shows new deltas.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.models import READ
from runtime.live import ALL_RUNS_GROUP, bind_to_running_loop, run_group
from runtime.models import Run

# Close codes (4000-4999 are the application's): sent when the handshake is refused after
# the socket was accepted; before acceptance a refusal is an HTTP 403 on the upgrade.
NOT_FOUND = 4404


@database_sync_to_async
def _may_read(user: Any) -> bool:
    return bool(
        user is not None and user.is_authenticated and user.is_active and user.has_perm(READ)
    )


@database_sync_to_async
def _committed(run_id: str) -> dict[str, Any] | None:
    return Run.objects.filter(id=run_id).values("version", "state", "end_cause", "step").first()


class _LiveConsumer(AsyncJsonWebsocketConsumer):
    group: str = ""

    async def _authorised(self) -> bool:
        if not await _may_read(self.scope.get("user")):
            await self.close()  # before accept: the upgrade is refused with 403
            return False
        bind_to_running_loop()  # this process's live sends go to the loop viewers are on
        return True

    async def disconnect(self, code: int) -> None:
        if self.group:
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def run_commit(self, message: dict[str, Any]) -> None:
        await self.send_json(
            {
                "event": "commit",
                "run_id": message.get("run_id"),
                "seq": message.get("seq"),
                "state": message.get("state"),
            }
        )


class RunConsumer(_LiveConsumer):
    """``ws/runs/<run_id>/``: the run's unconfirmed deltas and its commit notices."""

    async def connect(self) -> None:
        if not await self._authorised():
            return
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        # Join before reading, so no commit can fall between the read and the subscription.
        self.group = run_group(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        committed = await _committed(run_id)
        await self.accept()
        if committed is None:
            await self.close(code=NOT_FOUND)
            return
        await self.send_json({"event": "hello", "run_id": run_id, **committed})

    async def run_delta(self, message: dict[str, Any]) -> None:
        await self.send_json(
            {
                "event": "delta",
                "step": message.get("step"),
                "attempt": message.get("attempt"),
                "kind": message.get("kind"),
                "text": message.get("text", ""),
                "index": message.get("index", 0),
                "name": message.get("name"),
                "call_id": message.get("call_id"),
            }
        )


class RunsConsumer(_LiveConsumer):
    """``ws/runs/``: a notice for every commit, so lists refresh their rows."""

    async def connect(self) -> None:
        if not await self._authorised():
            return
        self.group = ALL_RUNS_GROUP
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json({"event": "hello"})
