"""The tool thread: where a worker loop runs tool calls, one at a time, on a kept connection.

A driver waits on the call and may stop waiting (abandon) when the worker stops or the run is
ended or taken over meanwhile. An abandoned call keeps running on its thread, which retires
after it, while a fresh thread serves the loop's next call at once: a cancelled call never
holds up the next run's tool (issue: "a cancelled call keeps the worker busy").
"""

from __future__ import annotations

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


def _serve(jobs: queue.SimpleQueue[Job | None]) -> None:
    try:
        while (item := jobs.get()) is not None:
            job, future = item
            keep_usable()
            try:
                future.set_result(job())
            except BaseException as exc:
                future.set_exception(exc)
    finally:
        connections.close_all()


class ToolThread:
    """A daemon thread running submitted jobs in order; being a daemon, a call still in flight
    never holds the process up."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        threading.Thread(target=_serve, args=(self.jobs,), name="tools", daemon=True).start()

    def submit(self, job: Callable[[], Any]) -> Future[Any]:
        """Queue ``job``; its future holds what it returns or raises."""
        future: Future[Any] = Future()
        # The job runs in this caller's context: its log fields and its trace span.
        self.jobs.put((partial(contextvars.copy_context().run, job), future))
        return future

    def abandon(self) -> None:
        """Stop waiting for the job in flight: its thread ends after it, a new one serves."""
        self.jobs.put(None)
        self._start()

    def close(self) -> None:
        """Let the thread end (after any call still in flight) and close its connection."""
        self.jobs.put(None)
