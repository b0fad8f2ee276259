"""Prune under load (issue 28, item 6): a day's prune beside an operator reading the console.

    .venv/bin/python bench/prune_load.py --runs 100000 [--ended-before 45] [--rounds 5]

On a copy of a database ``bench/history.py --build`` made (``<prefix>_<runs>_prune``, made
from it as a template and dropped afterwards, so the history stays for later runs), daphne
serves the console and one client reads a loop of pages (the runs list, a deep page, a run
page, the inbox, audit, the API's runs) ``--rounds`` times to know their times at rest; then
``manage.py runtime_prune --ended-before DAYS --json`` runs as a process while the client
keeps reading until it ends. Printed: what prune deleted, its wall time and CPU seconds
(``os.wait4``'s rusage of the process: user + system), runs pruned per second, and each read's
p50 / p95 (ms) at rest and during the prune. ``--json PATH`` keeps the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import history

ROOT = Path(__file__).resolve().parent.parent
READS = (
    ("console runs", "console", "/"),
    ("console runs, deep", "console", "/?cursor={deep}"),
    ("console run page", "console", "/runs/{run}/"),
    ("console inbox", "console", "/inbox/"),
    ("console audit", "console", "/audit/"),
    ("api runs", "api", "/api/v1/runs"),
)


def copy_database(url: str, source: str, target: str) -> None:
    with history.admin_connect(url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{target}"')
        admin.execute(f'CREATE DATABASE "{target}" TEMPLATE "{source}"')


def drop_database(url: str, name: str) -> None:
    with history.admin_connect(url) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def reads_of_this_history() -> list[tuple[str, str, str]]:
    from runtime.models import Run

    deep = history.cursor_at(Run, 0.25)  # a page prune leaves (newer than the cutoff)
    run = history.pick(Run.objects.order_by("-created_at").values_list("id"))
    return [(name, kind, path.format(deep=deep, run=run)) for name, kind, path in READS]


def read_loop(base: str, reads, cookie: str, token: str, stop: threading.Event, rounds: int):
    """Read every page in turn until ``stop`` is set (or ``rounds`` rounds, when given):
    ``{name: [ms, ...]}``."""
    import httpx

    times: dict[str, list[float]] = {name: [] for name, _, _ in reads}
    done = 0
    with httpx.Client(base_url=base, timeout=120) as client:
        while not stop.is_set() and (rounds == 0 or done < rounds):
            for name, kind, path in reads:
                headers = (
                    {"Cookie": f"sessionid={cookie}"}
                    if kind == "console"
                    else {"Authorization": f"Bearer {token}"}
                )
                started = time.perf_counter()
                client.get(path, headers=headers).raise_for_status()
                times[name].append((time.perf_counter() - started) * 1000)
            done += 1
    return times


def prune_process(env: dict[str, str], days: float) -> dict[str, Any]:
    """Run runtime_prune as a process: its JSON report and wall seconds (its CPU is read by
    the caller from ``os.times()``' children, which count it once it is reaped)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "manage.py", "runtime_prune", "--ended-before", str(days), "--json"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out, err = process.communicate()
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"runtime_prune failed:\n{err}")
    return {"report": json.loads(out), "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=history.DEFAULT_URL, help="the server")
    parser.add_argument("--database-prefix", default="hist_bench")
    parser.add_argument("--runs", type=int, required=True, help="the built history's size")
    parser.add_argument("--ended-before", type=float, default=history.DAYS // 2)
    parser.add_argument("--rounds", type=int, default=5, help="rounds of reads at rest")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    server = args.database_url.rstrip("/")
    source = f"{args.database_prefix}_{args.runs}"
    target = f"{source}_prune"
    copy_database(server + "/", source, target)
    try:
        url = f"{server}/{target}"
        history.setup_django(url)
        env = history.environment(url)
        _, cookie, token = history.sign_in()
        reads = reads_of_this_history()
        from django.db import connections

        connections.close_all()
        with history.serve(env) as base:
            rest = read_loop(base, reads, cookie, token, threading.Event(), args.rounds)
            stop = threading.Event()
            during: dict[str, list[float]] = {}

            def reader() -> None:
                during.update(read_loop(base, reads, cookie, token, stop, 0))

            thread = threading.Thread(target=reader)
            before = os.times()
            thread.start()
            pruned = prune_process(env, args.ended_before)
            after = os.times()
            stop.set()
            thread.join()
    finally:
        drop_database(server + "/", target)
    cpu = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    runs = pruned["report"]["pruned"]["runs"]
    figures = {
        "database": source,
        "pruned": pruned["report"]["pruned"],
        "kept_threads": len(pruned["report"]["kept"]),
        "prune_wall_s": round(pruned["wall_s"], 2),
        "prune_cpu_s": round(cpu, 2),
        "runs_per_s": round(runs / pruned["wall_s"]),
        "reads": {
            name: {
                "rest": history.percentiles(rest[name]),
                "during": history.percentiles(during[name]) if during.get(name) else None,
                "during_n": len(during.get(name, [])),
            }
            for name in rest
        },
    }
    print(f"## Prune under load, {source}\n")
    print(
        f"pruned {figures['pruned']} (kept {figures['kept_threads']} threads) in "
        f"{figures['prune_wall_s']} s wall, {figures['prune_cpu_s']} s CPU: "
        f"{figures['runs_per_s']:,} runs/s\n"
    )
    print("| read | at rest p50 / p95 ms | during prune p50 / p95 ms (n) |")
    print("|---|---|---|")
    for name, fig in figures["reads"].items():
        rest_cell = "{:.1f} / {:.1f}".format(*fig["rest"])
        during_cell = (
            "{:.1f} / {:.1f}".format(*fig["during"]) + f" ({fig['during_n']})"
            if fig["during"]
            else "-"
        )
        print(f"| {name} | {rest_cell} | {during_cell} |")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
