"""The worker: claims runnable Runs under a lease, drives them, and wakes promptly.

A claim is one statement: ``WITH picked AS (SELECT ... FOR UPDATE SKIP LOCKED) UPDATE ...
RETURNING`` on PostgreSQL (the IMMEDIATE write lock on SQLite) that bumps the lease epoch of
up to one run per loop waiting for work and returns everything the driver needs (the committed
RunView, the thread's version and messages, the run's metadata), so a claimed run is driven
without another read. Runs claimed for loops of the worker that were waiting are handed to
them (the heartbeat renews their leases meanwhile; a stop releases them). Every commit of the
owner is fenced on (owner, epoch), so a stale owner whose lease expired can write nothing
more. Leases are stamped and judged on the database's clock. One heartbeat thread per worker
renews all the leases it holds in one statement.

Poison: a run whose driving raised ``RUNTIME_POISON_CLAIMS`` times without a commit ends as
Ended(indeterminate). A claim lost with its worker (the process died) does not point at the
run, so it counts only toward the much larger ``RUNTIME_POISON_DEATHS`` (like DBOS's
recovery-attempt limit), which still ends a run that keeps killing every worker.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from django.db import connection, connections, transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest

from runtime import codec, conf, logs, metrics, registry, timers
from runtime.coordinator import WAKE_CHANNEL, Lease
from runtime.db import db_later, db_now, keep_usable, reserve_connections
from runtime.domain.model import EndCause, RunState
from runtime.errors import LeaseLost
from runtime.loop import Frontier, ToolThread, drive
from runtime.loop.driver import MESSAGE_COLUMNS, committed_message
from runtime.models import MessageRecord, Run, Thread
from runtime.operations import end_run
from runtime.signals import commit_announced

log = logging.getLogger("runtime.worker")

TIMER_CHECK_SECONDS = 1.0  # a worker looks for due timers at most this often


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Claim:
    run_id: str
    lease: Lease
    claims: int  # claims since the last commit, this one included
    failures: int  # of those, the ones whose driving raised
    frontier: Frontier | None = None


def claim(worker_id: str) -> Claim | None:
    """Take the lease of the oldest runnable run, or return None when none is runnable."""
    taken = claim_many(worker_id, 1)
    return taken[0] if taken else None


def claim_many(worker_id: str, limit: int) -> list[Claim]:
    """Take the leases of up to ``limit`` runnable runs, oldest first, in one statement;
    return them (empty when none is runnable). Runs other workers hold are skipped, never
    waited for (SKIP LOCKED on PostgreSQL; SQLite has one writer at a time)."""
    ttl = conf.lease_ttl()
    if connection.vendor == "postgresql":
        return _claim_postgres(worker_id, ttl, limit)
    with transaction.atomic():  # IMMEDIATE: the write lock is taken at BEGIN
        ids = list(
            Run.objects.runnable(db_now())
            .order_by("committed_at")
            .values_list("id", flat=True)[:limit]
        )
        if not ids:
            return []
        Run.objects.filter(id__in=ids).update(
            lease_owner=worker_id,
            lease_expires_at=db_later(ttl),
            lease_epoch=F("lease_epoch") + 1,
            claims=F("claims") + 1,
        )
        taken = {row["id"]: row for row in Run.objects.filter(id__in=ids).values(*CLAIMED)}
        versions = dict(
            Thread.objects.filter(id__in=[row["thread_id"] for row in taken.values()]).values_list(
                "id", "version"
            )
        )
        return [
            _claimed(worker_id, ttl, (*row.values(), versions[row["thread_id"]], None))
            for row in (taken[run_id] for run_id in ids)
        ]


CLAIMED = ("id", "thread_id", "lease_epoch", "claims", "failures", "snapshot", "metadata")


def _claim_postgres(worker_id: str, ttl: Any, limit: int) -> list[Claim]:
    """One statement: lock up to ``limit`` runnable runs (skipping locked ones), take their
    leases, and return each with its thread's version and committed messages (so the driver
    reads nothing before its first inference)."""
    run, thread, message = Run._meta.db_table, Thread._meta.db_table, MessageRecord._meta.db_table
    columns = ", ".join(f"m.{name}" for name in MESSAGE_COLUMNS)
    with connection.cursor() as cursor:
        cursor.execute(
            f"WITH picked AS (SELECT id FROM {run} WHERE state = 'running' "
            "  AND (lease_expires_at IS NULL OR lease_expires_at < now()) "
            "  ORDER BY committed_at LIMIT %s FOR UPDATE SKIP LOCKED) "
            f"UPDATE {run} AS r SET lease_owner = %s, lease_expires_at = now() + %s, "
            "lease_epoch = r.lease_epoch + 1, claims = r.claims + 1 "
            f"FROM picked, {thread} AS t WHERE r.id = picked.id AND t.id = r.thread_id "
            "RETURNING r.id, r.thread_id, r.lease_epoch, r.claims, r.failures, r.snapshot, "
            f"r.metadata, t.version, (SELECT coalesce(jsonb_agg(jsonb_build_array({columns}) "
            f"ORDER BY m.seq, m.idx), '[]') FROM {message} AS m WHERE m.thread_id = r.thread_id)",
            [limit, worker_id, ttl],
        )
        rows = cursor.fetchall()
    return [_claimed(worker_id, ttl, row) for row in rows]


def _claimed(worker_id: str, ttl: Any, row: tuple[Any, ...]) -> Claim:
    run_id, _thread, epoch, claims, failures, snapshot, metadata, version, messages = row
    metrics.claimed(deaths=claims - 1 - failures)
    if isinstance(snapshot, str):  # a raw cursor on PostgreSQL hands jsonb over as text
        snapshot, metadata = json.loads(snapshot), json.loads(metadata)
    if isinstance(messages, str):
        messages = json.loads(messages)
    return Claim(
        run_id,
        Lease(worker_id=worker_id, epoch=epoch, ttl=ttl),
        claims,
        failures,
        Frontier(
            run=codec.load_run(snapshot),
            version=version,
            metadata=metadata or {},
            messages=None if messages is None else [committed_message(m) for m in messages],
        ),
    )


def release(lease: Lease, run_id: str, *, failed: bool = False) -> None:
    """Give a still-Running run back (the worker stops, or its driving failed).

    A graceful stop takes its claim back from the poison budget (rolling restarts never end a
    healthy run as poison); a failure is counted as one that points at the run.
    """
    fields: dict[str, Any] = {"lease_owner": None, "lease_expires_at": None}
    if failed:
        fields["failures"] = F("failures") + 1
    else:
        fields["claims"] = Greatest(F("claims") - 1, 0)
    Run.objects.filter(
        id=run_id, state="running", lease_owner=lease.worker_id, lease_epoch=lease.epoch
    ).update(**fields)


class Heartbeat(threading.Thread):
    """Renews every lease this worker holds, every RUNTIME_HEARTBEAT_SECONDS, in one statement.

    A lease that could not be renewed is marked released: the run left Running behind the
    owner's back (an operator's cancel) or another worker took it over; its driver then stops
    at once, abandoning a call in flight.
    """

    def __init__(self) -> None:
        super().__init__(name="heartbeat", daemon=True)
        self.held: dict[str, Lease] = {}
        self.released: set[str] = set()
        self.lock = threading.Lock()
        self.done = threading.Event()

    def hold(self, run_id: str, lease: Lease) -> None:
        with self.lock:
            self.held[run_id] = lease
            self.released.discard(run_id)

    def drop(self, run_id: str) -> None:
        with self.lock:
            self.held.pop(run_id, None)
            self.released.discard(run_id)

    def is_released(self, run_id: str) -> bool:
        return run_id in self.released

    def run(self) -> None:
        try:
            while not self.done.wait(conf.heartbeat_seconds()):
                try:
                    self.beat()
                except Exception:  # a DB blip: the next beat reconnects (keep_usable)
                    log.exception("heartbeat failed; retrying at the next beat")
        finally:
            connection.close()

    def beat(self) -> None:
        with self.lock:
            held = dict(self.held)
        if not held:
            return
        keep_usable()
        owned = Q()
        for run_id, lease in held.items():
            owned |= Q(id=run_id, lease_owner=lease.worker_id, lease_epoch=lease.epoch)
        mine = Run.objects.filter(owned, state="running")
        mine.update(lease_expires_at=db_later(conf.lease_ttl()))
        renewed = set(mine.values_list("id", flat=True))
        with self.lock:
            for run_id in held.keys() - renewed:
                if run_id in self.held:
                    log.warning("run %s: lease lost or run ended by another writer", run_id)
                    self.released.add(run_id)


class Worker:
    """Runs ``concurrency`` claim-and-drive loops until stopped (or idle, with until_idle).

    ``stop()`` asks every loop to finish its current boundary and return; ``run()`` returns
    once they have.
    """

    def __init__(
        self, *, worker_id: str | None = None, concurrency: int = 1, until_idle: bool = False
    ) -> None:
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.until_idle = until_idle
        self.stopping = threading.Event()
        self.wake = threading.Event()
        self.heartbeat = Heartbeat()
        self.lock = threading.Lock()
        self.claimed: deque[Claim] = deque()  # claimed in a batch, not yet taken by a loop
        self.waiting = 0  # loops waiting for work: the next batch claims for them too
        self.timers_checked = 0.0  # time.monotonic() of the last look for due timers

    # -- signals of new work --------------------------------------------------------------

    def _on_commit(self, sender, notice, **kwargs) -> None:
        if notice.runnable:
            self.wake.set()

    def _listen_postgres(self) -> None:
        """Wake on NOTIFY from any process's commit (PostgreSQL only)."""
        import psycopg

        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        try:
            with psycopg.connect(**params, autocommit=True) as listener:
                listener.execute(f"LISTEN {WAKE_CHANNEL}")
                while not self.stopping.is_set():
                    for _ in listener.notifies(timeout=1.0, stop_after=1):
                        self.wake.set()
        except Exception:
            log.warning("LISTEN failed; falling back to polling", exc_info=True)

    # -- the loops --------------------------------------------------------------------------

    def step(self, tools: ToolThread | None = None) -> bool:
        """Claim one runnable run and drive it; return whether there was work.

        ``tools`` is the loop's tool thread (one per loop, so tool calls reuse a connection).
        Due timers are looked for at most every TIMER_CHECK_SECONDS, busy or idle, so they
        cost the busy path (and idle workers woken together) almost no round trips.
        """
        keep_usable()
        taken = self.take()
        # Looking for due timers costs one statement, so a worker looks at most once a
        # second; one about to exit when idle looks first (a due timer makes its run runnable).
        fired = self._fire_timers(now=taken is None and self.until_idle)
        if taken is None:
            return fired > 0
        log.info("run %s: claimed (epoch %s)", taken.run_id, taken.lease.epoch)
        if self._poisoned(taken):
            return True
        self._drive(taken, tools)
        return True

    def _fire_timers(self, *, now: bool = False) -> int:
        """Fire due timers if TIMER_CHECK_SECONDS passed since the last look (or ``now``);
        return how many fired."""
        if not now and time.monotonic() < self.timers_checked + TIMER_CHECK_SECONDS:
            return 0
        self.timers_checked = time.monotonic()
        return timers.fire_due()

    def take(self) -> Claim | None:
        """The next claim for this loop: one claimed for it earlier, else a new batch claimed
        in one statement for it and for every loop of this worker waiting for work."""
        with self.lock:
            if self.claimed:
                return self.claimed.popleft()
            wanted = 1 + self.waiting
        taken = claim_many(self.worker_id, wanted)
        if len(taken) > 1:
            for extra in taken[1:]:  # leased now: renewed until a loop drives it
                self.heartbeat.hold(extra.run_id, extra.lease)
            with self.lock:
                self.claimed.extend(taken[1:])
            self.wake.set()
        return taken[0] if taken else None

    def give_back(self) -> None:
        """Release the runs claimed for loops that never took them (the worker stops)."""
        with self.lock:
            left, self.claimed = list(self.claimed), deque()
        for taken in left:
            self.heartbeat.drop(taken.run_id)
            release(taken.lease, taken.run_id)

    def _poisoned(self, taken: Claim) -> bool:
        """End the run as Ended(indeterminate) when it is past its poison budget."""
        deaths = taken.claims - 1 - taken.failures  # earlier claims lost with their worker
        if taken.failures >= conf.poison_claims():
            reason = f"driving the run failed {taken.failures} times without a commit"
        elif deaths >= conf.poison_deaths():
            reason = f"the run stopped {deaths} workers without a commit"
        else:
            return False
        log.error("run %s: poison run; ending it: %s", taken.run_id, reason)
        metrics.poison_ended()
        end_run(
            taken.run_id, EndCause.INDETERMINATE, actor=f"worker:{self.worker_id}", reason=reason
        )
        return True

    def _drive(self, taken: Claim, tools: ToolThread | None) -> None:
        run_id = taken.run_id
        self.heartbeat.hold(run_id, taken.lease)
        failed, left = False, None
        try:
            left = drive(
                run_id,
                lease=taken.lease,
                should_stop=lambda: self.stopping.is_set() or self.heartbeat.is_released(run_id),
                released=lambda: self.heartbeat.is_released(run_id),
                tools=tools,
                frontier=taken.frontier,
            )
        except LeaseLost:
            log.warning("run %s: fenced; another worker owns it now", run_id)
        except Exception:  # counted by the poison budget: the next claim starts over
            log.exception("run %s: driving failed; the run is left to recovery", run_id)
            failed = True
        finally:
            self.heartbeat.drop(run_id)
        # An ended or awaiting run gave its lease up in its last commit; only a run left
        # Running (a stop, a failure) is released here.
        if left is None or left.state is RunState.RUNNING:
            release(taken.lease, run_id, failed=failed)

    def idle(self) -> bool:
        """True when no run is Running at all (Awaiting and Ended runs need no worker)."""
        return not Run.objects.filter(state="running").exists()

    def loop(self) -> None:
        logs.bind(worker_id=self.worker_id)
        tools = ToolThread()
        try:
            while not self.stopping.is_set():
                try:
                    if self.step(tools):
                        continue
                    if self.until_idle and self.idle():
                        return
                except Exception:  # a DB blip in a claim or a poison end: the loop lives on
                    log.exception("worker loop: a step failed; trying again")
                    keep_usable()
                    self.stopping.wait(conf.idle_poll_seconds())
                    continue
                with self.lock:
                    self.waiting += 1
                try:
                    self.wake.wait(conf.idle_poll_seconds())
                    self.wake.clear()
                finally:
                    with self.lock:
                        self.waiting -= 1
        finally:
            self.give_back()
            tools.close()
            connections.close_all()

    def run(self) -> None:
        """Run the loops in threads until stopped, or until idle with ``until_idle``."""
        # Each loop and its tool thread (one more while an abandoned call finishes), the
        # heartbeat, the registry and this thread keep a connection for their whole life.
        reserve_connections(3 * self.concurrency + 3)
        commit_announced.connect(self._on_commit, weak=False, dispatch_uid=id(self))
        registration = registry.start(self.worker_id, self.concurrency)
        if connection.vendor == "postgresql":
            threading.Thread(target=self._listen_postgres, name="listen", daemon=True).start()
        self.heartbeat.start()
        threads = [
            threading.Thread(target=self.loop, name=f"worker-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        try:
            for thread in threads:
                while thread.is_alive():
                    thread.join(0.2)
        finally:
            self.stopping.set()
            self.heartbeat.done.set()
            commit_announced.disconnect(dispatch_uid=id(self))
            registration.stop()

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
