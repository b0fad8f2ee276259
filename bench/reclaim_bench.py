"""Reclaiming a dead fleet's runs: how soon a fresh worker starts, how fast it finishes them,
and whether its memory stays flat.

1. ``--runs`` demo runs are started (``start_run``, on ``--start-threads`` threads).
2. ``--doomed`` worker processes (``--max-inflight`` runs each) drive them until
   ``--kill-after`` runs have finished, then all of them are killed with SIGKILL: the runs they
   were driving are left Running under a lease that nobody renews.
3. Unless ``--only-killed``, every other Running run is then given a lease of a dead worker
   too, expiring one lease period after the kill: the state a fleet that claims in batches
   leaves behind, so that every remaining run has to be reclaimed.
4. A fresh ``runtime_worker`` process starts. Reported: the time from the kill to its first
   commit on a reclaimed run (against the lease period, ``--lease-seconds``), its runs/s from
   its first commit to its last, the outcome of every run, and its VmRSS
   (``/proc/<pid>/status``) when it has finished a tenth of the runs and all of them ("RSS at
   run 1,000 and at run 10,000" with the default 10,000 runs).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python bench/reclaim_bench.py
    python bench/reclaim_bench.py --runs 500 --lease-seconds 5

Works on the scratch database ``--database`` (default ``reclaim_bench``, dropped and
re-created), or on SQLite without DATABASE_URL.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path

from compare import ROOT, setup
from loop_bench import rss_kib, spawn, start_runs

DEAD_OWNER = "bench-dead-fleet"
POLL_SECONDS = 0.2  # how often the bench reads progress and RSS


def start_many(count: int, threads: int) -> list[str]:
    """Start ``count`` demo runs on ``threads`` threads; return their ids."""
    from django.db import connection

    def chunk(size: int) -> list[str]:
        try:
            return start_runs(size)
        finally:
            connection.close()

    sizes = [count // threads + (i < count % threads) for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        return [run_id for ids in pool.map(chunk, sizes) for run_id in ids]


def finished() -> int:
    """Runs no longer Running (Ended, or Awaiting an operator after an Indeterminate call)."""
    from runtime.models import Run

    return Run.objects.exclude(state="running").count()


def kill_fleet(count: int, concurrency: int, after: int, log: Path) -> datetime:
    """Run ``count`` workers until ``after`` runs finished, SIGKILL them; return the kill time."""
    from django.utils import timezone

    fleet = [
        spawn(["--worker-id", f"bench-doomed-{i}", "--max-inflight", str(concurrency)], log)
        for i in range(count)
    ]
    while finished() < after:
        if any(process.poll() is not None for process in fleet):
            raise SystemExit(f"a doomed worker exited early; see {log}")
        time.sleep(POLL_SECONDS / 4)
    for process in fleet:
        process.send_signal(signal.SIGKILL)
    for process in fleet:
        process.wait()
    return timezone.now()


def lease_to_dead_owner(killed_at: datetime, ttl: timedelta) -> int:
    """Give every unleased Running run a dead worker's lease ending ``ttl`` after the kill.

    Leases are operational fields, not the log: this is what a claim by the dead fleet would
    have written. Returns how many runs it leased.
    """
    from django.db.models import F

    from runtime.models import Run

    return Run.objects.filter(state="running", lease_owner__isnull=True).update(
        lease_owner=DEAD_OWNER, lease_expires_at=killed_at + ttl, lease_epoch=F("lease_epoch") + 1
    )


def follow(process, base: int, total: int, checkpoint: int, log: Path) -> tuple[int, int]:
    """Wait until the fresh worker finished ``total`` runs; return its VmRSS (KiB) after
    ``checkpoint`` runs and after all of them."""
    early = None
    while (done := finished() - base) < total:
        if process.poll() is not None:
            raise SystemExit(f"the fresh worker exited early; see {log}")
        if early is None and done >= checkpoint:
            early = rss_kib(process.pid)
        time.sleep(POLL_SECONDS)
    late = rss_kib(process.pid)
    return (early if early is not None else late), late


def fresh_commits(worker_id: str) -> tuple[datetime, datetime, int]:
    """(first, last) created_at of the fresh worker's commits, and the runs it committed to."""
    from django.db.models import Max, Min

    from runtime.models import ThreadCommit

    mine = ThreadCommit.objects.filter(actor=f"worker:{worker_id}")
    span = mine.aggregate(first=Min("created_at"), last=Max("created_at"))
    runs = mine.values("run_id").distinct().count()
    return span["first"], span["last"], runs


def outcome() -> dict[str, int]:
    """Runs per (state, end cause), and ledger effects applied more than once: by policy
    (``ledger_replay``: a replay-safe call re-run after its worker died mid-effect) and
    beyond it (any other tool: must be 0)."""
    from django.db.models import Count

    from runtime.demo.models import LedgerEffect
    from runtime.models import Run

    rows = Run.objects.values("state", "end_cause").annotate(n=Count("id"))
    result = {f"{r['state']}/{r['end_cause'] or '-'}": r["n"] for r in rows}
    repeated = LedgerEffect.objects.filter(applied__gt=1)
    result["effects applied again by replay policy"] = repeated.filter(tool="ledger_replay").count()
    result["effects applied twice beyond policy"] = repeated.exclude(tool="ledger_replay").count()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="runs left open")
    parser.add_argument("--doomed", type=int, default=2, help="worker processes killed")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="runs each doomed worker drives at once (--max-inflight)",
    )
    parser.add_argument("--kill-after", type=int, default=None, help="default: runs / 100")
    parser.add_argument("--lease-seconds", type=float, default=15.0, help="the lease period")
    parser.add_argument("--start-threads", type=int, default=4)
    parser.add_argument("--only-killed", action="store_true", help="lease no run to the dead")
    parser.add_argument("--database", default="reclaim_bench", help="scratch database name")
    args = parser.parse_args()

    os.environ["RUNTIME_LEASE_SECONDS"] = str(args.lease_seconds)
    os.environ["RUNTIME_HEARTBEAT_SECONDS"] = str(max(0.1, args.lease_seconds / 3))
    sqlite = not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    label = setup(args.database, sqlite)
    log = Path(os.environ.get("RUNTIME_VAR_DIR", ROOT / "var")) / "reclaim_bench.log"
    log.unlink(missing_ok=True)
    print(f"database: {label}; lease {args.lease_seconds:g} s; worker stderr: {log}")

    began = time.perf_counter()
    start_many(args.runs, args.start_threads)
    print(f"started {args.runs} runs in {time.perf_counter() - began:.1f} s")
    kill_after = args.kill_after if args.kill_after is not None else max(1, args.runs // 100)
    killed_at = kill_fleet(args.doomed, args.concurrency, kill_after, log)
    ttl = timedelta(seconds=args.lease_seconds)
    base = finished()
    leased = 0 if args.only_killed else lease_to_dead_owner(killed_at, ttl)
    print(
        f"SIGKILLed {args.doomed} workers after {base} runs finished; {args.runs - base} left "
        f"Running, {leased} of them given a dead worker's lease"
    )

    fresh = spawn(["--worker-id", "bench-fresh"], log)
    try:
        rss = follow(fresh, base, args.runs - base, (args.runs - base) // 10, log)
    finally:
        fresh.send_signal(signal.SIGTERM)
        fresh.wait(timeout=60)
    first, last, runs = fresh_commits("bench-fresh")
    print(
        f"fresh worker: first commit {(first - killed_at).total_seconds():.2f} s after the kill "
        f"(lease period {args.lease_seconds:g} s); {runs} runs at "
        f"{runs / max((last - first).total_seconds(), 1e-9):.1f} runs/s (first to last commit)"
    )
    print(
        f"fresh worker RSS: {rss[0] / 1024:.1f} MiB at run {(args.runs - base) // 10}, "
        f"{rss[1] / 1024:.1f} MiB at run {args.runs - base} ({(rss[1] - rss[0]) / 1024:+.1f} MiB)"
    )
    print("outcome:", ", ".join(f"{k}: {v}" for k, v in outcome().items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
