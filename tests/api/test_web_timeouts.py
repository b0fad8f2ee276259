"""A web request never waits on the database without bound (issue 28, item 4).

PostgreSQL: another connection holds a lock on ``runtime_run`` (an open transaction, as a
long migration or a stuck session holds one); requests answer within the web request's lock
or statement timeout with the documented 503 naming which ran out, ``/readyz`` says the runs'
table is locked within a second (as it says the pool is exhausted), and the connection's
bounds are reset after each request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from django.test import Client

from console import timeouts
from tests.api.conftest import error_of
from tests.subprocesses import subprocess_database_url

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's timeouts"),
]

SLACK = 4  # seconds a loaded machine may add to a bound
HOLD = 20  # seconds the other transaction would hold its lock if nothing ended it


@contextmanager
def runs_locked(mode: str = "ACCESS EXCLUSIVE") -> Iterator[None]:
    """Hold ``mode`` on runtime_run from another connection, in a transaction that the
    server ends after HOLD seconds idle (``idle_in_transaction_session_timeout``) if the block
    has not ended it first."""
    import psycopg

    holder = psycopg.connect(subprocess_database_url())
    try:
        holder.execute(f"SET idle_in_transaction_session_timeout = {HOLD * 1000}")
        holder.execute(f"LOCK TABLE runtime_run IN {mode} MODE")
        yield
    finally:
        holder.rollback()
        holder.close()


def timed(call) -> tuple[object, float]:
    started = time.monotonic()
    response = call()
    return response, time.monotonic() - started


def assert_timed_out(response, which: str) -> None:
    assert response.status_code == 503, response.content
    error = error_of(response)
    assert error["code"] == "database_unavailable"
    assert error["detail"] == {"timeout": which}
    assert which in error["message"]
    assert int(response["Retry-After"]) > 0


def test_reads_under_a_held_lock_answer_503_within_the_lock_timeout(api, start, settings):
    settings.RUNTIME_WEB_LOCK_TIMEOUT_SECONDS = 0.5
    run = start({"text": "ok"})
    with runs_locked():
        for path in ("/runs", f"/runs/{run['id']}", "/runs?q=go"):
            response, took = timed(lambda p=path: api.get(p))
            assert_timed_out(response, "lock")
            assert took < 0.5 + SLACK, (path, took)
    assert api.get(f"/runs/{run['id']}").status_code == 200  # served at once after


READYZ_WITHIN = 1.0  # seconds /readyz answers in, whatever the database does (issue 31)
READYZ_SLACK = 0.5  # what a loaded machine may add to it


@pytest.mark.parametrize("mode", ["ACCESS EXCLUSIVE", "SHARE ROW EXCLUSIVE"])
def test_readyz_names_a_held_lock_on_the_runs_within_a_second(mode):
    """A lock that holds every request back (ACCESS EXCLUSIVE) or only writes (SHARE ROW
    EXCLUSIVE: reads go through, every commit waits): /readyz answers 503 naming the runs'
    table within a second, with the web request's default bounds (a 2 s lock timeout)."""
    with runs_locked(mode):
        ready, took = timed(lambda: Client().get("/readyz"))
    assert took < READYZ_WITHIN + READYZ_SLACK, (took, ready.json())
    assert ready.status_code == 503, ready.json()
    checks = ready.json()["checks"]
    assert checks["runs_table"].startswith("locked: "), checks
    assert "runtime_run" in checks["runs_table"]
    assert (checks["database"], checks["pool"], checks["migrations"]) == ("ok", "ok", "ok")
    assert Client().get("/readyz").json()["checks"]["runs_table"] == "ok"  # once it is gone


def test_the_probe_without_a_pool_names_a_held_lock_and_leaves_no_bound_behind():
    """RUNTIME_DB_POOL_SIZE=0: the probe runs on the request's own connection, its bounds
    local to a transaction it rolls back."""
    from console import health

    found = {"database": "ok", "pool": "ok", "runs_table": "ok"}
    with runs_locked():
        _, took = timed(lambda: health._probe_unpooled(connection, found))
    assert found["runs_table"].startswith("locked: "), found
    assert took < READYZ_WITHIN + READYZ_SLACK, took
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"


def test_readyz_names_an_exhausted_pool_within_a_second():
    """Every pooled connection lent (a request thread, as a server's, holds none yet): /readyz
    answers 503 naming the pool's state within a second, not after the pool's timeout twice."""
    connection.close()  # this thread's own connection goes back to the pool
    pool = connection.pool
    if pool is None:
        pytest.skip("RUNTIME_DB_POOL_SIZE=0: no pool")
    pool.open(wait=True)
    lent = []
    try:
        while len(lent) < pool.max_size:
            lent.append(pool.getconn(timeout=10))
        ready, took = timed(lambda: Client().get("/readyz"))
    finally:
        for conn in lent:
            pool.putconn(conn)
    assert took < READYZ_WITHIN + READYZ_SLACK, (took, ready.json())
    assert ready.status_code == 503, ready.json()
    checks = ready.json()["checks"]
    assert checks["pool"].startswith(f"exhausted: {pool.max_size} of {pool.max_size}"), checks
    assert checks["database"].startswith("not checked"), checks
    assert Client().get("/readyz").status_code == 200


def test_writes_under_a_held_lock_answer_503_within_the_statement_timeout(api, start, settings):
    settings.RUNTIME_WEB_LOCK_TIMEOUT_SECONDS = 0  # off: the statement timeout bounds the wait
    settings.RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS = 0.5
    run = start({"text": "ok"})
    with runs_locked("SHARE ROW EXCLUSIVE"):  # reads go through, writes wait
        assert api.get(f"/runs/{run['id']}").status_code == 200
        response, took = timed(lambda: api.post(f"/runs/{run['id']}/cancel", {"reason": "x"}))
        assert_timed_out(response, "statement")
        assert took < 0.5 + SLACK


def test_the_bounds_are_reset_after_each_request(api):
    assert api.get("/runs").status_code == 200
    assert Client().get("/readyz").status_code == 200  # its probe's bounds are its own
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"
        cursor.execute("SHOW statement_timeout")
        assert cursor.fetchone()[0] == "0"


def test_requests_leave_no_execute_wrapper_behind(api):
    """On a thread of its own (its own connection, as a server's request thread has), each
    request opens the connection, which then gets the runtime's own wrapper (runtime.apps:
    replan_stale); the middleware's wrapper goes all the same. It once stayed, one more per
    request, until a statement recursed through them past Python's limit (the chaos run's
    every request a 500)."""
    left: list[int] = []  # the middleware's wrappers left on the connection after each request

    def requests() -> None:
        try:
            for _ in range(3):
                assert api.get("/runs").status_code == 200
                left.append(
                    sum(isinstance(w, timeouts._Bounds) for w in connection.execute_wrappers)
                )
        finally:
            connection.close()

    thread = threading.Thread(target=requests)
    thread.start()
    thread.join(30)
    assert left == [0, 0, 0]


def test_bounds_sql_follows_the_settings(settings):
    settings.RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS = 1.5
    settings.RUNTIME_WEB_LOCK_TIMEOUT_SECONDS = 0.25
    assert timeouts.bounds_sql() == "SET statement_timeout = 1500; SET lock_timeout = 250"
    settings.RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS = 0
    settings.RUNTIME_WEB_LOCK_TIMEOUT_SECONDS = 0
    assert timeouts.bounds_sql() is None


def test_a_bound_out_of_range_is_a_system_check_error(settings):
    from runtime import conf

    settings.RUNTIME_WEB_LOCK_TIMEOUT_SECONDS = -1
    assert any("RUNTIME_WEB_LOCK_TIMEOUT_SECONDS" in p for p in conf.number_problems())
