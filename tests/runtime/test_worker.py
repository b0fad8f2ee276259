"""The worker process: graceful stop on a signal, poison runs, several workers on one run.

Every test starts real ``manage.py runtime_worker`` processes on the test database and reads
the outcome from committed facts and the effect ledger.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter

import pytest
from django.db import OperationalError, connections

from runtime import conf
from runtime import worker as worker_module
from runtime.models import LateEvidence, ThreadCommit
from runtime.worker import Worker
from tests.runtime.support import (
    applied,
    assert_log_sound,
    calls,
    commit_count,
    executing_workers,
    run_row,
    text_step,
    tool_step,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

LEDGER_BATCH = (
    ("ledger_once", {"key": "a"}),
    ("ledger_reconnect", {"key": "b"}),
    ("ledger_replay", {"key": "c"}),
)


def _phase(run_id: str, index: int) -> str | None:
    found = [c.phase for c in calls(run_id) if c.index == index]
    return found[0] if found else None


def _worker_actors(run_id: str) -> list[str]:
    """The worker of each commit of the run, in commit order (operator commits left out)."""
    return [
        actor
        for actor in ThreadCommit.objects.filter(run_id=run_id)
        .order_by("seq")
        .values_list("actor", flat=True)
        if actor.startswith("worker:")
    ]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_signal_mid_run_stops_at_the_boundary_and_the_next_worker_continues(
    start, spawn_worker, worker, signum
):
    run_id = start(tool_step(("slow", {"seconds": 10}), *LEDGER_BATCH), text_step())
    first = spawn_worker(until_idle=False, worker_id="first")
    wait_for(lambda: _phase(run_id, 0) == "executing", what="the slow call to start")
    seen = commit_count(run_row(run_id).thread_id)

    signalled = time.monotonic()
    first.signal(signum)
    code, err = first.wait(timeout=10)
    assert code == 0, err
    assert time.monotonic() - signalled < 6  # it did not wait for the 10 s call
    assert "stopping after this boundary" in err
    # Nothing more was committed, and the lease is given back for the next worker.
    assert commit_count(run_row(run_id).thread_id) == seen
    assert (run_row(run_id).state, run_row(run_id).lease_owner) == ("running", None)

    # The next worker replays the abandoned replay-safe call and finishes the batch.
    code, err = worker(worker_id="next")
    assert code == 0, err
    run = run_row(run_id)
    assert (run.state, run.end_cause, run.step) == ("ended", "natural", 2)
    slow, *ledgers = calls(run_id)
    assert (slow.phase, slow.attempt) == ("completed", 2)
    assert executing_workers(run_id)[slow.id] == [(1, "first"), (2, "next")]
    assert [(c.phase, c.attempt, applied(c)) for c in ledgers] == [("completed", 1, 1)] * 3
    assert_log_sound(run_id)


def test_signal_while_idle_exits_at_once(spawn_worker):
    # The signal wakes the worker: it stops long before its idle poll (30 s) would have woken
    # it. The bound is loose on purpose (a loaded 2-core CI machine); what it rules out is
    # the worker sleeping its poll out.
    idle = spawn_worker(until_idle=False, RUNTIME_IDLE_POLL_SECONDS="30")
    wait_for(lambda: "started" in idle.stderr, what="the worker to start")
    time.sleep(0.3)  # asleep in its idle wait
    signalled = time.monotonic()
    idle.signal(signal.SIGTERM)
    wait_for(lambda: "stopped" in idle.stderr, timeout=20, what="the worker to stop")
    assert time.monotonic() - signalled < 10
    code, err = idle.wait(timeout=10)
    assert code == 0, err


def test_poison_run_ends_indeterminate_after_the_death_budget(start, worker):
    # Each worker dies inside the run: claims lost with their worker count toward
    # RUNTIME_POISON_DEATHS, so a run that keeps killing workers still ends.
    run_id = start(tool_step(("ledger_once", {"key": "a"})), text_step())
    for _ in range(2):
        code, err = worker(crash_at="inference_streaming", RUNTIME_POISON_DEATHS="2")
        assert code == 137, err
    assert run_row(run_id).claims == 2
    code, err = worker(crash_at="inference_streaming", RUNTIME_POISON_DEATHS="2")
    assert code == 0, err
    assert "poison run" in err
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "indeterminate")
    assert "stopped 2 workers" in run.error["reason"]
    assert commit_count(run.thread_id) == 2  # the activation and the ending, nothing between
    assert calls(run_id) == []
    assert_log_sound(run_id)


def test_a_commit_resets_the_poison_budget(start, worker):
    # Each worker dies at a different point, but after a commit: the run is not poison.
    run_id = start(tool_step(*LEDGER_BATCH), text_step())
    for point in ("batch_committed", "call_completed", "call_completed"):
        code, err = worker(crash_at=point, RUNTIME_POISON_DEATHS="1")
        assert code == 137, err
    code, err = worker(RUNTIME_POISON_DEATHS="1")
    assert code == 0, err
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    # A result commits with the next call's Executing, so each crash at call_completed left
    # the next call Executing before its effect: reconnect looks up then retries, replay
    # replays; every effect applied once.
    assert [(c.phase, c.attempt, applied(c)) for c in calls(run_id)] == [
        ("completed", 1, 1),
        ("completed", 2, 1),
        ("completed", 2, 1),
    ]
    assert_log_sound(run_id)


def test_racing_workers_one_owner_per_run(start, spawn_worker):
    runs = [
        start(tool_step(("slow", {"seconds": 0.3}), *LEDGER_BATCH), text_step()) for _ in range(5)
    ]
    # Leases long enough that a loaded machine never lets one lapse under a live heartbeat.
    workers = [
        spawn_worker(worker_id="alpha", max_inflight=2, RUNTIME_LEASE_SECONDS="5"),
        spawn_worker(worker_id="beta", RUNTIME_LEASE_SECONDS="5"),
    ]
    for each in workers:
        code, err = each.wait(timeout=60)
        assert code == 0, err
    owners = Counter()
    for run_id in runs:
        assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
        actors = set(_worker_actors(run_id))
        assert len(actors) == 1, actors  # one owner from the first commit to the last
        owners.update(actors)
        slow, *ledgers = calls(run_id)
        assert slow.attempt == 1
        assert [(c.attempt, applied(c)) for c in ledgers] == [(1, 1)] * 3
        assert_log_sound(run_id)
    assert sum(owners.values()) == len(runs)


def test_stale_owner_is_fenced_and_applies_nothing_after(start, spawn_worker):
    # The first owner is stopped (SIGSTOP) inside a slow call, so its heartbeats stop and its
    # lease (1 s) lapses, until a second worker has taken the run over; then it is let go:
    # the version check and the lease epoch refuse each of its commits, so it never starts
    # another attempt or the next call. (Stopping it, rather than hoping the second worker
    # starts within the call's 4 s, keeps the order on a loaded machine; a heartbeat slower
    # than the lease, as this test once used, is refused at start-up since issue 21.)
    run_id = start(tool_step(("slow", {"seconds": 4}), ("ledger_once", {"key": "x"})), text_step())
    stale = spawn_worker(worker_id="stale")
    wait_for(lambda: [c.phase for c in calls(run_id)][:1] == ["executing"], what="the stale's call")
    first_epoch = run_row(run_id).lease_epoch
    stale.signal(signal.SIGSTOP)
    try:
        fresh = spawn_worker(worker_id="fresh")
        wait_for(lambda: run_row(run_id).lease_owner == "fresh", timeout=60, what="the takeover")
    finally:
        stale.signal(signal.SIGCONT)
    for each in (stale, fresh):
        code, err = each.wait(timeout=60)
        assert code == 0, err
    assert "fenced" in stale.stderr or "lease lost" in stale.stderr

    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural")
    assert run.lease_epoch > first_epoch
    slow, once = calls(run_id)
    attempts = executing_workers(run_id)
    assert attempts[slow.id] == [(1, "stale"), (2, "fresh")]  # no third attempt by the stale
    assert attempts[once.id] == [(1, "fresh")]
    assert (once.phase, applied(once)) == ("completed", 1)
    actors = _worker_actors(run_id)
    takeover = actors.index("worker:fresh")
    assert set(actors[takeover:]) == {"worker:fresh"}, actors  # nothing from the stale after
    # The stale owner's result came after the takeover: kept as evidence, not published.
    evidence = LateEvidence.objects.get(call_id=slow.id)
    assert (json.loads(evidence.result), evidence.worker) == ({"slept": 4}, "stale")
    assert_log_sound(run_id)


def test_graceful_stops_do_not_count_towards_the_poison_budget(start, spawn_worker, worker):
    # A worker stopped by a signal mid-inference commits nothing, but it was not killed by
    # the run: rolling restarts must not end a healthy run as poison.
    run_id = start({"text": "a long answer, streamed slowly", "chunks": 30, "delay_ms": 100})
    for _ in range(2):
        stopping = spawn_worker(until_idle=False, RUNTIME_POISON_CLAIMS="1")
        wait_for(lambda s=stopping: "claimed" in s.stderr, what="a claim")
        time.sleep(0.3)  # streaming now
        stopping.signal(signal.SIGTERM)
        code, err = stopping.wait(timeout=10)
        assert code == 0, err
        assert (run_row(run_id).state, run_row(run_id).error) == ("running", None)
    code, err = worker(RUNTIME_POISON_CLAIMS="1")
    assert code == 0, err
    run = run_row(run_id)
    assert (run.state, run.end_cause) == ("ended", "natural"), run.error


def test_a_failed_step_does_not_end_the_loop(start, settings, monkeypatch):
    """A claim that raises (the database went away for a moment) is logged and tried again:
    the loop thread lives on, so the worker keeps its capacity (found by an adversarial pass:
    one error ended the loop, and with it a one-loop worker)."""
    settings.RUNTIME_IDLE_POLL_SECONDS = 0.05
    run_id = start(text_step())
    real, failed = worker_module.claim_many, []

    def flaky(*args):
        if not failed:
            failed.append(1)
            raise OperationalError("server closed the connection unexpectedly")
        return real(*args)

    monkeypatch.setattr(worker_module, "claim_many", flaky)
    Worker(worker_id="flaky", until_idle=True).run()
    assert failed == [1]
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")


def test_the_heartbeat_survives_a_failed_beat(monkeypatch, transactional_db):
    """One failed renewal must not end the worker's heartbeat for its life: its leases would
    lapse while its drivers go on, and another worker would drive the same runs."""
    monkeypatch.setattr(conf, "heartbeat_seconds", lambda: 0.01)
    beats: list[int] = []

    def renew(held: dict) -> tuple[set[str], set[str], set[str]]:
        beats.append(1)
        if len(beats) == 1:
            raise OperationalError("server closed the connection unexpectedly")
        return set(), set(), set()

    monkeypatch.setattr(worker_module, "renew", renew)
    stop = threading.Event()

    def beat() -> None:  # the heartbeat's thread, as Worker.serve runs it
        try:
            Worker(worker_id="beats")._heartbeats(stop)
        finally:
            connections.close_all()

    beating = threading.Thread(target=beat)
    beating.start()
    try:
        wait_for(lambda: len(beats) >= 2 or not beating.is_alive(), timeout=10, what="2 beats")
    finally:
        stop.set()
        beating.join(10)
    assert len(beats) >= 2, "the heartbeat died on its first failed beat"


def test_a_stalled_event_loop_keeps_no_lease(monkeypatch):
    """The heartbeat's thread renews nothing for a worker whose event loop has not turned for
    a lease: its drivers make no progress, so its runs go to a worker that can drive them."""
    renewed: list[dict] = []
    monkeypatch.setattr(worker_module, "renew", lambda held: renewed.append(held))
    stalled = Worker(worker_id="stalled")
    stalled.turned = time.monotonic() - worker_module.LOOP_STALL_SECONDS - 60
    stalled._beat()
    assert renewed == []
