"""Our runtime on the demo workload, through its public entry points, for ``compare.py``.

- ``measure_live``: ``manage.py runtime_worker`` processes already running (warmed up), then
  runs started one after another with ``runtime.operations.start_run``; runs/s from the first
  start to the last commit, new PostgreSQL sessions per run, and the median time from a run's
  start to its first worker commit on an otherwise idle system (probe runs, one at a time).
- ``count_statements``: one in-process ``runtime.worker.Worker`` drives a batch of started runs;
  every SQL statement of every connection it opens is counted (Django's ``connection_created``
  signal attaches an ``execute_wrapper``), as are the connections themselves and the worker's
  ThreadCommits.

Django must be set up (``compare.setup``) before these are called.
"""

from __future__ import annotations

import re
import signal
import statistics
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from loop_bench import check_outcome, spawn, start_runs

TOOLS_THREAD = "tools"  # a worker's tool threads are "tools-N" (runtime.loop.ThreadPool)
# How often the bench looks whether its runs ended: rarely while throughput is measured (the
# rate ends at the last commit, not at the look, and looks are transactions the server
# counts), often for the latency probes.
BATCH_POLL_SECONDS = 0.25
PROBE_POLL_SECONDS = 0.01
STOP_TIMEOUT_SECONDS = 30.0


def wait_ended(run_ids: list[str], timeout: float, poll: float = BATCH_POLL_SECONDS) -> None:
    """Return once none of ``run_ids`` is Running, looking every ``poll`` seconds;
    SystemExit after ``timeout`` seconds."""
    from runtime.models import Run

    deadline = time.monotonic() + timeout
    while Run.objects.filter(id__in=run_ids, state="running").exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"runs still Running after {timeout:.0f} s")
        time.sleep(poll)


def last_commit_at(run_ids: list[str]) -> datetime:
    """The created_at of the last ThreadCommit of ``run_ids``."""
    from django.db.models import Max

    from runtime.models import ThreadCommit

    return ThreadCommit.objects.filter(run_id__in=run_ids).aggregate(last=Max("created_at"))["last"]


def first_commit_delays(run_ids: list[str]) -> list[float]:
    """Seconds from each run's creation (its start commit) to its first worker commit."""
    from django.db.models import Min, Q

    from runtime.models import Run

    rows = Run.objects.filter(id__in=run_ids).annotate(
        first=Min("commits__created_at", filter=Q(commits__actor__startswith="worker:"))
    )
    return [(row.first - row.created_at).total_seconds() for row in rows]


@contextmanager
def live_workers(count: int, log: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` ``runtime_worker`` processes for the block; SIGTERM and reaped at its end."""
    processes = [spawn(["--worker-id", f"compare-{count}-{i}"], log) for i in range(count)]
    try:
        yield processes
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure_live(
    workers: int, runs: int, probes: int, log: Path, counters: Callable[[], Any] | None
) -> dict[str, float]:
    """Throughput of ``workers`` live worker processes on ``runs`` runs, and dispatch latency.

    ``counters`` is ``peers.workload.server_counters`` on PostgreSQL (None on SQLite). Returns
    ``{"runs_per_second", "sessions_per_run", "transactions_per_run", "first_commit_ms"}``
    (the last: median over ``probes`` runs started on idle workers, milliseconds).
    """
    from django.utils import timezone

    timeout = 60.0 + runs  # generous: a stuck run fails the bench rather than hanging it
    with live_workers(workers, log):
        warm = start_runs(2 * workers)
        wait_ended(warm, timeout)
        with counters() if counters else _no_counts() as counted:
            began = timezone.now()
            run_ids = start_runs(runs)
            wait_ended(run_ids, timeout)
            counts = counted()
        seconds = (last_commit_at(run_ids) - began).total_seconds()
        check_outcome(warm + run_ids)
        probe_ids = []
        for _ in range(probes):
            probe_ids += start_runs(1)
            wait_ended(probe_ids[-1:], timeout, PROBE_POLL_SECONDS)
    delays = first_commit_delays(probe_ids)
    return {
        "runs_per_second": runs / seconds,
        "sessions_per_run": counts["sessions"] / runs if counts else float("nan"),
        "transactions_per_run": counts["transactions"] / runs if counts else float("nan"),
        "first_commit_ms": statistics.median(delays) * 1000 if delays else float("nan"),
    }


@contextmanager
def _no_counts() -> Iterator[Callable[[], dict[str, int]]]:
    yield dict


# -- counting statements ---------------------------------------------------------------------

_TABLE = re.compile(r'(?:FROM|INTO|UPDATE)\s+"?(\w+)"?', re.IGNORECASE)


def statement_kind(sql: str) -> str:
    """A short label of a statement: its verb and first table, e.g. ``UPDATE runtime_run``."""
    verb = sql.lstrip().split(None, 1)[0].upper() if sql.strip() else "?"
    table = _TABLE.search(sql)
    return f"{verb} {table.group(1)}" if table else verb


class StatementCounter:
    """Counts statements by thread role and kind, from any thread (an ``execute_wrapper``).

    The role is the thread's name up to its first "-" ("worker", "tools", "heartbeat"): the
    tools thread runs the tools' own effects (the demo ledger), the rest is the runtime's.
    """

    def __init__(self) -> None:
        self.kinds: Counter[str] = Counter()
        self.tools = 0
        self.connections = 0
        self._lock = threading.Lock()

    def __call__(self, execute, sql, params, many, context):
        role = threading.current_thread().name.split("-", 1)[0]
        with self._lock:
            self.kinds[f"{role:<9} {statement_kind(sql)}"] += 1
            self.tools += role == TOOLS_THREAD
        return execute(sql, params, many, context)

    def on_connection(self, sender, connection, **kwargs) -> None:
        """``connection_created`` receiver: count the connection and wrap its statements."""
        with self._lock:
            self.connections += 1
        # A thread's DatabaseWrapper reconnects in place: wrap its statements only once.
        if self not in connection.execute_wrappers:
            connection.execute_wrappers.append(self)

    @property
    def total(self) -> int:
        return sum(self.kinds.values())


def count_statements(runs: int, counters: Callable[[], Any] | None = None) -> dict[str, Any]:
    """Drive ``runs`` started runs with one in-process Worker(until_idle) and count its SQL.

    Returns ``{"runs", "commits": the worker's ThreadCommits, "statements": executed by the
    worker, "tool_statements": of those, on its tools thread (the tools' own effects),
    "connections": opened by the worker, "start_statements": executed by start_run for all
    runs, "kinds": {"role kind": count}, "transactions": the server's count while the worker
    ran (with ``counters``, ``peers.workload.server_counters``; else absent)}``. BEGIN and
    COMMIT are not statements here (psycopg sends them outside ``execute``); every other round
    trip through Django is.
    """
    from django.db import connection
    from django.db.backends.signals import connection_created

    from runtime.models import ThreadCommit
    from runtime.worker import Worker

    starting = StatementCounter()
    with connection.execute_wrapper(starting):
        run_ids = start_runs(runs)
    counter = StatementCounter()
    connection_created.connect(counter.on_connection, weak=False, dispatch_uid="bench-count")
    try:
        with counters() if counters else _no_counts() as counted:
            Worker(worker_id="bench-count", until_idle=True).run()
            server = counted()
    finally:
        connection_created.disconnect(dispatch_uid="bench-count")
    check_outcome(run_ids)
    commits = ThreadCommit.objects.filter(run_id__in=run_ids, actor__startswith="worker:").count()
    return {
        "runs": runs,
        "commits": commits,
        "statements": counter.total,
        "tool_statements": counter.tools,
        "connections": counter.connections,
        "start_statements": starting.total,
        "kinds": dict(counter.kinds.most_common()),
        **({"transactions": server["transactions"]} if server else {}),
    }
