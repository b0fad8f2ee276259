"""Many runs in flight on one worker (issue 20): a run waiting on its model holds no thread and
no database connection, ``async def`` and ``def`` tools share a batch, a worker killed with
hundreds of runs in flight loses nothing, and a tool that cannot work is refused when defined.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter

import psycopg
import pytest
from django.db import connection

from runtime.demo.models import LedgerEffect
from runtime.models import Run
from runtime.tools import ToolContext, tool
from tests.model_server import model_server
from tests.runtime.inflight_agent import AGENTS
from tests.runtime.support import assert_log_sound, calls, run_row, wait_for
from tests.subprocesses import subprocess_database_url

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

IN_FLIGHT = 200
DB_CONNECTIONS, TOOL_THREADS = 3, 1  # 4 connections for statements and tools
LEASE_SECONDS = 10  # a loaded machine may delay a heartbeat; a takeover waits this long
# Every run: one batch of two ledger calls (one replay-safe, one applied at most once).
TOOL_CALLS = [("ledger_replay", {"key": "r"}), ("ledger_once", {"key": "o"})]


def worker_env(server_url: str, app: str) -> dict[str, str]:
    return {
        "RUNTIME_AGENTS": AGENTS,
        "RUNTIME_TEST_MODEL_URL": server_url,
        "OPENAI_API_KEY": "test",
        "RUNTIME_WORKER_DB_CONNECTIONS": str(DB_CONNECTIONS),
        "RUNTIME_WORKER_TOOL_THREADS": str(TOOL_THREADS),
        "RUNTIME_LEASE_SECONDS": str(LEASE_SECONDS),
        "RUNTIME_HEARTBEAT_SECONDS": "1",
        "PGAPPNAME": app,  # libpq names every connection of the worker after it
    }


def start_runs(start_run, count: int) -> list[str]:
    return [start_run(agent="inflight", input=f"task {i}") for i in range(count)]


class Connections:
    """The most PostgreSQL sessions a process (by its application_name) held at once,
    sampled on a thread of the test until ``stop()``."""

    def __init__(self, app: str) -> None:
        self.app = app
        self.peak = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        with psycopg.connect(subprocess_database_url(), autocommit=True) as db:
            while not self.done.wait(0.02):
                row = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    [self.app],
                ).fetchone()
                self.peak = max(self.peak, row[0] if row else 0)

    def stop(self) -> int:
        self.done.set()
        self.thread.join(10)
        return self.peak


@pytest.fixture
def start_run(settings):
    from runtime.operations import start_run

    settings.RUNTIME_AGENTS = AGENTS.split(",")
    return start_run


def test_one_worker_drives_200_runs_at_once_on_a_pool_of_4(start_run, spawn_worker):
    """All 200 requests are open at the model server at once (it answers none before), while
    the worker holds at most its 4 pooled connections and one to LISTEN."""
    run_ids = start_runs(start_run, IN_FLIGHT)
    app = f"inflight-{uuid.uuid4().hex[:8]}"
    with model_server(TOOL_CALLS) as server:
        server.hold(IN_FLIGHT, "user")
        sampling = Connections(app) if connection.vendor == "postgresql" else None
        worker = spawn_worker(max_inflight=IN_FLIGHT, **worker_env(server.url, app))
        try:
            code, err = worker.wait(timeout=300)
        finally:
            peak = sampling.stop() if sampling else None
        assert code == 0, err
        assert server.peak >= IN_FLIGHT, f"at most {server.peak} runs waited on the model at once"
        assert server.requests == 2 * IN_FLIGHT
    if peak is not None:
        # One more each to LISTEN and for the heartbeat (its beats queue behind no statement).
        assert 0 < peak <= DB_CONNECTIONS + TOOL_THREADS + 2, f"{peak} connections"
    ended = Counter(Run.objects.filter(id__in=run_ids).values_list("end_cause", flat=True))
    assert ended == {"natural": IN_FLIGHT}
    applied = Counter(LedgerEffect.objects.values_list("applied", flat=True))
    assert applied == {1: 2 * IN_FLIGHT}
    assert_log_sound(run_ids[0])


def test_a_worker_killed_with_200_runs_in_flight_loses_nothing(start_run, spawn_worker):
    """SIGKILL while all 200 runs wait on their second answer (their tool calls committed);
    another worker takes them over once the leases lapse: every run ends natural, no effect is
    applied twice, and each run's log folds cleanly."""
    run_ids = start_runs(start_run, IN_FLIGHT)
    app = f"inflight-{uuid.uuid4().hex[:8]}"
    with model_server(TOOL_CALLS) as server:
        server.hold(IN_FLIGHT + 1, "tool")  # every second question waits, until the kill
        doomed = spawn_worker(
            max_inflight=IN_FLIGHT, until_idle=False, **worker_env(server.url, app)
        )
        assert server.wait_open(IN_FLIGHT, "tool", timeout=300), doomed.stderr
        doomed.process.kill()
        doomed.wait(timeout=30)
        server.release()
        code, err = spawn_worker(max_inflight=IN_FLIGHT, **worker_env(server.url, app)).wait(
            timeout=300 + LEASE_SECONDS
        )
        assert code == 0, err
    ended = Counter(Run.objects.filter(id__in=run_ids).values_list("end_cause", flat=True))
    assert ended == {"natural": IN_FLIGHT}
    once = LedgerEffect.objects.filter(tool="ledger_once")
    assert once.count() <= IN_FLIGHT and set(once.values_list("applied", flat=True)) <= {1}
    for run_id in run_ids[:: IN_FLIGHT // 10]:
        assert_log_sound(run_id)


def test_an_async_and_a_sync_tool_share_a_batch(start, work_inline, settings):
    """The ``async def`` tool runs on the driver's event loop, the ``def`` tool on a tool
    thread; both see their claim as the owner of the run, and their results are published in
    the model's call order."""
    settings.RUNTIME_AGENTS = AGENTS.split(",")
    run_id = start(
        {
            "tool_calls": [
                {"name": "where_async", "arguments": {"key": "a"}},
                {"name": "where_sync", "arguments": {"key": "s"}},
            ]
        },
        {"text": "done"},
        agent="mixed",
    )
    work_inline()
    assert run_row(run_id).end_cause == "natural"
    first, second = calls(run_id)
    assert (first.name, first.phase, second.name, second.phase) == (
        "where_async",
        "completed",
        "where_sync",
        "completed",
    )
    ran_async, ran_sync = json.loads(first.result), json.loads(second.result)
    assert ran_async["owner"] and ran_sync["owner"]
    assert ran_sync["thread"].startswith("tools-")
    assert not ran_async["thread"].startswith("tools-")
    assert_log_sound(run_id)


def test_a_tool_without_a_policy_is_refused_saying_what_to_write():
    with pytest.raises(TypeError, match=r"@tool\(policy=RecoveryPolicy.REPLAY\)"):

        @tool
        def ping(ctx: ToolContext) -> str:
            return "pong"


def test_a_tool_that_forgets_its_context_is_refused_saying_what_to_write():
    from runtime.domain.model import RecoveryPolicy

    with pytest.raises(TypeError, match=r"def lookup\(ctx: ToolContext, \.\.\.\)"):

        @tool(policy=RecoveryPolicy.REPLAY)
        def lookup(key: str) -> str:
            return key


def test_concurrency_is_refused_naming_its_replacement(command):
    done = command("runtime_worker", "--concurrency", "4", "--until-idle")
    assert done.returncode != 0
    assert "--max-inflight" in done.stderr and "Traceback" not in done.stderr


def test_a_worker_whose_connections_are_cut_says_so_once_and_recovers(start, spawn_worker):
    """PostgreSQL terminates every connection of a live worker: it logs one line saying it
    cannot work and one once it works again (never a line per failed statement), and the
    next run is driven to its end."""
    if connection.vendor != "postgresql":
        pytest.skip("terminating a worker's sessions needs PostgreSQL")
    app = f"cut-{uuid.uuid4().hex[:8]}"
    worker = spawn_worker(until_idle=False, worker_id="cut", PGAPPNAME=app)
    wait_for(lambda: "started" in worker.stderr, timeout=120, what="the worker to start")
    with psycopg.connect(subprocess_database_url(), autocommit=True) as db:

        def cut() -> bool:
            db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = %s",
                [app],
            )
            return "cannot work" in worker.stderr

        wait_for(cut, timeout=60, what="the worker to say it cannot work")
    wait_for(lambda: "works again" in worker.stderr, timeout=60, what="the worker to recover")
    run_id = start({"text": "after the cut"})
    wait_for(lambda: run_row(run_id).end_cause == "natural", timeout=60, what="the run to end")
    worker.signal()
    code, err = worker.wait(timeout=60)
    assert code == 0, err
    assert err.count("cannot work") == err.count("works again") >= 1
    # Its sessions are gone, and its pool cannot lend one until it reconnects.
    assert "cannot be reached" in err or "no database connection to be had" in err
