"""The worker: claims runnable Runs under a lease, drives them, and wakes promptly.

Claims use ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL and the IMMEDIATE write lock on
SQLite; each claim bumps the run's lease epoch, and every commit of the owner is fenced on
(owner, epoch), so a stale owner whose lease expired can write nothing more. A heartbeat
renews the lease while the owner works. A run that is claimed more than the poison budget
without a single commit ends as Ended(indeterminate) rather than killing workers forever.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass

from django.db import close_old_connections, connection, connections, transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from runtime import conf
from runtime.coordinator import WAKE_CHANNEL, Lease
from runtime.domain.model import EndCause
from runtime.errors import LeaseLost
from runtime.loop import ToolThread, drive
from runtime.models import Run
from runtime.operations import end_run
from runtime.signals import commit_announced

log = logging.getLogger("runtime.worker")


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Claim:
    run_id: str
    lease: Lease
    claims: int


def claim(worker_id: str) -> Claim | None:
    """Take the lease of the oldest runnable run, or return None when none is runnable."""
    now = timezone.now()
    ttl = conf.lease_ttl()
    with transaction.atomic():
        rows = Run.objects.runnable(now).order_by("committed_at")
        if connection.vendor == "postgresql":
            rows = rows.select_for_update(skip_locked=True)
        row = rows.values("id", "lease_epoch", "claims").first()
        if row is None:
            return None
        epoch = row["lease_epoch"] + 1
        taken = Run.objects.filter(id=row["id"], lease_epoch=row["lease_epoch"]).update(
            lease_owner=worker_id,
            lease_expires_at=now + ttl,
            lease_epoch=epoch,
            claims=F("claims") + 1,
        )
        if taken != 1:  # another process got there first
            return None
    return Claim(row["id"], Lease(worker_id=worker_id, epoch=epoch, ttl=ttl), row["claims"] + 1)


def renew(lease: Lease, run_id: str) -> str:
    """Extend the lease of a Running run. Return "held", "ended" (another writer moved the
    run out of Running: an operator's cancel) or "lost" (another worker took it over)."""
    mine = Run.objects.filter(id=run_id, lease_owner=lease.worker_id, lease_epoch=lease.epoch)
    if mine.filter(state="running").update(lease_expires_at=timezone.now() + lease.ttl):
        return "held"
    return "ended" if mine.exists() else "lost"


def release(lease: Lease, run_id: str, *, graceful: bool = False) -> None:
    """Give the run back (a stop while it is still Running).

    A graceful stop takes its claim back from the poison budget: the run did not kill the
    worker, so rolling restarts never end a healthy run as poison.
    """
    fields = {"lease_owner": None, "lease_expires_at": None}
    if graceful:
        fields["claims"] = Greatest(F("claims") - 1, 0)
    Run.objects.filter(id=run_id, lease_owner=lease.worker_id, lease_epoch=lease.epoch).update(
        **fields
    )


class Heartbeat(threading.Thread):
    """Renews one lease every RUNTIME_HEARTBEAT_SECONDS; ``stop_driving`` is set when the
    lease is lost or the run left Running behind the owner's back (so that a replay-safe call
    in flight is abandoned at once)."""

    def __init__(self, claim: Claim) -> None:
        super().__init__(name=f"heartbeat-{claim.run_id}", daemon=True)
        self.claim = claim
        self.done = threading.Event()
        self.stop_driving = threading.Event()
        self.lost = False

    def run(self) -> None:
        try:
            while not self.done.wait(conf.heartbeat_seconds()):
                status = renew(self.claim.lease, self.claim.run_id)
                if status == "held":
                    continue
                if not self.done.is_set():
                    log.warning(
                        "run %s: %s",
                        self.claim.run_id,
                        "lease lost" if status == "lost" else "ended by another writer",
                    )
                self.lost = status == "lost"
                self.stop_driving.set()
                return
        finally:
            connection.close()


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
        """
        close_old_connections()
        taken = claim(self.worker_id)
        if taken is None:
            return False
        log.info("run %s: claimed (epoch %s)", taken.run_id, taken.lease.epoch)
        if taken.claims > conf.poison_claims():
            reason = f"the run stopped {taken.claims - 1} workers without a commit"
            log.error("run %s: poison run; ending it: %s", taken.run_id, reason)
            end_run(
                taken.run_id,
                EndCause.INDETERMINATE,
                actor=f"worker:{self.worker_id}",
                reason=reason,
            )
            return True
        beat = Heartbeat(taken)
        beat.start()
        graceful = False
        try:
            drive(
                taken.run_id,
                lease=taken.lease,
                should_stop=lambda: self.stopping.is_set() or beat.stop_driving.is_set(),
                tools=tools,
            )
            graceful = True
        except LeaseLost:
            log.warning("run %s: fenced; another worker owns it now", taken.run_id)
        except Exception:  # counted by the poison budget: the next claim starts over
            log.exception("run %s: driving failed; the run is left to recovery", taken.run_id)
        finally:
            beat.done.set()
            beat.join()
            if not beat.lost:
                release(taken.lease, taken.run_id, graceful=graceful)
        return True

    def idle(self) -> bool:
        """True when no run is Running at all (Awaiting and Ended runs need no worker)."""
        return not Run.objects.filter(state="running").exists()

    def loop(self) -> None:
        tools = ToolThread()
        try:
            while not self.stopping.is_set():
                if self.step(tools):
                    continue
                if self.until_idle and self.idle():
                    return
                self.wake.wait(conf.idle_poll_seconds())
                self.wake.clear()
        finally:
            tools.close()
            connections.close_all()

    def run(self) -> None:
        """Run the loops in threads until stopped, or until idle with ``until_idle``."""
        commit_announced.connect(self._on_commit, weak=False, dispatch_uid=id(self))
        if connection.vendor == "postgresql":
            threading.Thread(target=self._listen_postgres, name="listen", daemon=True).start()
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
            commit_announced.disconnect(dispatch_uid=id(self))

    def stop(self) -> None:
        self.stopping.set()
        self.wake.set()
