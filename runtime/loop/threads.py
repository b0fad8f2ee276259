"""A bounded pool of daemon threads that an event loop hands blocking work to.

A worker keeps two: its database threads (every statement its drivers send, each thread with
the one connection it keeps, so the connections a worker holds are as many as these threads,
whatever the number of runs in flight) and its tool threads (the calls of ``def`` tools, at
most that many at once). The threads are daemons, unlike ``ThreadPoolExecutor``'s, which the
interpreter joins at exit: a sync tool abandoned in flight (its run was cancelled or taken
over, or the worker stops during a replay-safe call) must never hold the process up.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any

from django.db import connections

from runtime.db import keep_usable

Job = tuple[Callable[[], Any], Future[Any]]


class ThreadPool:
    """``size`` daemon threads taking jobs in arrival order; each keeps its own database
    connection between jobs and closes it when the pool closes."""

    def __init__(self, size: int, name: str) -> None:
        if size < 1:
            raise ValueError(f"a thread pool needs at least one thread, got {size}")
        self.size = size
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.threads = [
            threading.Thread(target=self._serve, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for thread in self.threads:
            thread.start()

    def _serve(self) -> None:
        try:
            while (item := self.jobs.get()) is not None:
                job, future = item
                if not future.set_running_or_notify_cancel():
                    continue
                keep_usable()
                try:
                    future.set_result(job())
                except BaseException as exc:
                    future.set_exception(exc)
        finally:
            connections.close_all()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        """Queue ``fn(*args, **kwargs)`` in the caller's context (its log fields, its trace
        span, the driver's staging); return its concurrent future."""
        future: Future[Any] = Future()
        job = partial(contextvars.copy_context().run, fn, *args, **kwargs)
        self.jobs.put((job, future))
        return future

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on a thread of the pool; return what it returns, raise
        what it raises. Cancelling the await leaves a job already running to finish."""
        return await asyncio.wrap_future(self.submit(fn, *args, **kwargs))

    def close(self) -> None:
        """Let each thread end after the job it runs (if any); closes their connections."""
        for _ in self.threads:
            self.jobs.put(None)
