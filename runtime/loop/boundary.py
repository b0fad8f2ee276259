"""What the loop's steps (``infer``, ``gate``, ``execute``) may ask of the run they act on.

The steps depend on this declared interface, never on the driver class (DESIGN.md, "Lower
layers never call up"): the driver implements it, and a step returns or commits through it.
``Services`` is what a worker lends the drivers of its runs: where blocking work runs and the
model clients they share, so that a run waiting on its model holds no thread and no database
connection of its own (DESIGN.md, "Waiting costs nothing").
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from asgiref.sync import sync_to_async

if TYPE_CHECKING:
    from runtime.coordinator import Lease
    from runtime.domain.events import CallCompleted, Event
    from runtime.domain.model import (
        Disposition,
        EndCause,
        Message,
        RunView,
        TicketKind,
        ToolCall,
    )
    from runtime.loop.threads import ThreadPool
    from runtime.providers import Providers

# Runs a blocking function (a query, a commit) off the event loop; returns what it returns.
Runner = Callable[..., Awaitable[Any]]
# Commits on the claimed run's frontier from blocking code; returns the committed RunView.
CommitParent = Callable[["Disposition", "tuple[Event, ...]"], "RunView"]


@dataclass(frozen=True, slots=True)
class Services:
    """Where a driver's blocking work runs.

    ``db(fn, *args)`` runs ``fn`` on a thread that holds a database connection (a worker's
    bounded pool; the caller's own thread in ``inline``); ``tools`` runs the calls of ``def``
    tools; ``providers`` hands out the model clients, one per agent configuration per event
    loop.
    """

    db: Runner
    tools: ThreadPool
    providers: Providers

    @classmethod
    def inline(cls, tools: ThreadPool) -> Services:
        """Services for a run driven from a synchronous caller (``Worker.step``, a test): its
        statements run on the caller's thread, inside whatever transaction it holds."""
        from runtime.providers import Providers

        return cls(db=_on_caller_thread, tools=tools, providers=Providers())


async def _on_caller_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)


async def first(work: asyncio.Future[Any], signal: Awaitable[Any]) -> bool:
    """Wait until ``work`` is done or ``signal`` returns; True when ``work`` finished first
    (``work`` is left running otherwise)."""
    stop = asyncio.ensure_future(signal)
    try:
        await asyncio.wait((work, stop), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    return work.done()


class Abandon(Exception):
    """The worker stops at this boundary; nothing uncommitted is kept but staged results."""


class WaitForLimit(Exception):  # noqa: N818 (a decision, like Abandon)
    """The run must wait for a model's budget (``runtime.limits``): the worker releases it,
    not to be claimed again for ``delay``, with ``reason`` shown meanwhile. Raised before the
    request was sent, so nothing is lost."""

    def __init__(self, delay: timedelta, reason: str) -> None:
        super().__init__(reason)
        self.delay = delay
        self.reason = reason


class ModelUnavailable(WaitForLimit):
    """The run's model kept failing retryably through the quick retries, within the outage
    horizon (RUNTIME_MODEL_OUTAGE_SECONDS): the worker releases the run to wait ``delay``,
    with ``reason`` shown, and records ``since``, when the step's model began to fail."""

    def __init__(self, delay: timedelta, reason: str, since: datetime) -> None:
        super().__init__(delay, reason)
        self.since = since


class Boundary(Protocol):
    """One claimed run as the steps see it: its committed frontier, what is staged for the
    next commit, and the commit points (DESIGN.md "One Step")."""

    run_id: str
    worker_id: str
    lease: Lease
    services: Services

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The run's metadata."""
        ...

    @property
    def run(self) -> RunView | None:
        """The committed RunView plus the results staged since."""
        ...

    def halted(self) -> bool:
        """True once the worker stops or the run was released (ended or taken over)."""
        ...

    def released(self) -> bool:
        """True once the run was ended by another writer or the lease was lost."""
        ...

    def pausing(self) -> bool:
        """True once an operator paused the run: the call in flight finishes first."""
        ...

    async def until_halted(self) -> None:
        """Return when ``halted()`` turns true."""
        ...

    async def until_released(self) -> None:
        """Return when ``released()`` turns true."""
        ...

    async def thread_messages(self) -> list[Message]:
        """The thread's committed messages."""
        ...

    def stage_result(self, event: CallCompleted, attempt: int) -> None:
        """Hold a terminal result for the next commit."""
        ...

    async def commit(
        self,
        disposition: Disposition,
        events: tuple[Event, ...] = (),
        messages: tuple[Message, ...] = (),
    ) -> RunView:
        """Commit ``events`` after every staged result; return the committed RunView."""
        ...

    async def park(
        self, call: ToolCall, kind: TicketKind, request: dict[str, Any], schema: Any
    ) -> None:
        """Commit ``call`` Awaiting on a new ResumeTicket of ``kind``."""
        ...

    async def block(self, call: ToolCall, reason: str) -> None:
        """Complete a call that never runs with an error result the model sees."""
        ...

    async def end(self, cause: EndCause, error: dict[str, Any] | None) -> None:
        """Commit the run Ended with ``cause``."""
        ...

    async def late(self, call_id: str, attempt: int, event: CallCompleted) -> None:
        """Keep a result that can no longer be committed as evidence for reconciliation."""
        ...

    async def commit_around[T](self, work: Callable[[CommitParent], T]) -> T:
        """Run the blocking ``work(commit_parent)`` where statements run; a
        ``commit_parent(disposition, events)`` it makes commits on this run's frontier inside
        ``work``'s transaction, and the driver holds what it committed once ``work``
        returns."""
        ...
