"""Open event streams do not hold up the process's other requests (issue 12, item 8).

Two properties: idle streams cost the process one look at the log per poll interval, not one
per stream (so 50 open streams do not eat the CPU that requests need); and a request is
answered while the streams' own reads are stuck (the commit log locked with PostgreSQL's
``LOCK TABLE``), so nothing a stream reads can queue a request of the same process.
"""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.db import connection, connections, transaction
from django.db.backends.signals import connection_created

from console.api.events import POLL_SECONDS, stream_run
from tests.api.conftest import APPROVAL, BASE, drive

pytestmark = pytest.mark.django_db(transaction=True)

STREAMS = 5


def test_requests_are_served_while_stream_reads_are_blocked(make_user, start, daphne) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL's table locks to hold the streams' reads")
    _, token = make_user("sam", "read")
    headers = {"Authorization": f"Bearer {token}"}
    runs = [start(APPROVAL) for _ in range(STREAMS)]
    drive()
    opened = threading.Semaphore(0)

    def follow(run_id: str) -> None:
        url = f"{daphne}{BASE}/runs/{run_id}/events?timeout=8"
        with httpx.stream("GET", url, headers=headers, timeout=60) as response:
            opened.release()
            for _ in response.iter_text():
                pass

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("LOCK TABLE runtime_threadcommit IN ACCESS EXCLUSIVE MODE")
        readers = [threading.Thread(target=follow, args=(r["id"],), daemon=True) for r in runs]
        for reader in readers:
            reader.start()
        for _ in runs:  # each stream has started (its first read of the log now waits)
            assert opened.acquire(timeout=30)
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
