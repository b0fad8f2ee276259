"""A database that cannot serve a request is 503 with Retry-After, never a 500 (issue 21, item 1).

The faults are real: another connection holds the locks the request needs and the database
cancels the request's statement when its lock timeout (SQLite: busy timeout) runs out. Nothing
is written by a refused request, and the next request after the locks go is served at once.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from django.db import connection
from django.test import Client

from runtime.models import Run
from tests.api.conftest import BASE, error_of
from tests.faults import (
    database_refusing_connections,
    end_other_sessions,
    locked_database,
    other_sessions,
)
from tests.runtime.support import wait_for
from tests.servers import serving

pytestmark = pytest.mark.django_db(transaction=True)

SLACK = 4  # seconds a loaded machine may add to a bound
FAULTED = 120  # starts sent while sessions are ended
OUTAGE_REQUESTS = 8  # each waits the pool's 1 s: the outage outlasts 1 + 2 + 4 s of backoff
BODY = {"agent": "demo", "input": "hi", "metadata": {"script": {"steps": [{"text": "ok"}]}}}


def assert_unavailable(response) -> None:
    assert response.status_code == 503, response.content
    assert error_of(response)["code"] == "database_unavailable"
    assert int(response["Retry-After"]) > 0


def test_a_write_that_the_database_cancels_is_503_then_served_at_once(api):
    with locked_database():
        assert_unavailable(api.post("/runs", BODY))
        assert_unavailable(api.post("/threads", {}))
    assert not Run.objects.exists()  # nothing of the refused request was written
    assert api.post("/runs", BODY).status_code == 201


def test_a_read_that_the_database_cancels_is_503(api, start):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite (WAL) never holds a reader back")
    run = start({"text": "ok"})
    with locked_database():
        assert_unavailable(api.get(f"/runs/{run['id']}"))
        assert_unavailable(api.get("/runs"))
    assert api.get(f"/runs/{run['id']}").status_code == 200


@pytest.mark.slow
def test_an_unreachable_database_is_503_within_the_pool_timeout_then_served_at_once(
    make_user, subprocess_env, tmp_path
):
    """A real server (daphne, Django's connection pool of one connection) while PostgreSQL
    ends its sessions and refuses new ones for about OUTAGE_REQUESTS seconds: each request is
    answered 503 within RUNTIME_DB_POOL_TIMEOUT (not after psycopg_pool's 30 s), the console's
    with its page; once the database accepts connections again, the next request is served
    at once (psycopg_pool's own reconnect attempt would by then wait 8 s before its next try)."""
    if connection.vendor != "postgresql":
        pytest.skip("the connection pool is PostgreSQL's")
    user, token = make_user("sam", "read", "operate")
    browser = Client()
    browser.force_login(user)
    cookies = {"sessionid": browser.cookies["sessionid"].value}
    headers = {"Authorization": f"Bearer {token}"}
    env = {**subprocess_env, "RUNTIME_DB_POOL_TIMEOUT": "1", "RUNTIME_DB_POOL_SIZE": "1"}
    with serving(env, tmp_path / "daphne.log") as base:
        api_url, console_url = f"{base}{BASE}/runs", f"{base}/"
        assert httpx.get(api_url, headers=headers, timeout=30).status_code == 200
        with database_refusing_connections():
            for _ in range(OUTAGE_REQUESTS):
                began = time.monotonic()
                response = httpx.get(api_url, headers=headers, timeout=30)
                assert time.monotonic() - began < 1 + SLACK
                assert response.status_code == 503, response.text
                assert response.json()["error"]["code"] == "database_unavailable"
                assert int(response.headers["Retry-After"]) > 0
            page = httpx.get(console_url, cookies=cookies, timeout=30)
            assert page.status_code == 503 and "The database is unavailable" in page.text
        began = time.monotonic()
        assert httpx.get(api_url, headers=headers, timeout=30).status_code == 200
        assert httpx.get(console_url, cookies=cookies, timeout=30).status_code == 200
        assert time.monotonic() - began < SLACK


@pytest.mark.slow
def test_sessions_ended_under_a_warm_pool_cost_the_next_request_nothing(
    make_user, subprocess_env, tmp_path
):
    """PostgreSQL ends every session (a restart, a failover, pg_terminate_backend) and stays
    up: the pool's idle connections are all dead. The next request is served, at once: the
    pool drops every dead one at the first it finds (runtime.db.check_idle_together) instead
    of walking them with a doubling delay (0 + 1 + 2 + 4 s for its four: a 503 at 5 s)."""
    if connection.vendor != "postgresql":
        pytest.skip("the connection pool is PostgreSQL's")
    _, token = make_user("sam", "read")
    headers = {"Authorization": f"Bearer {token}"}
    before = other_sessions()
    with serving(subprocess_env, tmp_path / "daphne.log") as base:
        url = f"{base}{BASE}/runs"
        assert httpx.get(url, headers=headers, timeout=30).status_code == 200
        # The pool keeps min_size (4) connections idle once it is open.
        wait_for(lambda: other_sessions() >= before + 4, what="the server's pool to fill")
        end_other_sessions()
        response = httpx.get(url, headers=headers, timeout=30)
        assert response.status_code == 200, response.text


@pytest.mark.slow
def test_starts_while_backends_are_terminated_are_answered_by_the_log(
    make_user, subprocess_env, tmp_path
):
    """Issue 31's fault test: ``POST /runs`` with an Idempotency-Key through a real server
    while PostgreSQL ends the server's sessions every few milliseconds. Every start answered
    503 is absent from the log, every one answered 201 or 202 is there, and sending each
    again with its key, once the faults stop, starts exactly one run per key."""

    from runtime.models import MessageRecord, StartRecord
    from tests.faults import _admin, _kept_session

    if connection.vendor != "postgresql":
        pytest.skip("ending sessions is PostgreSQL's fault")
    _, token = make_user("kim", "read", "operate")
    headers = {"Authorization": f"Bearer {token}"}
    kept = _kept_session()
    stop, ended = threading.Event(), [0]

    def end_sessions() -> None:
        admin, name = _admin()
        with admin:
            while not stop.is_set():
                rows = admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> %s AND pid <> pg_backend_pid()",
                    [name, kept],
                ).fetchall()
                ended[0] += len(rows)
                stop.wait(0.1)

    def start(base: str, i: int) -> httpx.Response:
        body = {**BODY, "input": f"fault-{i}"}
        keyed = {**headers, "Idempotency-Key": f"fault-{i}"}
        return httpx.post(f"{base}{BASE}/runs", json=body, headers=keyed, timeout=60)

    with serving(subprocess_env, tmp_path / "daphne.log") as base:
        assert httpx.get(f"{base}{BASE}/runs", headers=headers, timeout=30).status_code == 200
        killer = threading.Thread(target=end_sessions)
        killer.start()
        try:
            with ThreadPoolExecutor(4) as pool:
                statuses = list(pool.map(lambda i: start(base, i).status_code, range(FAULTED)))
        finally:
            stop.set()
            killer.join()
        logged = set(
            MessageRecord.objects.filter(content__startswith="fault-").values_list(
                "content", flat=True
            )
        )
        for i, status in enumerate(statuses):
            assert status in (201, 202, 503), (i, status)
            assert (f"fault-{i}" in logged) == (status != 503), (i, status)
        # Sent again with their keys, the faults over: each key has its one run.
        again = [start(base, i) for i in range(FAULTED)]
    assert [r.status_code for r in again] == [201] * FAULTED, [r.text for r in again][:3]
    assert len({r.json()["id"] for r in again}) == FAULTED
    assert Run.objects.count() == StartRecord.objects.count() == FAULTED
    for i, status in enumerate(statuses):  # what the suite saw, for the closing note
        print(f"start {i}: {status}")
    print(f"sessions ended: {ended[0]}; answers: {sorted(Counter(statuses).items())}")
    assert ended[0] > 0
