"""Database reads of long-lived connections (SSE streams, WebSockets), off the event loop.

Django runs every sync view of a process on one thread under ASGI (``thread_sensitive``);
reads that open streams repeat every second must not queue behind those views or hold them
up, so they run on the thread pool, and each closes its connection afterwards, as a request
does with CONN_MAX_AGE=0, so no connection outlives the read (issue 12, item 8).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async
from django.db import connection


def off_loop[**P, R](read: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Wrap a sync read as a coroutine function run on the thread pool; the connection the
    read used is closed when it returns or raises."""

    def read_and_close(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return read(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(functools.wraps(read)(read_and_close), thread_sensitive=False)
