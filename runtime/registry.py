"""Worker registration: each worker process says who it is and that it is alive.

A worker registers on start (id, host, pid, concurrency, code version), renews
``heartbeat_at`` every RUNTIME_HEARTBEAT_SECONDS on a daemon thread and records ``stopped_at``
when it stops gracefully. A worker killed outright simply stops beating: it is "stale" once
silent for two lease periods (``inventory.worker_status``). The rows are operational, never
thread truth: leases and the expected-version check fence workers, not this table.

Rows do not pile up: every live worker's registration deletes, at most once a minute, the rows
of stale and stopped workers silent for longer than RUNTIME_WORKER_FORGET_SECONDS that hold no
run any more (their runs were taken over or released); a stale row whose runs nobody took over
stays, since it still says something an operator must see. ``forget()`` does it by hand.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import subprocess
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from django.utils import timezone

from runtime import conf, inventory, versions
from runtime.models import Run, WorkerProcess

log = logging.getLogger("runtime.registry")

FORGET_EVERY_SECONDS = 60.0  # how often a live worker looks for rows to forget

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def code_version() -> str:
    """The running code's version: RUNTIME_CODE_VERSION, else the checkout's short git
    commit, else the installed package's version ("unknown" when none is found)."""
    given = os.environ.get("RUNTIME_CODE_VERSION", "").strip()
    if given:
        return given[:100]
    if (ROOT / ".git").exists():
        try:
            found = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            found = ""
        if found:
            return found
    try:
        return version("durable-agent-runtime")
    except PackageNotFoundError:
        return "unknown"


def register(worker_id: str, concurrency: int) -> None:
    """Create or refresh the row of ``worker_id`` for this process, with the agents' versions
    it carries (a restart under the same id takes the row over)."""
    now = timezone.now()
    WorkerProcess.objects.update_or_create(
        id=worker_id,
        defaults={
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "concurrency": concurrency,
            "version": code_version(),
            "started_at": now,
            "heartbeat_at": now,
            "stopped_at": None,
            "agents": versions.carried(),
        },
    )


def report(worker_id: str, problem: str) -> None:
    """Record why ``worker_id`` cannot work now ("" once it can again)."""
    WorkerProcess.objects.filter(id=worker_id).update(
        problem=problem[:500], problem_since=timezone.now() if problem else None
    )


def heartbeat(worker_id: str) -> None:
    """Say that ``worker_id`` is alive now (re-registers a row an operator deleted)."""
    if not WorkerProcess.objects.filter(id=worker_id).update(heartbeat_at=timezone.now()):
        register(worker_id, 1)


def stopped(worker_id: str) -> None:
    """Record a graceful stop."""
    now = timezone.now()
    WorkerProcess.objects.filter(id=worker_id).update(heartbeat_at=now, stopped_at=now)


def forget(silent_for: timedelta, *, stopped: bool = True) -> list[str]:
    """Delete the rows of workers silent for longer than ``silent_for`` (at least the stale
    threshold) that hold no run; ``stopped=False`` keeps stopped rows. Return their ids."""
    cutoff = timezone.now() - max(silent_for, inventory.stale_after())
    candidates = WorkerProcess.objects.filter(heartbeat_at__lt=cutoff)
    if not stopped:
        candidates = candidates.filter(stopped_at__isnull=True)
    holding = Run.objects.filter(lease_owner__isnull=False).values("lease_owner")
    ids = list(candidates.exclude(id__in=holding).values_list("id", flat=True))
    if ids:
        # The heartbeat condition is repeated: a row that beat meanwhile is not deleted.
        WorkerProcess.objects.filter(id__in=ids, heartbeat_at__lt=cutoff).delete()
        log.info("forgot %d silent worker(s): %s", len(ids), ", ".join(ids))
    return ids


def forget_expired() -> None:
    """Forget rows silent for longer than RUNTIME_WORKER_FORGET_SECONDS (0: never)."""
    seconds = conf.worker_forget_seconds()
    if seconds > 0:
        forget(timedelta(seconds=seconds))
