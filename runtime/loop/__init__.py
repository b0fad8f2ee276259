"""The step loop: drives one claimed Run from its committed frontier until it waits or ends.

Split along the seed's own sequence: ``infer`` (one inference and its commit), ``gate`` (the
gates of a Requested call and its waits), ``execute`` (Executing, the effect, and the pinned
recovery policy), with ``driver`` holding the committed frontier, the staged results and the
loop. Commit points, in order (DESIGN.md "One Step"): the assistant message with the whole
batch as Requested before anything executes; per call, Executing or Awaiting before the effect
or the wait; the terminal result; then the batch's results in the model's call order.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime import logs, tracing
from runtime.coordinator import Lease
from runtime.domain.model import RunView
from runtime.loop.driver import Abandon, Frontier, RunDriver
from runtime.loop.tools import ToolThread

__all__ = ["Abandon", "Frontier", "RunDriver", "ToolThread", "drive"]


def drive(
    run_id: str,
    *,
    lease: Lease,
    should_stop: Callable[[], bool],
    released: Callable[[], bool] = lambda: False,
    tools: ToolThread | None = None,
    frontier: Frontier | None = None,
) -> RunView | None:
    """Drive ``run_id`` from its committed frontier (see RunDriver); return the committed
    RunView it left the run in."""
    with (
        logs.context(run_id=run_id, worker_id=lease.worker_id),
        tracing.driving(run_id, lease.worker_id),
    ):
        return RunDriver(
            run_id,
            lease=lease,
            should_stop=should_stop,
            released=released,
            tools=tools,
            frontier=frontier,
        ).drive()
