"""WebSocket consumers of the live stream: thin by design.

Each one authenticates, checks the read permission, joins a Channels group of
``runtime.live`` and forwards its messages as JSON. Nothing sent here is thread truth: a
``delta`` is unconfirmed model output, a ``commit`` tells the page to fetch committed state
from the server. On connect the run consumer first sends the run's committed version, so a
page that reconnects refreshes committed state before it shows new deltas.

Commit notices reach a consumer through the channel layer when the writer shares it (the
in-process worker, or any worker with ``REDIS_URL``). A worker in another process on the
in-memory layer cannot reach it, so each consumer also looks at the log every
``WATCH_SECONDS`` and sends a commit notice when it moved: the page is never left stale.
Such a notice carries the run's committed ``seq`` and ``state`` like a real one, so a page
that already saw that commit ignores it (a notice without them once reset the live panel).
Every ``ACCESS_SECONDS`` it reads its user afresh and closes with 4403 once the user is
deactivated or no longer may read (issue 12: a removed viewer kept an open socket); the
sockets of one user share that read (one per user and process every ACCESS_FRESH seconds).
These reads run on the thread pool, not on the one thread that serves the process's sync
views.

The stream takes nothing from clients. A message a client sends anyway is parsed by the rules
for untrusted JSON (runtime.untrusted) and ignored; one that is binary, larger than
RUNTIME_WS_MAX_MESSAGE_BYTES or not such JSON closes the socket with 4400 and the reason
(also sent first as an ``error`` event: daphne drops a close frame's reason), logged in one
line; nothing a client sends makes a consumer raise (issue 21: each of these closed with 1011
and a traceback).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, TypedDict

from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.contrib.auth import get_user_model

from console.db import ACCESS_FRESH, ACCESS_SECONDS, SharedAnswers, off_loop
from console.models import READ
from runtime import conf
from runtime.live import ALL_RUNS_GROUP, Viewing, bind_to_running_loop, run_group
from runtime.models import Run, StreamCheckpoint, ThreadCommit
from runtime.untrusted import UntrustedJSONError, is_id, parse_json

# Close codes (4000-4999 are the application's): sent when the handshake is refused after
# the socket was accepted; before acceptance a refusal is an HTTP 403 on the upgrade.
NOT_FOUND = 4404
FORBIDDEN = 4403
BAD_MESSAGE = 4400
REASON_BYTES = 123  # the most a close frame's reason holds (RFC 6455, 5.5)
WATCH_SECONDS = 1.0
_ACCESS = SharedAnswers(fresh=ACCESS_FRESH)
log = logging.getLogger(__name__)


def max_message_bytes() -> int:
    """The largest message a client may send, in bytes (RUNTIME_WS_MAX_MESSAGE_BYTES)."""
    return conf.ws_max_message_bytes()


def message_problem(text_data: str | None, bytes_data: bytes | None) -> str | None:
    """Say why a client's message is refused (binary, too large, not untrusted JSON we
    accept: ``runtime.untrusted.parse_json``'s reason), or return None; never raises."""
    if text_data is None:
        return "binary messages are not accepted"
    size = len(text_data.encode("utf-8", "surrogatepass"))
    if size > (limit := max_message_bytes()):
        return f"message too large: {size} bytes (at most {limit})"
    try:
        parse_json(text_data, "message")
    except UntrustedJSONError as exc:
        return str(exc)
    return None


@off_loop
def _may_read(user: Any) -> bool:
    return bool(
        user is not None and user.is_authenticated and user.is_active and user.has_perm(READ)
    )


@off_loop
def _may_still_read(user_pk: Any) -> bool:
    """The user read afresh (no permission cache): still active and allowed to read."""
    user = get_user_model().objects.filter(pk=user_pk).first()
    return bool(user is not None and user.is_active and user.has_perm(READ))


class _Committed(TypedDict):
    version: int
    state: str
    end_cause: str | None
    step: int


class _StreamSoFar(TypedDict):
    step: int
    attempt: int
    text: str
    claim: int | None


@off_loop
def _committed(run_id: str) -> _Committed | None:
    return Run.objects.filter(id=run_id).values("version", "state", "end_cause", "step").first()


@off_loop
def _stream_so_far(run_id: str, step: int) -> _StreamSoFar | None:
    """The in-flight step's checkpointed text (unconfirmed), so a late viewer sees its start."""
    return (
        StreamCheckpoint.objects.filter(run_id=run_id, step__gt=step)
        .values("step", "attempt", "text", "claim")
        .first()
    )


@off_loop
def _latest_commit_id() -> int | None:
    return ThreadCommit.objects.order_by("-id").values_list("id", flat=True).first()


class _LiveConsumer(AsyncJsonWebsocketConsumer):
    group: str = ""
    watcher: asyncio.Task[None] | None = None
    viewing: Viewing | None = None  # the run whose deltas this socket wants published
    refused: bool = False

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """Check a client's message and ignore it; close with BAD_MESSAGE when it is refused
        (``message_problem``). Messages after a refusal are dropped unread."""
        if self.refused:
            return
        problem = message_problem(text_data, bytes_data)
        if problem is None:
            return
        self.refused = True
        log.warning("websocket %s: closed %d: %s", self.scope.get("path"), BAD_MESSAGE, problem)
        await self.send_json({"event": "error", "code": BAD_MESSAGE, "reason": problem})
        reason = problem.encode()[:REASON_BYTES].decode(errors="ignore")
        await self.close(code=BAD_MESSAGE, reason=reason)

    async def mark(self) -> dict[str, Any] | None:
        """The notice to send when the log moved: ``{"seq", "state"}`` (None: nothing)."""
        raise NotImplementedError

    def watch(self, seen: Any) -> None:
        """Look at the log every WATCH_SECONDS; ``seen`` is the seq the client was sent."""

        user_pk = self.scope["user"].pk

        async def loop() -> None:
            nonlocal seen
            next_access = time.monotonic() + ACCESS_SECONDS
            while True:
                await asyncio.sleep(WATCH_SECONDS)
                if time.monotonic() >= next_access:
                    if not await _ACCESS.ask(user_pk, lambda: _may_still_read(user_pk)):
                        await self.close(code=FORBIDDEN)
                        return
                    next_access = time.monotonic() + ACCESS_SECONDS
                now = await self.mark()
                if now is not None and now["seq"] != seen:
                    seen = now["seq"]
                    await self.run_commit({"run_id": getattr(self, "run_id", None), **now})

        self.watcher = asyncio.create_task(loop())

    async def _authorised(self) -> bool:
        if not await _may_read(self.scope.get("user")):
            await self.close()  # before accept: the upgrade is refused with 403
            return False
        bind_to_running_loop()  # this process's live sends go to the loop viewers are on
        return True

    async def disconnect(self, code: int) -> None:
        if self.viewing is not None:
            await self.viewing.stop()
        if self.watcher is not None:
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.watcher
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
        run_id = self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        if not is_id(run_id):  # names no run, and is no valid channel-layer group name
            await self.accept()
            await self.close(code=NOT_FOUND)
            return
        # Join before reading, so no commit can fall between the read and the subscription;
        # say first that this run is watched, so its deltas are published (runtime.live).
        self.viewing = Viewing(run_id)
        await self.viewing.start()
        self.group = run_group(run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        committed = await _committed(run_id)
        await self.accept()
        if committed is None:
            await self.close(code=NOT_FOUND)
            return
        stream = None
        if committed["state"] == "running":
            stream = await _stream_so_far(run_id, committed["step"])
        await self.send_json({"event": "hello", "run_id": run_id, "stream": stream, **committed})
        self.watch(committed["version"])

    async def mark(self) -> dict[str, Any] | None:
        committed = await _committed(self.run_id)
        return committed and {"seq": committed["version"], "state": committed["state"]}

    async def run_delta(self, message: dict[str, Any]) -> None:
        await self.send_json(
            {
                "event": "delta",
                "step": message.get("step"),
                "attempt": message.get("attempt"),
                "claim": message.get("claim"),
                "kind": message.get("kind"),
                "text": message.get("text", ""),
                "index": message.get("index", 0),
                "name": message.get("name"),
                "call_id": message.get("call_id"),
                "offset": message.get("offset"),
            }
        )


class RunsConsumer(_LiveConsumer):
    """``ws/runs/``: a notice for every commit, so lists refresh their rows."""

    async def connect(self) -> None:
        if not await self._authorised():
            return
        self.group = ALL_RUNS_GROUP
        await self.channel_layer.group_add(self.group, self.channel_name)
        latest = await _latest_commit_id()
        await self.accept()
        await self.send_json({"event": "hello"})
        self.watch(latest)

    async def mark(self) -> dict[str, Any] | None:
        latest = await _latest_commit_id()
        return None if latest is None else {"seq": latest, "state": None}
