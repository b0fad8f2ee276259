"""Best-effort live fan-out over the Channels layer: unconfirmed Deltas and commit notices.

Nothing sent here is thread truth. A send that fails is logged and dropped; it never fails a
Run. Groups: ``live_run_<run id>`` (deltas and commits of one run), ``live_runs`` (every
commit, for the runs list). Message types: ``run.delta`` and ``run.commit``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from typing import Any

from channels.layers import get_channel_layer
from django.conf import settings

from runtime.signals import CommitNotice

log = logging.getLogger("runtime.live")

ALL_RUNS_GROUP = "live_runs"


def run_group(run_id: str) -> str:
    return f"live_run_{run_id}"


class _Publisher:
    """Hands messages to one event loop that sends them in order, so a commit or a Delta
    never waits on the channel layer.

    The loop is the one that serves live viewers when this process has them (``bind``,
    called by the consumers: the in-memory layer only works within one loop), else a private
    loop on a daemon thread (a worker process publishing through Redis). With the in-memory
    layer and no viewer bound yet nothing is sent: no one could receive it (this spares every
    commit of a worker process without Redis the hand-over). A drain task runs only while
    messages wait, so a loop can close with nothing of ours pending.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.pending: deque[tuple[str, dict[str, Any]]] = deque()
        self.drainer: asyncio.Task[None] | None = None

    def bind(self) -> None:
        """Send from the running loop from now on (call it on the loop viewers live on)."""
        loop = asyncio.get_running_loop()
        with self.lock:
            self.loop = loop

    def _start_private_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="live-publisher", daemon=True).start()
        return loop

    def _enqueue(self, item: tuple[str, dict[str, Any]]) -> None:  # runs on the loop
        self.pending.append(item)
        if self.drainer is None or self.drainer.done():
            self.drainer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        """Send what waits: each group's messages in order, the groups at once (a worker
        streams hundreds of runs: one round trip to Redis per message in turn fell seconds
        behind them)."""
        while self.pending:
            by_group: dict[str, list[dict[str, Any]]] = {}
            while self.pending:
                group, message = self.pending.popleft()
                queued = by_group.setdefault(group, [])
                if queued and _continues(queued[-1], message):
                    queued[-1] = {**queued[-1], "text": queued[-1]["text"] + message["text"]}
                else:
                    queued.append(message)
            await asyncio.gather(*(self._send_all(g, m) for g, m in by_group.items()))

    async def _send_all(self, group: str, messages: list[dict[str, Any]]) -> None:
        layer = get_channel_layer()
        for message in messages:
            try:
                if layer is not None:
                    await layer.group_send(group, message)
            except Exception:  # the live stream is best-effort by design
                log.warning("live send to %s failed", group, exc_info=True)

    def send(self, group: str, message: dict[str, Any]) -> None:
        with self.lock:
            if self.loop is None and _in_process_layer():
                return  # an in-memory layer reaches only viewers of this process: none yet
            if self.loop is None or self.loop.is_closed():
                self.loop = self._start_private_loop()
            loop = self.loop
        try:
            loop.call_soon_threadsafe(self._enqueue, (group, message))
        except RuntimeError:  # the loop closed between the check and the call
            log.warning("live send to %s dropped: its loop is closed", group)


DELTA_KEY = ("type", "run_id", "step", "attempt", "claim", "kind", "index")


def _continues(earlier: dict[str, Any], later: dict[str, Any]) -> bool:
    """Whether ``later`` is a Delta that only adds text to ``earlier``'s (same run, step,
    attempt, claim, kind and call): while the sends fall behind, such Deltas go as one, so a
    worker streaming hundreds of runs sends fewer, longer messages, never other text."""
    return (
        later.get("type") == "run.delta"
        and not any(m.get(k) for m in (earlier, later) for k in ("name", "call_id"))
        and all(earlier.get(key) == later.get(key) for key in DELTA_KEY)
    )


def _in_process_layer() -> bool:
    """True when the channel layer is the in-memory one (settings.CHANNEL_LAYERS), which
    carries messages only within this process."""
    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    return backend.endswith("InMemoryChannelLayer")


_publisher = _Publisher()
bind_to_running_loop = _publisher.bind
_send = _publisher.send


def publish_delta(
    run_id: str, *, step: int, attempt: int, delta: dict[str, Any], claim: int | None = None
) -> None:
    """Send one unconfirmed Delta: {"kind", "text", "index", "name", "call_id"}.

    ``step`` and ``attempt`` say which inference it belongs to; ``claim`` is the lease epoch
    of the worker streaming it, so a viewer starts afresh when another worker takes the
    same step over (its text never continues the dead worker's).
    """
    _send(
        run_group(run_id),
        {
            "type": "run.delta",
            "run_id": run_id,
            "step": step,
            "attempt": attempt,
            "claim": claim,
            **delta,
        },
    )


def publish_commit(notice: CommitNotice) -> None:
    """Tell live viewers a commit landed, so they refresh committed state from the server."""
    message = {
        "type": "run.commit",
        "run_id": notice.run_id,
        "thread_id": notice.thread_id,
        "seq": notice.seq,
        "state": notice.state,
    }
    if notice.run_id:
        _send(run_group(notice.run_id), message)
    _send(ALL_RUNS_GROUP, message)
