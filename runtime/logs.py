"""Log context: which run, thread, commit, worker and request a log line is about.

Every process of the repository's project logs to stderr (its settings.LOGGING names
``ContextFilter`` and ``PlainFormatter`` by dotted path): plain lines by default, one JSON
object per line with ``LOG_FORMAT=json`` (python-json-logger). A host project adds the filter to
its own handlers to get the same fields. The context
rides in a ContextVar, so each worker thread and each request carries its own; ``ContextFilter``
copies it onto every record, where a formatter can print it. A value passed with
``extra={...}`` to one log call wins over the context.

The guarantee: a record never carries another thread's or another request's context, because a
``context()`` block restores what was there before it on exit.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from types import MappingProxyType
from typing import Any

# The fields, in the order plain lines print them.
FIELDS = ("run_id", "thread_id", "seq", "worker_id", "request_id")

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_context: ContextVar[Mapping[str, Any]] = ContextVar("runtime_log_context", default=_EMPTY)


def current() -> Mapping[str, Any]:
    """The context of this thread or task now: ``{field: value}`` for the FIELDS set."""
    return _context.get()


def bind(**fields: Any) -> None:
    """Add ``fields`` (names from FIELDS) to the current context until the enclosing
    ``context()`` block ends (or for the rest of the thread outside any block).

    Raises ValueError for a name that is not a context field.
    """
    _check(fields)
    _context.set({**_context.get(), **fields})


@contextmanager
def context(**fields: Any) -> Iterator[None]:
    """Log with ``fields`` added inside the block; the previous context comes back after it.

    Raises ValueError for a name that is not a context field.
    """
    _check(fields)
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def _check(fields: Mapping[str, Any]) -> None:
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"not log context fields: {sorted(unknown)}; known: {FIELDS}")


class ContextFilter(logging.Filter):
    """Put the current context's fields on each record (never overriding ``extra``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _context.get().items():
            if value is not None and not hasattr(record, name):
                setattr(record, name, value)
        return True


class PlainFormatter(logging.Formatter):
    """The default line: ``time LEVEL logger message`` then ``run_id=... worker_id=...``."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        pairs = [
            f"{name}={getattr(record, name)}"
            for name in FIELDS
            if getattr(record, name, None) is not None
        ]
        if not pairs:
            return line
        head, newline, rest = line.partition("\n")  # keep a traceback below the pairs
        return f"{head} [{' '.join(pairs)}]{newline}{rest}"
