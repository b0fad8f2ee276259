"""Database reads of long-lived connections (SSE streams, WebSockets), off the event loop.

Reads that open streams repeat every second run neither on the event loop nor on a request's
thread (a stream's request lasts as long as the stream): they run on the loop's thread pool,
and each gives its connection back afterwards, as a request does at its end (to the pool on
PostgreSQL, closed on SQLite), so no stream holds a connection between reads (issue 12,
item 8). Questions that many streams ask alike (may this token still read?) are answered
once for all of them (``SharedAnswers``).
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from collections.abc import Awaitable, Callable, Hashable

from asgiref.sync import sync_to_async
from django.db import connection


def off_loop[**P, R](read: Callable[P, R]) -> Callable[P, Awaitable[R]]:
    """Wrap a sync read as a coroutine function run on the thread pool; the connection the
    read used is given back (closed, or returned to the pool) when it returns or raises."""

    def read_and_close(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return read(*args, **kwargs)
        finally:
            connection.close()

    return sync_to_async(functools.wraps(read)(read_and_close), thread_sensitive=False)


# How often an open stream or socket asks whether its reader may still read, and how old a
# shared answer may be: a revoked token's streams and a removed viewer's sockets end within 3 s.
ACCESS_SECONDS = 2.0
ACCESS_FRESH = 1.0


class SharedAnswers:
    """One answer per question for every stream of a process that asks it within ``fresh``
    seconds: 50 streams of one token re-checking their access every 2 s cost one read per
    ``fresh`` seconds, not 25 reads a second (issue 12, item 8).

    ``ask(key, check)`` returns the answer of ``await check()`` started at most ``fresh``
    seconds ago for the same ``key`` (a check still running is awaited, not repeated); a
    check that raised is not kept, so the next caller asks again. An answer is therefore
    at most ``fresh`` seconds older than the caller's question.
    """

    def __init__(self, fresh: float) -> None:
        self.fresh = fresh
        self._loops: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[Hashable, tuple[float, asyncio.Future[bool]]]
        ] = weakref.WeakKeyDictionary()

    async def ask(self, key: Hashable, check: Callable[[], Awaitable[bool]]) -> bool:
        loop = asyncio.get_running_loop()
        answers = self._loops.setdefault(loop, {})
        now = loop.time()
        kept = answers.get(key)
        if kept is None or now - kept[0] >= self.fresh or _failed(kept[1]):
            # Forget every stale answer while here, so the keys of closed streams go too.
            for old in [k for k, (at, _) in answers.items() if now - at >= self.fresh]:
                del answers[old]
            kept = answers[key] = (now, asyncio.ensure_future(check()))
        # Shielded: a stream that is closed while it waits does not cancel the others' check.
        return await asyncio.shield(kept[1])


def _failed(future: asyncio.Future[bool]) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)
