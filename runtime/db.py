"""Database connections and the one clock of leases.

A worker keeps its connections for its whole life (one per thread): no connection is opened
per claim, commit or tool call. ``keep_usable`` closes a connection only when it broke, so the
next query reconnects. Leases are stamped and judged by the database's clock on PostgreSQL
(``now()``), never by a worker's own clock (issue: "a worker's clock decides its leases"); on
SQLite every process is on the one machine that holds the file, so its clock is that clock.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import (
    InterfaceError,
    NotSupportedError,
    OperationalError,
    connections,
    transaction,
)
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Expression, Value
from django.db.models.functions import Now
from django.utils import timezone

from runtime import conf

# The apps whose tables live on the runtime's database (RUNTIME_DATABASE).
RUNTIME_APPS = frozenset({"runtime", "runtime_demo"})


def alias() -> str:
    """The runtime's database alias (RUNTIME_DATABASE, default "default")."""
    return conf.database()


class _RuntimeConnection:
    """This thread's connection to the runtime's database (``connections[alias()]``), looked
    up on each use as ``django.db.connection`` is for the default alias."""

    def __getattr__(self, item: str) -> Any:
        return getattr(connections[alias()], item)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(connections[alias()], name, value)


connection: Any = _RuntimeConnection()


def wrapper() -> Any:
    """This thread's connection to the runtime's database itself (a DatabaseWrapper)."""
    return connections[alias()]


def atomic(savepoint: bool = True, durable: bool = False) -> Any:
    """``transaction.atomic`` on the runtime's database."""
    return transaction.atomic(using=alias(), savepoint=savepoint, durable=durable)


class Router:
    """Routes the runtime's models (RUNTIME_APPS) to RUNTIME_DATABASE: reads, writes and
    migrations. Needed in DATABASE_ROUTERS only when RUNTIME_DATABASE is not "default" (the
    runtime.E005 check says so); it has no opinion on any other app's models."""

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return alias() if model._meta.app_label in RUNTIME_APPS else None

    db_for_write = db_for_read

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        return None

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool | None:
        if app_label in RUNTIME_APPS:
            return db == alias()
        return None


def unapplied_migrations() -> list[str]:
    """The migrations the runtime's database lacks, in the order ``migrate`` applies them
    (``app_label.name``); raises DatabaseError when the database does not answer."""
    executor = MigrationExecutor(connections[alias()])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]


def keep_usable() -> None:
    """Close this thread's connection if an error left it unusable; keep it otherwise."""
    if connection.connection is not None and connection.errors_occurred:
        if not connection.is_usable():
            connection.close()
        else:
            connection.errors_occurred = False


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not serve now, so that the same request may
    succeed when tried again: it could not be reached or no pooled connection came in time
    (psycopg_pool's PoolTimeout), a statement or lock timeout cancelled the query, the
    connection was lost or closed, SQLite's file stayed locked. Django raises all of them as
    OperationalError or InterfaceError; constraint and data errors are the request's own."""
    return isinstance(exc, OperationalError | InterfaceError)


# PostgreSQL's SQLSTATEs of a statement cancelled by a timeout: query_canceled (also a
# cancel by request, told apart by its message) and lock_not_available.
TIMEOUT_STATES = {"57014": "statement", "55P03": "lock"}


def timed_out(exc: BaseException) -> str | None:
    """Which timeout cancelled the statement that raised ``exc``: "statement" (PostgreSQL's
    ``statement_timeout``), "lock" (``lock_timeout``), or None for any other fault."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    which = TIMEOUT_STATES.get(getattr(cause, "sqlstate", None) or "")
    if which == "statement" and "statement timeout" not in str(cause):
        return None  # cancelled by pg_cancel_backend or a shutdown, not by the timeout
    return which


STALE_PLAN = "cached plan must not change result type"


def replan_stale(execute, sql, params, many, context):
    """An ``execute_wrapper`` for PostgreSQL: retry a statement once, after dropping the
    connection's prepared statements, when PostgreSQL refused it because a migration changed
    the type of a column it returns since it was prepared (``RUNTIME_DB_PREPARE``).

    Only outside a transaction: inside one the error aborts it, and the rollback drops the
    prepared statements for the next one (psycopg clears its cache on rollback). Returns what
    ``execute`` returns; raises what it raises otherwise.
    """
    try:
        return execute(sql, params, many, context)
    except NotSupportedError as exc:
        wrapper = context["connection"]
        if STALE_PLAN not in str(exc) or not wrapper.get_autocommit():
            raise
        # Sent through psycopg, so that it forgets its own names of them too.
        wrapper.connection.execute("DEALLOCATE ALL")
        return execute(sql, params, many, context)


def check_idle_together(wrapper: Any) -> None:
    """Make the connection pool of ``wrapper`` (a Django connection; PostgreSQL's pool, if
    it has one) test every idle connection as soon as one it was about to lend is dead.

    psycopg_pool tests a connection before lending it and, when the test fails, tries the
    next one after a delay that doubles each time (0, 1, 2, 4 s, ...). After a restart, a
    failover or sessions ended by ``pg_terminate_backend`` every idle connection is dead
    together, and a request walked them until its wait ran out, with the database up (issue
    21: 500s after 30 s). Testing them all at the first failure (the pool's own ``check()``)
    drops the dead ones at once, so the next try gets a live or a new connection. The pool
    keeps its test as ``_check`` and has no other hook before a lend, and Django passes its
    own test when it makes the pool, so the test is wrapped here, once per pool.
    """
    pool: Any = getattr(wrapper, "pool", None)
    test = getattr(pool, "_check", None)
    if test is None or getattr(test, "checks_idle_together", False):
        return

    def test_then_check_idle(conn: Any) -> None:
        try:
            test(conn)
        except Exception:
            pool.check()
            raise

    test_then_check_idle.checks_idle_together = True  # type: ignore[attr-defined]
    pool._check = test_then_check_idle


def reserve_connections(count: int) -> None:
    """Make room in this process's connection pool for ``count`` more threads that keep a
    connection for their whole life (a worker's), so they neither wait for the connections
    that requests borrow nor leave requests waiting. Without a pool (SQLite, or
    RUNTIME_DB_POOL_SIZE=0) there is nothing to do."""
    if (pool := _pool()) is not None:
        pool.resize(pool.min_size, pool.max_size + count)


def size_pool(count: int) -> None:
    """Size this process's connection pool to exactly ``count`` connections, for a process
    whose only users of the database are ``count`` threads that keep one each for their
    whole life (a worker process): it never opens one more. Without a pool (SQLite, or
    RUNTIME_DB_POOL_SIZE=0) each of those threads opens its own."""
    if (pool := _pool()) is not None:
        pool.resize(min(pool.min_size, count), count)


def open_pool() -> None:
    """Open this process's connection pool now: its ``min_size`` connections are made in the
    background, so the first requests after a start (every client reconnecting at once) do
    not wait for connections that the pool, once short, makes one at a time."""
    if (pool := _pool()) is not None:
        pool.open()


def _pool() -> Any:
    """This process's psycopg_pool ConnectionPool of the runtime's database, or None (SQLite,
    RUNTIME_DB_POOL_SIZE=0)."""
    return getattr(connections[alias()], "pool", None)


def db_now() -> Expression:
    """The current time as the database sees it (a query expression)."""
    if connection.vendor == "postgresql":
        return Now()
    return Value(timezone.now())


def db_later(delta: timedelta) -> Expression:
    """``db_now() + delta``, as a query expression."""
    if connection.vendor == "postgresql":
        return Now() + Value(delta)
    return Value(timezone.now() + delta)
