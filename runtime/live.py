"""Best-effort live fan-out over the Channels layer: unconfirmed Deltas and commit notices.

Nothing sent here is thread truth. A send that fails is logged and dropped; it never fails a
Run. Groups: ``live_run_<run id>`` (deltas and commits of one run), ``live_runs`` (every
commit, for the runs list). Message types: ``run.delta`` and ``run.commit``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from runtime.signals import CommitNotice

log = logging.getLogger("runtime.live")

ALL_RUNS_GROUP = "live_runs"
_pending: set[asyncio.Task] = set()  # keeps fire-and-forget sends alive until they finish


def run_group(run_id: str) -> str:
    return f"live_run_{run_id}"


def _send(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    try:
        if loop is None:
            async_to_sync(layer.group_send)(group, message)
        else:  # called from code already on an event loop: send without blocking it
            task = loop.create_task(layer.group_send(group, message))
            _pending.add(task)
            task.add_done_callback(_pending.discard)
    except Exception:  # the live stream is best-effort by design
        log.warning("live send to %s failed", group, exc_info=True)


def publish_delta(run_id: str, *, step: int, attempt: int, delta: dict[str, Any]) -> None:
    """Send one unconfirmed Delta: {"kind", "text", "index", "name", "call_id"}."""
    _send(
        run_group(run_id),
        {"type": "run.delta", "run_id": run_id, "step": step, "attempt": attempt, **delta},
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
