"""Open event streams do not hold up the process's other requests (issue 12, item 8).

Idle streams cost the process one look at the log per poll interval, not one per stream, and
the streams of one token one access check per ACCESS_FRESH, not one per stream (so 50 open
streams do not eat the CPU that requests need); a request is answered while the streams'
own reads are stuck (the commit log locked with PostgreSQL's ``LOCK TABLE``), so nothing a
stream reads can queue a request of the same process; an open stream holds no database
connection; a request crosses from the event loop to its thread once, and a test fails if a
Django release stops honouring the override that makes it so (``console.asgi``).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import httpx
import pytest
from asgiref.sync import SyncToAsync, sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.core.handlers.asgi import ASGIHandler
from django.db import connection, connections, transaction
from django.db.backends.signals import connection_created
from django.http import HttpRequest, HttpResponse
from django.urls import path

from console.api.events import POLL_SECONDS, stream_run
from console.asgi import OneHopASGIHandler
from console.db import SharedAnswers
from runtime.db import reserve_connections
from tests.api.conftest import APPROVAL, BASE, drive
from tests.servers import serving

pytestmark = pytest.mark.django_db(transaction=True)

STREAMS = 5


def follow_all(
    base: str, run_ids: list[str], headers: dict[str, str], seconds: float
) -> list[threading.Thread]:
    """Follow each run's event stream for ``seconds``, each on a thread of its own; return
    the threads once every stream has answered."""
    opened = threading.Semaphore(0)

    def follow(run_id: str) -> None:
        url = f"{base}{BASE}/runs/{run_id}/events?timeout={seconds}"
        with httpx.stream("GET", url, headers=headers, timeout=60) as response:
            opened.release()
            for _ in response.iter_text():
                pass

    readers = [threading.Thread(target=follow, args=(r,), daemon=True) for r in run_ids]
    for reader in readers:
        reader.start()
    for _ in run_ids:
        assert opened.acquire(timeout=30)
    return readers


def test_requests_are_served_while_stream_reads_are_blocked(make_user, start, daphne) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL's table locks to hold the streams' reads")
    _, token = make_user("sam", "read")
    headers = {"Authorization": f"Bearer {token}"}
    runs = [start(APPROVAL) for _ in range(STREAMS)]
    drive()
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE runtime_threadcommit IN ACCESS EXCLUSIVE MODE")
        # Each stream has started (its first read of the log now waits).
        readers = follow_all(daphne, [r["id"] for r in runs], headers, seconds=8)
        began = time.monotonic()
        response = httpx.get(f"{daphne}{BASE}/runs", headers=headers, timeout=30)
        took = time.monotonic() - began
        assert response.status_code == 200
        assert took < 5, f"GET /runs waited {took:.1f}s behind the streams' reads"
    for reader in readers:
        reader.join(30)


@pytest.mark.asyncio
async def test_idle_streams_share_one_look_at_the_log(start) -> None:
    """Each stream read opens (and closes) its own connection (console.db.off_loop), so the
    connections opened while 10 streams idle count their reads."""
    runs = [await sync_to_async(start)(APPROVAL) for _ in range(STREAMS * 2)]
    await sync_to_async(drive)()
    lock, counting, reads = threading.Lock(), threading.Event(), [0]

    def count_read(**kwargs: object) -> None:
        if counting.is_set():
            with lock:
                reads[0] += 1

    async def drain(run_id: str) -> None:
        async for _ in stream_run(run_id, cursor=0, live=False, timeout=4 + 8 * POLL_SECONDS):
            pass

    connection_created.connect(count_read)
    try:
        streams = [asyncio.ensure_future(drain(r["id"])) for r in runs]
        await asyncio.sleep(4 * POLL_SECONDS)  # each stream has caught up with its commits
        counting.set()
        await asyncio.sleep(8 * POLL_SECONDS)
        counting.clear()
        await asyncio.gather(*streams)
    finally:
        connection_created.disconnect(count_read)
        await sync_to_async(connections.close_all)()
    # One look per interval for all the idle streams (not one per stream), with some slack.
    assert 1 <= reads[0] <= 8 + 4, f"{reads[0]} reads for {len(runs)} idle streams in 8 polls"


@pytest.mark.asyncio
async def test_one_access_check_answers_every_stream_that_asks_within_fresh() -> None:
    checks: list[str] = []
    answer = [True]

    async def check() -> bool:
        checks.append("read")
        await asyncio.sleep(0.05)
        return answer[0]

    shared = SharedAnswers(fresh=0.3)
    assert await asyncio.gather(*(shared.ask("token-1", check) for _ in range(50))) == [True] * 50
    assert len(checks) == 1  # 50 streams, one read
    assert await shared.ask("token-2", check) is True
    assert len(checks) == 2  # another question is asked on its own
    answer[0] = False
    assert await shared.ask("token-1", check) is True  # still fresh
    await asyncio.sleep(0.3)
    assert await shared.ask("token-1", check) is False  # no answer older than ``fresh``
    assert len(checks) == 3


@pytest.mark.asyncio
async def test_a_failed_access_check_is_asked_again() -> None:
    calls = [0]

    async def check() -> bool:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("the database blinked")
        return True

    shared = SharedAnswers(fresh=60)
    with pytest.raises(RuntimeError):
        await shared.ask("token", check)
    assert await shared.ask("token", check) is True
    assert calls[0] == 2


def test_an_open_stream_holds_no_database_connection(
    make_user, start, subprocess_env, tmp_path
) -> None:
    """Served without a pool (RUNTIME_DB_POOL_SIZE=0), every connection the server keeps is
    one a request holds: 10 open, idle streams keep (about) none, not one each."""
    if connection.vendor != "postgresql":
        pytest.skip("counts the server's sessions in pg_stat_activity")
    _, token = make_user("stella", "read")
    headers = {"Authorization": f"Bearer {token}"}
    runs = [start(APPROVAL) for _ in range(STREAMS * 2)]
    drive()

    def sessions() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]

    env = {**subprocess_env, "RUNTIME_DB_POOL_SIZE": "0"}
    with serving(env, tmp_path / "daphne.log") as url:
        before = sessions()
        readers = follow_all(url, [r["id"] for r in runs], headers, seconds=5)
        time.sleep(1)  # every stream has read its commits and waits
        during = sessions() - before
        for reader in readers:
            reader.join(30)
    # At most a read in flight (the watch's look at the log), never one per stream.
    assert during <= 2, f"{during} connections held by {len(runs)} open streams"


def test_the_middleware_chain_is_entered_once_per_request() -> None:
    """Django's handler, built for async, hands a request between the loop and its thread
    at every middleware; ours builds the chain for sync code and enters it once."""
    handler: Any = OneHopASGIHandler()  # its chain and view middleware are private
    chain = handler._middleware_chain
    assert asyncio.iscoroutinefunction(chain)  # what ASGIHandler awaits
    assert isinstance(chain, SyncToAsync)  # the one hand-over to the request's thread ...
    assert not asyncio.iscoroutinefunction(chain.func)  # ... of the whole sync chain
    view_middleware = handler._view_middleware  # Django's would be adapted to async
    assert view_middleware and not any(asyncio.iscoroutinefunction(m) for m in view_middleware)


class ProbeMiddleware:
    """A sync middleware, first in the chain, that notes the thread it runs on."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request.probe = {"middleware": threading.current_thread().name}  # type: ignore[attr-defined]
        return self.get_response(request)


def probe_view(request: HttpRequest) -> HttpResponse:
    """A sync view: notes its thread, and the modules of the frames between it and the
    probe middleware's call on its stack (None: the middleware is not on this thread's
    stack, so the request was handed over between them)."""
    frame, between = inspect.currentframe(), []
    while frame is not None and frame.f_code is not ProbeMiddleware.__call__.__code__:
        between.append(frame.f_globals.get("__name__", ""))
        frame = frame.f_back
    probe = request.probe  # type: ignore[attr-defined]
    probe["view"] = threading.current_thread().name
    probe["between"] = between if frame is not None else None
    PROBES.append(probe)
    return HttpResponse("probed")


PROBES: list[dict[str, Any]] = []
urlpatterns = [path("probe/", probe_view)]  # ROOT_URLCONF in the test below


async def probe(handler: Any) -> dict[str, Any]:
    """Serve ``GET /probe/`` through ``handler``; return what the middleware and view saw."""
    PROBES.clear()
    scope = {**list_runs_scope(""), "path": "/probe/", "raw_path": b"/probe/"}
    scope["query_string"], scope["headers"] = b"", [(b"host", b"testserver")]
    app = ApplicationCommunicator(handler, scope)
    await app.send_input({"type": "http.request", "body": b""})
    start = await app.receive_output(10)
    body = await app.receive_output(10)
    await app.wait(10)
    assert (start["status"], body["body"]) == (200, b"probed")
    (seen,) = PROBES
    return seen


@pytest.mark.asyncio
async def test_the_one_hop_override_still_takes_hold_in_this_django(settings) -> None:
    """OneHopASGIHandler replaces ``_middleware_chain``, which Django's ``load_middleware``
    builds and ``get_response_async`` awaits (both private): if a Django release builds or
    calls the chain otherwise, the override does nothing and this fails. The whole chain and
    a sync view run on one of the request threads, the view called from within the chain
    (no asgiref hand-over between them). Django's stock handler, probed the same way, shows
    what a hand-over looks like to the probe."""
    settings.MIDDLEWARE = [f"{__name__}.ProbeMiddleware", *settings.MIDDLEWARE]
    settings.ROOT_URLCONF = __name__
    try:
        ours = await probe(OneHopASGIHandler())
        stock = await probe(ASGIHandler())
    finally:
        await sync_to_async(connections.close_all)()
    assert ours["middleware"] == ours["view"] and ours["view"].startswith("request"), ours
    assert ours["between"] is not None, "the view was not called from within the chain"
    assert not [m for m in ours["between"] if m.startswith("asgiref")], ours["between"]
    # Django's own: the view reached through asgiref (async_to_sync, then sync_to_async).
    assert stock["between"] is None or any(m.startswith("asgiref") for m in stock["between"])
    assert not stock["view"].startswith("request"), stock


def list_runs_scope(token: str) -> dict[str, Any]:
    """The ASGI scope of ``GET /runs?limit=5`` with ``token``."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": f"{BASE}/runs",
        "raw_path": f"{BASE}/runs".encode(),
        "query_string": b"limit=5",
        "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode())],
        "client": ("127.0.0.1", 1),
        "server": ("testserver", 80),
    }


@pytest.mark.asyncio
async def test_the_one_hop_handler_answers_requests(make_user) -> None:

    _, token = await sync_to_async(make_user)("hop", "read")
    app = ApplicationCommunicator(OneHopASGIHandler(), list_runs_scope(token))
    try:
        await app.send_input({"type": "http.request", "body": b""})
        start = await app.receive_output(10)
        body = await app.receive_output(10)
        await app.wait(10)  # the request has finished (and given its connection back)
    finally:
        await sync_to_async(connections.close_all)()  # make_user's thread's connection
    assert start["status"] == 200, body
    assert b'"items"' in body["body"]
    assert any(name.lower() == b"x-request-id" for name, _ in start["headers"])


def test_a_worker_makes_room_in_the_pool_for_its_threads() -> None:
    pool = getattr(connections["default"], "pool", None)
    if pool is None:
        pytest.skip("no connection pool (SQLite, or RUNTIME_DB_POOL_SIZE=0)")
    before = pool.max_size
    try:
        reserve_connections(7)
        assert pool.max_size == before + 7
    finally:
        pool.resize(pool.min_size, before)


@pytest.mark.asyncio
async def test_requests_run_on_a_fixed_set_of_threads(make_user, settings) -> None:
    """RUNTIME_REQUEST_THREADS threads run every request's sync code (console.asgi), not a
    new thread per request: 8 requests at once on 2 threads all answer 200."""

    settings.RUNTIME_REQUEST_THREADS = 2
    _, token = await sync_to_async(make_user)("pool", "read")
    threads: set[str] = set()

    def note_thread(**kwargs: object) -> None:  # each request opens its connection
        threads.add(threading.current_thread().name)

    handler = OneHopASGIHandler()

    async def request() -> int:
        app = ApplicationCommunicator(handler, list_runs_scope(token))
        await app.send_input({"type": "http.request", "body": b""})
        start = await app.receive_output(30)
        await app.receive_output(30)
        await app.wait(30)
        return start["status"]

    connection_created.connect(note_thread)
    try:
        statuses = await asyncio.gather(*(request() for _ in range(8)))
    finally:
        connection_created.disconnect(note_thread)
        await sync_to_async(connections.close_all)()
    assert statuses == [200] * 8
    assert threads and len(threads) <= 2, threads
    assert all(name.startswith("request") for name in threads), threads
