"""Leases that only a dead or partitioned worker loses (issue 29, item 2): a tool whose fenced
effect blocks costs its own run only. Real worker subprocesses on PostgreSQL (SQLite has no
row locks: its one writer at a time keeps every claim out while an effect writes).
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest
from django.db import connection

from runtime.models import Run
from tests.runtime.locking_agent import AGENTS, EFFECT_LOCK
from tests.runtime.support import (
    applied,
    calls,
    executing_workers,
    run_row,
    text_step,
    tool_step,
    wait_for,
)
from tests.subprocesses import FAST_WORKER_ENV, subprocess_database_url

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(connection.vendor != "postgresql", reason="needs PostgreSQL's row locks"),
]

LEASE = float(FAST_WORKER_ENV["RUNTIME_LEASE_SECONDS"])
OTHERS = 50
WORKER: dict[str, Any] = {"until_idle": False, "max_inflight": 60, "RUNTIME_AGENTS": AGENTS}


def _effect_waits() -> bool:
    """Whether held_effect waits on the downstream's lock, holding its run's row."""
    with psycopg.connect(subprocess_database_url(), autocommit=True) as probe:
        row = probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%%pg_advisory_xact_lock%%'"
        ).fetchone()
    return bool(row and row[0])


def _lapsed_for(run_id: str, periods: float) -> bool:
    """Whether the run's committed lease expired ``periods`` lease periods ago or more (the
    blocked run's row cannot be renewed while its effect holds it)."""
    with psycopg.connect(subprocess_database_url(), autocommit=True) as probe:
        row = probe.execute(
            "SELECT now() > lease_expires_at + make_interval(secs => %s) FROM runtime_run "
            "WHERE id = %s",
            [periods * LEASE, run_id],
        ).fetchone()
    return bool(row and row[0])


@pytest.fixture
def agents(settings):
    settings.RUNTIME_AGENTS = AGENTS.split(",")


def test_a_blocked_fenced_effect_costs_its_own_run_only(agents, start, spawn_worker):
    """Worker A drives 51 runs: one's held_effect waits on a locked downstream (its run's row
    held FOR UPDATE all along) for 3 lease periods, 50 others wait in slow tools. Worker B
    is up and claiming all that time. No run changes worker (each was claimed once: epoch 1,
    B claimed nothing, A lost no lease), and the blocked call completes on A, applied once."""
    assert Run._meta.db_table == "runtime_run"
    slow = tool_step(("slow", {"seconds": 20}))
    others = [start(slow, text_step(), agent="locking") for _ in range(OTHERS)]
    blocked = start(tool_step(("held_effect", {"key": "k"})), text_step(), agent="locking")
    everyone = [*others, blocked]
    with psycopg.connect(subprocess_database_url()) as downstream:
        downstream.execute("SELECT pg_advisory_xact_lock(%s)", [EFFECT_LOCK])
        try:
            a = spawn_worker(worker_id="a", **WORKER)
            wait_for(
                lambda: Run.objects.filter(id__in=everyone, lease_owner="a").count() == 51,
                timeout=120,
                what="A to claim every run",
            )
            wait_for(_effect_waits, timeout=60, what="A's effect to block")
            b = spawn_worker(worker_id="b", **WORKER)
            wait_for(lambda: "started" in b.stderr, timeout=120, what="B to start")
            # The effect holds its run's row for 3 lease periods, B claiming beside it.
            wait_for(lambda: _lapsed_for(blocked, 2), timeout=60, what="3 lease periods")
            in_flight = Run.objects.filter(id__in=others, state="running").count()
        finally:
            downstream.rollback()  # the downstream answers
    wait_for(
        lambda: Run.objects.filter(id__in=everyone, state="ended").count() == 51,
        timeout=120,
        what="every run to end",
    )
    for worker in (a, b):
        worker.signal(signal.SIGTERM)
        assert worker.wait(30)[0] == 0
    assert in_flight == OTHERS, "the other runs ended before the block did: nothing was tested"
    takeovers = {run.id: run.lease_epoch for run in Run.objects.filter(id__in=everyone)}
    assert set(takeovers.values()) == {1}, {k: v for k, v in takeovers.items() if v != 1}
    assert "claimed" not in b.stderr
    assert "lease lost" not in a.stderr and "fenced" not in a.stderr
    (call,) = calls(blocked)
    assert (call.phase, call.attempt, applied(call)) == ("completed", 1, 1)
    # The committed facts: every call was executed once, by A.
    executed = {run_id: list(executing_workers(run_id).values()) for run_id in everyone}
    assert all(attempts == [[(1, "a")]] for attempts in executed.values()), executed
    assert (run_row(blocked).state, run_row(blocked).end_cause) == ("ended", "natural")
