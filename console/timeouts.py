"""Bounds on a web request's wait for the database (issue 28, item 4).

On PostgreSQL each request runs under ``statement_timeout`` and ``lock_timeout``
(RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS, default 10 s; RUNTIME_WEB_LOCK_TIMEOUT_SECONDS,
default 2 s; 0 turns one off): set on the request's connection when the request starts and
reset when it ends, so a pooled connection lent next to a worker (``runtime_serve``'s
in-process worker) or a management command carries its own bounds, not the web's. A statement
cancelled so is answered as the 503 of console.unavailable / the API (``database_unavailable``
with ``detail.timeout``: "statement" or "lock"). SQLite has no such settings: its busy timeout
(the database settings' ``timeout``) bounds a wait for its write lock.

Per request rather than per connection (``OPTIONS``): the pool's connections are shared with
the in-process worker, and a session setting made at connect time would bound it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse

from runtime import conf, db

log = logging.getLogger("console")


def bounds_sql() -> str | None:
    """The ``SET`` statements of the configured bounds, or None when both are off."""
    statement = round(conf.web_statement_timeout() * 1000)
    lock = round(conf.web_lock_timeout() * 1000)
    if not statement and not lock:
        return None
    # Whole milliseconds from bounded numbers (runtime.conf): no quoting is needed.
    return f"SET statement_timeout = {statement}; SET lock_timeout = {lock}"


RESET_SQL = "RESET statement_timeout; RESET lock_timeout"


def web_timeouts(get_response: Callable[[HttpRequest], HttpResponse]) -> Callable:
    """Middleware: run the request under the bounds of ``bounds_sql`` on PostgreSQL, and
    reset them on its connection at the end (also when the view raised).

    The bounds are set just before the request's first statement (``_Bounds``), not when it
    starts: a request that reads nothing (the OpenAPI document, a health probe answered from
    memory) opens no connection for them."""

    def middleware(request: HttpRequest) -> HttpResponse:
        wrapper = db.wrapper()
        bounds = bounds_sql() if wrapper.vendor == "postgresql" else None
        if bounds is None:
            return get_response(request)
        bounded = _Bounds(bounds)
        # Not ``with wrapper.execute_wrapper(...)``: it pops the last wrapper, and a connection
        # opened during the request appends its own (runtime.apps: replan_stale), so ours
        # stayed behind, one more on each request, until a statement recursed past the limit.
        wrapper.execute_wrappers.append(bounded)
        try:
            return get_response(request)
        finally:
            wrapper.execute_wrappers.remove(bounded)
            if bounded.connection is not None:
                _reset(wrapper)

    return middleware


class _Bounds:
    """An execute wrapper (Django's ``connection.execute_wrapper``) that sends ``sql`` once
    on each raw connection the request uses, before that connection's first statement.

    The ``SET`` is session-wide, so it holds for the rest of the request, unless the first
    statement is in a transaction that rolls back (PostgreSQL undoes a ``SET`` with it): the
    request's later statements then run unbounded, which only a request that already failed
    can meet."""

    def __init__(self, sql: str) -> None:
        self.sql = sql
        self.connection: object | None = None  # the raw connection the bounds are set on

    def __call__(self, execute, sql, params, many, context):
        wrapper = context["connection"]
        if wrapper.connection is not self.connection:
            self.connection = wrapper.connection
            with wrapper.cursor() as cursor:  # goes through this wrapper: already marked set
                cursor.execute(self.sql)
        return execute(sql, params, many, context)


def _reset(wrapper) -> None:
    """Reset the bounds on ``wrapper``'s connection if it still has one; a connection that
    cannot take the reset is closed instead, so that no one else is lent it as it is."""
    if wrapper.connection is None:
        return
    try:
        with wrapper.cursor() as cursor:
            cursor.execute(RESET_SQL)
    except DatabaseError as exc:
        log.warning("could not reset a web request's database timeouts: %s", exc)
        raw = wrapper.connection
        wrapper.close()
        raw.close()  # the pooled connection itself: the pool discards a closed connection
