"""Real database faults for tests: a database that holds a request's statements past a timeout.

``locked_database`` takes locks from a second connection of its own, as a long migration or a
stuck transaction does, and makes this thread's connection give up waiting after a short
timeout, as a production statement or lock timeout (or SQLite's busy timeout) does. Nothing is
simulated: the request's query really waits and really is cancelled by the database.
``end_other_sessions`` (PostgreSQL) ends every other session of the test database, as a restart
or a failover does; ``database_refusing_connections`` also refuses new ones meanwhile.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import OperationalError, connection, transaction

from tests.subprocesses import subprocess_database_url

# The tables every run request reads or writes; locked, they stop reads too on PostgreSQL.
RUNTIME_TABLES = ("runtime_thread", "runtime_run", "runtime_threadcommit", "runtime_ticket")


@contextmanager
def locked_database(timeout_ms: int = 200) -> Iterator[None]:
    """Hold the database's locks from another connection for the block, and make this
    thread's connection give up on a lock after ``timeout_ms``.

    PostgreSQL: ACCESS EXCLUSIVE locks on RUNTIME_TABLES (reads and writes of them wait) and
    ``lock_timeout``. SQLite: the write lock (``BEGIN IMMEDIATE``; under WAL only writers
    wait) and ``busy_timeout``. Both are restored at the end.
    """
    connection.ensure_connection()
    if connection.vendor == "postgresql":
        import psycopg

        holder = psycopg.connect(subprocess_database_url())
        try:
            holder.execute(f"LOCK TABLE {', '.join(RUNTIME_TABLES)} IN ACCESS EXCLUSIVE MODE")
            with connection.cursor() as cursor:
                cursor.execute(f"SET lock_timeout = {int(timeout_ms)}")
            try:
                yield
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
        finally:
            holder.rollback()
            holder.close()
        return
    busy_ms = int(connection.settings_dict["OPTIONS"]["timeout"] * 1000)  # settings' timeout
    writer = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {int(timeout_ms)}")
        try:
            yield
        finally:
            with connection.cursor() as cursor:
                cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
    finally:
        writer.rollback()
        writer.close()


def _kept_session() -> int:
    """This thread's PostgreSQL session (its backend pid), which the faults leave alone."""
    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        (pid,) = cursor.fetchone()
    return pid


def _admin() -> tuple[Any, str]:
    """An autocommit connection to the server's maintenance database (a database cannot close
    itself to connections), and the test database's name."""
    import psycopg

    url = subprocess_database_url()
    name = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
    return psycopg.connect(url, dbname="postgres", autocommit=True), name


def other_sessions() -> int:
    """PostgreSQL: how many sessions the test database has besides this thread's."""
    kept = _kept_session()
    admin, name = _admin()
    with admin:
        query = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> %s"
        return admin.execute(query, [name, kept]).fetchone()[0]


def end_other_sessions() -> None:
    """PostgreSQL: end every session of the test database but this thread's
    (``pg_terminate_backend``), as a restart or a failover does."""
    kept = _kept_session()
    admin, name = _admin()
    with admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> %s",
            [name, kept],
        )


@contextmanager
def database_refusing_connections() -> Iterator[None]:
    """PostgreSQL only: for the block, the test database accepts no new connection and every
    other session on it is ended; this thread's connection is kept. Connections are accepted
    again at the end."""
    from psycopg import sql

    admin, name = _admin()
    with admin:
        database = sql.Identifier(name)
        admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(database))
        try:
            end_other_sessions()
            yield
        finally:
            admin.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(database))


@contextmanager
def failing_reads_of(table: str, timeout_ms: int = 200) -> Iterator[None]:
    """Make this thread's reads of ``table`` fail for the block, while its other statements
    (a command's commit) go through: what a connection lost, or a statement cancelled, between
    a command's commit and the read of its answer looks like.

    PostgreSQL: a real fault (another connection holds ACCESS EXCLUSIVE on ``table``, and
    ``lock_timeout`` cancels the read). SQLite locks the whole file, never one table, so the
    read is refused by an execute wrapper with the OperationalError a locked file gives.
    """
    if connection.vendor == "postgresql":
        import psycopg

        connection.ensure_connection()
        with psycopg.connect(subprocess_database_url()) as holder:
            holder.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            with connection.cursor() as cursor:
                cursor.execute(f"SET lock_timeout = {int(timeout_ms)}")
            try:
                yield
            finally:
                with connection.cursor() as cursor:
                    cursor.execute("RESET lock_timeout")
                holder.rollback()
        return

    def refuse(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().upper().startswith("SELECT") and f'"{table}"' in sql:
            raise sqlite3.OperationalError("database is locked")
        return execute(sql, params, many, context)

    with connection.execute_wrapper(refuse):
        yield


@contextmanager
def connection_lost_after_commit(table: str) -> Iterator[list[int]]:
    """Lose this thread's connection right after the commit of the first write of the block
    that inserts into ``table``: the commit is durable, and the request that made it
    fails with an OperationalError, as when the network or the server goes away between the
    commit and the answer. Yields a list that holds 1 once the fault struck.

    PostgreSQL: a real fault (the session's backend is ended with ``pg_terminate_backend``,
    and the next statement finds its connection gone). SQLite has no server to lose: the
    OperationalError of a lost connection is raised after the commit instead.
    """
    struck: list[int] = []
    armed: list[int] = []
    quoted = connection.ops.quote_name(table)

    def lose() -> None:
        struck.append(1)
        if connection.vendor != "postgresql":
            raise OperationalError("the connection was lost after the commit")
        pid = _kept_session()
        admin, _ = _admin()
        with admin:
            admin.execute("SELECT pg_terminate_backend(%s)", [pid])
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # the server closed the connection
        raise AssertionError("the terminated session answered")

    def watch(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if not armed and f"INSERT INTO {quoted}" in sql:
            armed.append(1)
            transaction.on_commit(lose)  # at once, outside a transaction: after its autocommit
        return result

    with connection.execute_wrapper(watch):
        yield struck
