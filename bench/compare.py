"""Runs per second of the demo workload on our runtime, DBOS Transact and LangGraph, side by side.

The workload (see ``bench/peers/workload.py``): one model Step with three ledger tool calls, run
one after another, then a text-only Step; a scripted model, no network; every tool call writes
one ledger row keyed by its operation id. Measured on one PostgreSQL database, in interleaved
rounds (the order rotates every round), each figure the median over the rounds:

- ours, 1 and 4 ``manage.py runtime_worker`` processes (already running when the runs start;
  runs are started with ``start_run`` one after another; runs/s from the first start to the
  last commit);
- DBOS, a workflow with one step per inference and per tool call, called by 1 and 4 threads,
  and through a DBOS queue with ``worker_concurrency`` 4 (runs/s over the wall time);
- LangGraph, a StateGraph (model node, tools node) with ``PostgresSaver``, durability "sync",
  invoked by 1 and 4 threads (runs/s over the wall time).

Also for every system: new PostgreSQL sessions per run and transactions per run (deltas of
``pg_stat_database`` over the timed runs). For ours: SQL statements per run and per worker
commit and connections opened, counted on every connection of one in-process Worker driving
``--count-runs`` runs, and the median time from a run's start to its first worker commit.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres python bench/compare.py
    python bench/compare.py --runs 200 --rounds 5 --json var/compare.json
    python bench/compare.py --sqlite        # ours only, one worker, on SQLite (WAL)

The database ``--database`` (default ``runtime_bench``) is dropped and re-created on the server
of DATABASE_URL. The peers need the ``bench`` extra: ``pip install -e '.[bench]'``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import math
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peers.workload import SETTLE_ENV, server_counters

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True, slots=True)
class System:
    """One measured configuration: ours with ``workers`` processes, or a peer module's CLI."""

    name: str
    workers: int = 0  # ours only
    module: str = ""  # a peer: ``peers.<module>``
    args: tuple[str, ...] = ()
    needs: str = ""  # the peer's package, to skip it when it is not installed


SYSTEMS = (
    System("ours, 1 worker", workers=1),
    System("ours, 4 workers", workers=4),
    System("DBOS, 1 thread", module="peers.dbos_peer", args=("--threads", "1"), needs="dbos"),
    System("DBOS, 4 threads", module="peers.dbos_peer", args=("--threads", "4"), needs="dbos"),
    System(
        "DBOS queue, 4",
        module="peers.dbos_peer",
        args=("--threads", "4", "--queue"),
        needs="dbos",
    ),
    System(
        "LangGraph, 1 thread",
        module="peers.langgraph_peer",
        args=("--threads", "1"),
        needs="langgraph",
    ),
    System(
        "LangGraph, 4 threads",
        module="peers.langgraph_peer",
        args=("--threads", "4"),
        needs="langgraph",
    ),
)
RATIOS = (  # (ours, peer): the targets compare these
    ("ours, 1 worker", "DBOS, 1 thread"),
    ("ours, 1 worker", "LangGraph, 1 thread"),
    ("ours, 4 workers", "DBOS, 4 threads"),
    ("ours, 4 workers", "DBOS queue, 4"),
    ("ours, 4 workers", "LangGraph, 4 threads"),
)


@dataclass
class Results:
    """Every round's figures per system name (each a dict of the measurement's fields)."""

    rounds: dict[str, list[dict[str, float]]] = field(default_factory=dict)

    def add(self, name: str, figures: dict[str, float]) -> None:
        self.rounds.setdefault(name, []).append(figures)

    def median(self, name: str, key: str) -> float:
        values = [r[key] for r in self.rounds.get(name, []) if not math.isnan(r.get(key, math.nan))]
        return statistics.median(values) if values else math.nan


def setup(database: str, sqlite: bool) -> str:
    """Create the scratch database, set Django up on it and migrate; return its label."""
    from loop_bench import scratch_database

    if sqlite:
        os.environ["DATABASE_URL"] = ""
    elif not os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        raise SystemExit("set DATABASE_URL to a PostgreSQL server (or use --sqlite)")
    label = scratch_database(database)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    # One INFO line per commit would time the log; the workers inherit this too.
    os.environ.setdefault("RUNTIME_LOG_LEVEL", "WARNING")
    import django
    from django.core.management import call_command

    django.setup()
    logging.getLogger("runtime").setLevel(logging.WARNING)
    call_command("migrate", verbosity=0)
    return label


def measure_peer(system: System, runs: int, log: Path) -> dict[str, float]:
    """Run the peer's CLI in a subprocess and return the JSON figures it prints."""
    with log.open("ab") as err:
        done = subprocess.run(
            [sys.executable, "-m", system.module, "--runs", str(runs), *system.args],
            cwd=BENCH,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
            stderr=err,
            check=False,
        )
    if done.returncode:
        raise SystemExit(f"{system.name} failed ({done.returncode}); see {log}")
    return json.loads(done.stdout.decode().strip().splitlines()[-1])


def measure(system: System, args: argparse.Namespace, log: Path) -> dict[str, float]:
    """One round's figures of one system."""
    if system.module:
        return measure_peer(system, args.runs, log)
    from ours import measure_live

    counters = None if args.sqlite else server_counters
    return measure_live(system.workers, args.runs, args.probes, log, counters)


def chosen_systems(args: argparse.Namespace) -> list[System]:
    """The systems to measure: ours with 1 worker on SQLite; else all whose packages exist."""
    if args.sqlite:
        return [SYSTEMS[0]] if args.rounds else []
    chosen = []
    for system in SYSTEMS:
        if system.needs and importlib.util.find_spec(system.needs) is None:
            print(f"skipping {system.name}: {system.needs} is not installed (the bench extra)")
            continue
        if not args.only or any(word.lower() in system.name.lower() for word in args.only):
            chosen.append(system)
    return chosen


def _figure(value: float, spec: str, unit: str = "") -> str:
    """``value`` formatted, or "-" when it was not measured (NaN)."""
    return "-" if math.isnan(value) else f"{value:{spec}}{unit}"


def print_table(results: Results, systems: list[System], rounds: int) -> None:
    print(
        f"\n{'system':<22} {'runs/s':>8} {'min-max':>13} {'sessions/run':>13} "
        f"{'xacts/run':>10} {'start->1st commit':>18}"
    )
    for system in systems:
        rates = [r["runs_per_second"] for r in results.rounds[system.name]]
        median = results.median
        print(
            f"{system.name:<22} {median(system.name, 'runs_per_second'):>8.1f} "
            f"{f'{min(rates):.1f}-{max(rates):.1f}':>13} "
            f"{_figure(median(system.name, 'sessions_per_run'), '.2f'):>13} "
            f"{_figure(median(system.name, 'transactions_per_run'), '.1f'):>10} "
            f"{_figure(median(system.name, 'first_commit_ms'), '.1f', ' ms'):>18}"
        )
    print(f"(each figure the median of {rounds} rounds)")
    names = {system.name for system in systems}
    pairs = [(a, b) for a, b in RATIOS if a in names and b in names]
    if pairs:
        print("\nratios (runs/s, medians):")
    for ours, peer in pairs:
        ratio = results.median(ours, "runs_per_second") / results.median(peer, "runs_per_second")
        print(f"  {ours} / {peer}: {ratio:.2f}x")


def print_counts(counts: dict[str, Any], show_kinds: bool) -> None:
    runs, commits = counts["runs"], counts["commits"]
    tools = counts["tool_statements"]
    runtime = counts["statements"] - tools
    print(
        f"\nours, counted on one in-process worker driving {runs} runs "
        f"({commits / runs:.1f} worker commits per run; BEGIN/COMMIT are not statements here):\n"
        f"  {counts['statements'] / runs:.1f} SQL statements per run: {runtime / runs:.1f} by the "
        f"runtime ({runtime / max(commits, 1):.1f} per worker commit) + {tools / runs:.1f} by the "
        f"demo tools' ledger writes\n"
        f"  {counts['connections']} new database connections in all "
        f"({counts['connections'] / runs:.2f} per run, start-up included)\n"
        f"  start_run: {counts['start_statements'] / runs:.1f} statements per run"
    )
    if "transactions" in counts:
        print(
            f"  {counts['transactions'] / runs:.1f} transactions per run while the worker ran "
            "(pg_stat_database: each is a BEGIN..COMMIT or a lone statement)"
        )
    if show_kinds:
        for kind, count in counts["kinds"].items():
            print(f"    {count / runs:6.2f}/run  {kind}")


def targets(
    results: Results, counts: dict[str, Any], sqlite: bool
) -> list[tuple[str, float, bool]]:
    """Issue 9's targets as (target, measured figure, met); those not measured are left out."""
    rate = results.median

    def ratio(ours: str, peer: str) -> float:
        return rate(ours, "runs_per_second") / rate(peer, "runs_per_second")

    runs, commits = counts["runs"], max(counts["commits"], 1)
    runtime = counts["statements"] - counts["tool_statements"]
    measured = [rate(f"ours, {n}", "sessions_per_run") for n in ("1 worker", "4 workers")]
    sessions = max((x for x in measured if not math.isnan(x)), default=math.nan)
    rows = [
        ("ours 1 worker >= 1.5x DBOS 1 thread", ratio("ours, 1 worker", "DBOS, 1 thread"), 1.5),
        (
            "ours 1 worker >= LangGraph 1 thread",
            ratio("ours, 1 worker", "LangGraph, 1 thread"),
            1.0,
        ),
        ("ours 4 workers >= 1.5x DBOS 4 threads", ratio("ours, 4 workers", "DBOS, 4 threads"), 1.5),
        (
            "SQLite, 1 worker >= 50 runs/s",
            rate("ours, 1 worker", "runs_per_second") if sqlite else math.nan,
            50,
        ),
    ]
    met = [(name, value, value >= floor) for name, value, floor in rows if not math.isnan(value)]
    ceilings = [("0 new connections per run, steady state", sessions, 0)]
    if not sqlite:  # the statement targets are PostgreSQL's (issue 9, Deliver 3)
        ceilings += [
            ("<= 20 SQL statements per run (tools' included)", counts["statements"] / runs, 20),
            ("<= 3 statements per worker commit", runtime / commits, 3),
        ]
    met += [(name, value, value <= top) for name, value, top in ceilings if not math.isnan(value)]
    return met


def print_targets(rows: list[tuple[str, float, bool]]) -> None:
    print("\nissue 9 targets:")
    for name, value, met in rows:
        print(f"  {'met    ' if met else 'MISSED '} {name}: {value:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="timed runs per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--count-runs", type=int, default=60, help="runs for statement counts")
    parser.add_argument("--probes", type=int, default=10, help="runs for start->commit latency")
    parser.add_argument("--database", default="runtime_bench", help="scratch database name")
    parser.add_argument("--sqlite", action="store_true", help="ours only, 1 worker, on SQLite")
    parser.add_argument("--kinds", action="store_true", help="list statements by kind")
    parser.add_argument("--json", type=Path, help="also write every round's figures here")
    parser.add_argument(
        "--settle",
        type=float,
        default=1.2,
        help="seconds to wait before each pg_stat_database read; over 10 rules out the "
        "statistics of idle backends arriving late (sessions/run exact, slower bench)",
    )
    parser.add_argument(
        "--only", nargs="+", default=[], help="measure only systems whose name contains one"
    )
    args = parser.parse_args()

    os.environ[SETTLE_ENV] = str(args.settle)  # read by this process and the peers
    label = setup(args.database, args.sqlite)
    log = Path(os.environ.get("RUNTIME_VAR_DIR", ROOT / "var")) / "compare.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.unlink(missing_ok=True)
    systems = chosen_systems(args)
    print(f"database: {label}; cpus: {os.cpu_count()}; subprocess stderr: {log}")
    print(f"workload: 1 step x 3 ledger calls + 1 text step; {args.runs} runs per measurement")

    results = Results()
    for round_ in range(args.rounds):
        order = systems[round_ % len(systems) :] + systems[: round_ % len(systems)]
        for system in order:
            figures = measure(system, args, log)
            results.add(system.name, figures)
            rate = figures["runs_per_second"]
            print(f"  round {round_ + 1}: {system.name:<22} {rate:7.1f} runs/s")
    if args.rounds:
        print_table(results, systems, args.rounds)

    from ours import count_statements

    counts = count_statements(args.count_runs, None if args.sqlite else server_counters)
    print_counts(counts, args.kinds)
    print_targets(targets(results, counts, args.sqlite))
    if args.json:
        args.json.write_text(json.dumps({"rounds": results.rounds, "counts": counts}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
