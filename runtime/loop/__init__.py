"""The step loop: drives one claimed Run from its committed frontier until it waits or ends.

Split along the seed's own sequence: ``infer`` (one inference and its commit), ``gate`` (the
gates of a Requested call, decided as a value), ``execute`` (Executing, the effect, and the
pinned recovery policy), with ``driver`` holding the committed frontier, the staged results and
the loop. The steps see the run only through ``boundary.Boundary``. Commit points, in order
(DESIGN.md "One Step"): the assistant message with the whole batch as Requested before
anything executes; per call, Executing or Awaiting before the effect or the wait; the terminal
result; then the batch's results in the model's call order.

A driver is a coroutine: while its run waits on the model, an ``async def`` tool or a pause it
holds no thread and no database connection (DESIGN.md "Waiting costs nothing"); its
statements and its ``def`` tools run on the worker's bounded thread pools (``Services``).
"""

from __future__ import annotations

import asyncio

from asgiref.sync import async_to_sync

from runtime import logs, tracing
from runtime.coordinator import Lease
from runtime.domain.model import RunView
from runtime.loop.boundary import Abandon, Boundary, ModelUnavailable, Services, WaitForLimit
from runtime.loop.driver import Frontier, RunDriver
from runtime.loop.threads import ThreadPool

__all__ = [
    "Abandon",
    "Boundary",
    "Frontier",
    "RunDriver",
    "Services",
    "ThreadPool",
    "ModelUnavailable",
    "WaitForLimit",
    "drive",
    "drive_inline",
]


async def drive(
    run_id: str,
    *,
    lease: Lease,
    services: Services,
    halt: asyncio.Event | None = None,
    release: asyncio.Event | None = None,
    pause: asyncio.Event | None = None,
    frontier: Frontier | None = None,
) -> RunView | None:
    """Drive ``run_id`` from its committed frontier (see RunDriver); return the committed
    RunView it left the run in."""
    with logs.context(run_id=run_id, worker_id=lease.worker_id):
        if tracing.enabled():
            await services.db(tracing.mark_traced, run_id)
        with tracing.driving(run_id, lease.worker_id):
            return await RunDriver(
                run_id,
                lease=lease,
                services=services,
                halt=halt,
                release=release,
                pause=pause,
                frontier=frontier,
            ).drive()


def drive_inline(run_id: str, *, lease: Lease, frontier: Frontier | None = None) -> RunView | None:
    """``drive`` from a synchronous caller (a test, a one-off command): the run's statements
    run on the calling thread, its ``def`` tools on a thread of their own for this call."""
    tools = ThreadPool(1, "tools")
    services = Services.inline(tools)
    try:
        return async_to_sync(drive)(run_id, lease=lease, services=services, frontier=frontier)
    finally:
        async_to_sync(services.providers.close)()
        tools.close()
