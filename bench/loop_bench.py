"""Runs per second of the demo agent through real worker processes, against an in-memory floor.

The workload is the demo agent with a scripted model: one Step with three ledger calls
(ledger_once, ledger_reconnect, ledger_replay) and a final text Step: ten commits per run, nine
of them by the worker. Three measurements:

- **workers**: ``--runs`` runs are started, then 1 and 4 ``manage.py runtime_worker
  --until-idle`` processes drive them all. Reported twice: over the wall time from spawning the
  workers to their exit (process start-up included), and over the span from the first worker
  commit to the last (steady state).
- **floor**: the same agent loop with no database at all: the pure domain's ``next_action`` and
  ``apply_commit`` on in-memory state, the scripted provider, the request built and digested
  as the loop does, and the tools' work without the ledger write.
  Beside them, the workers' CPU per run (user + system, from ``/proc/self/stat``'s
  ``cutime`` + ``cstime`` across the wait for them, start-up included).
- **memory**: one worker drives ``--rss-runs`` runs; its VmRSS (``/proc/<pid>/status``) is read
  after its first runs and at the end.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/x python bench/loop_bench.py
    python bench/loop_bench.py --runs 200 --rss-runs 1000 --workers 1 4

It works on a scratch PostgreSQL database it creates and migrates itself (``loop_bench`` on the
server of DATABASE_URL, dropped and re-created); SQLite (``loop_bench.sqlite3`` under
RUNTIME_VAR_DIR) when DATABASE_URL is unset or SQLite, which serializes writers.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRATCH_PG = "loop_bench"
SCRIPT = {
    "steps": [
        {
            "tool_calls": [
                {"name": "ledger_once", "arguments": {"key": "a"}},
                {"name": "ledger_reconnect", "arguments": {"key": "b"}},
                {"name": "ledger_replay", "arguments": {"key": "c"}},
            ]
        },
        {"text": "All three keys are recorded."},
    ]
}


def scratch_database(name: str = SCRATCH_PG) -> str:
    """Point DATABASE_URL at a fresh scratch database ``name`` (dropped and re-created on the
    server of DATABASE_URL, or a SQLite file when it is unset or SQLite); return a label."""
    import dj_database_url

    url = os.environ.get("DATABASE_URL", "")
    if url and not url.startswith("sqlite"):
        import psycopg

        config = dj_database_url.parse(url)
        with psycopg.connect(
            dbname="postgres",
            host=config.get("HOST") or None,
            port=config.get("PORT") or None,
            user=config.get("USER") or None,
            password=config.get("PASSWORD") or None,
            autocommit=True,
        ) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            db.execute(f'CREATE DATABASE "{name}"')
        os.environ["DATABASE_URL"] = f"{url.rsplit('/', 1)[0]}/{name}"
        return f"postgresql ({name} on {config['HOST']}:{config['PORT']})"
    var = Path(os.environ.get("RUNTIME_VAR_DIR", ROOT / "var"))
    var.mkdir(parents=True, exist_ok=True)
    path = var / f"{name}.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    return f"sqlite ({path})"


# -- through the database ------------------------------------------------------------------------


def reset() -> None:
    from runtime.demo.models import LedgerEffect
    from runtime.models import LateEvidence, StreamCheckpoint, Thread

    LateEvidence.objects.all().delete()
    StreamCheckpoint.objects.all().delete()
    LedgerEffect.objects.all().delete()
    Thread.objects.all().delete()  # cascades to runs, commits and projections


def start_runs(count: int) -> list[str]:
    from runtime.operations import start_run

    return [
        start_run(agent="demo", input="Record a, b and c.", metadata={"script": SCRIPT})
        for _ in range(count)
    ]


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("RUNTIME_CRASH_AT", None)
    if not env.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://")):
        # SQLite has no NOTIFY across processes: a worker process finds new runs by polling.
        # On PostgreSQL NOTIFY wakes it and the default poll stands (a shorter one only
        # spends the two cores on empty claims).
        env.setdefault("RUNTIME_IDLE_POLL_SECONDS", "0.05")
    env["DJANGO_SETTINGS_MODULE"] = "console.settings"
    return env


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as err:
        return subprocess.Popen(
            [sys.executable, "manage.py", "runtime_worker", *args],
            cwd=ROOT,
            env=worker_env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def check_outcome(run_ids: list[str]) -> None:
    """Every run ended naturally with each of its three effects applied exactly once."""
    from django.db.models import Count

    from runtime.demo.models import LedgerEffect
    from runtime.models import Run

    ended = Run.objects.filter(id__in=run_ids, state="ended", end_cause="natural").count()
    applied = (
        LedgerEffect.objects.filter(run_id__in=run_ids).values("applied").annotate(n=Count("id"))
    )
    if ended != len(run_ids) or list(applied) != [{"applied": 1, "n": 3 * len(run_ids)}]:
        raise SystemExit(f"wrong outcome: {ended}/{len(run_ids)} ended naturally, {list(applied)}")


def commit_span(run_ids: list[str]) -> float:
    from django.db.models import Max, Min

    from runtime.models import ThreadCommit

    span = ThreadCommit.objects.filter(run_id__in=run_ids, actor__startswith="worker:").aggregate(
        first=Min("created_at"), last=Max("created_at")
    )
    return (span["last"] - span["first"]).total_seconds()


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children it has waited for
    (``cutime`` + ``cstime`` of ``/proc/self/stat``)."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def measure_workers(workers: int, runs: int, log: Path) -> dict[str, float]:
    reset()
    run_ids = start_runs(runs)
    began, cpu = time.perf_counter(), children_cpu()
    processes = [
        spawn(["--until-idle", "--worker-id", f"bench-{workers}-{i}"], log) for i in range(workers)
    ]
    codes = [p.wait() for p in processes]
    wall = time.perf_counter() - began
    if any(codes):
        raise SystemExit(f"a worker failed ({codes}); see {log}")
    check_outcome(run_ids)
    return {
        "wall": runs / wall,
        "steady": runs / commit_span(run_ids),
        "cpu": (children_cpu() - cpu) / runs,  # the workers' CPU, their start-up included
    }


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def measure_memory(runs: int, log: Path) -> tuple[int, int, int]:
    """One long-lived worker drives ``runs`` runs: (RSS after 50 runs, after all, runs/s)."""
    from runtime.models import Run

    reset()
    run_ids = start_runs(runs)
    process = spawn(["--worker-id", "bench-rss"], log)
    early = None
    try:
        while True:
            ended = Run.objects.filter(state="ended").count()
            if early is None and ended >= min(50, runs):
                early = rss_kib(process.pid)
            if ended == runs:
                break
            if process.poll() is not None:
                raise SystemExit(f"the worker exited early; see {log}")
            time.sleep(0.2)
        late = rss_kib(process.pid)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    check_outcome(run_ids)
    assert early is not None
    return early, late, round(runs / commit_span(run_ids))


# -- the floor: the same loop in memory ------------------------------------------------------------


def floor(runs: int) -> float:
    """Runs per second of the demo loop on in-memory state, with no commit and no ledger."""
    from runtime.agents import get_agent
    from runtime.domain import recovery as rec
    from runtime.domain.commit import CommitDraft, apply_commit, publication
    from runtime.domain.events import (
        BatchFinalized,
        BatchOpened,
        CallCompleted,
        CallExecuting,
        RunActivated,
        StepCommitted,
    )
    from runtime.domain.model import Disposition, EndCause, Message, RunView, ThreadHead
    from runtime.loop import RunDriver
    from runtime.providers.base import InferenceContext, InferenceRequest, ToolSpec
    from runtime.providers.scripted import ScriptedProvider, parse_script
    from runtime.tools import ToolContext

    agent = get_agent("demo")
    specs = tuple(
        ToolSpec(name=t.name, description=t.description, parameters=t.parameters)
        for t in agent.tools
    )

    def effect(ctx: ToolContext, key: str) -> dict[str, Any]:  # the ledger tools, minus the write
        return {"recorded": key, "operation_id": ctx.operation_id}

    free = {t.name: replace(t, fn=effect) for t in agent.tools}  # same parsing and encoding

    def one_run() -> None:
        thread_id, run_id = uuid.uuid4().hex, uuid.uuid4().hex
        head = ThreadHead(thread_id=thread_id)
        run: RunView | None = None
        messages: list[Message] = []

        def commit(disposition, events=(), new=()):
            nonlocal head, run
            draft = CommitDraft(
                thread_id=thread_id,
                run_id=run_id,
                expected_version=head.version,
                disposition=disposition,
                messages=tuple(new),
                events=tuple(events),
            )
            head, run = apply_commit(head, run, draft)
            messages.extend(new)

        commit(
            Disposition.running(),
            (RunActivated(run_id=run_id, agent="demo", metadata={"script": SCRIPT}),),
            (Message(role="user", content="Record a, b and c."),),
        )
        provider = ScriptedProvider(parse_script(SCRIPT))
        while True:
            assert run is not None  # the activation committed it
            action = rec.next_action(run, agent.step_limit)
            match action:
                case rec.Idle():
                    return
                case rec.Infer(step=step):
                    request = InferenceRequest(
                        model=agent.provider.model,
                        instructions=agent.instructions,
                        messages=tuple(messages),
                        tools=specs,
                        options=dict(agent.provider.options),
                    )
                    ctx = InferenceContext(
                        run_id=run_id,
                        step=step,
                        attempt=1,
                        metadata={},
                        on_delta=lambda delta: None,
                    )
                    result = asyncio.run(provider.infer(request, ctx))
                    blocks = tuple(
                        {"id": c.id, "name": c.name, "arguments": c.arguments}
                        for c in result.tool_calls
                    )
                    meta = {
                        "request_sha256": request.digest(),
                        "finish_reason": result.finish_reason,
                    }
                    message = Message(
                        role="assistant", content=result.text, tool_calls=blocks, meta=meta
                    )
                    if not result.tool_calls:
                        commit(
                            Disposition.ended(EndCause.NATURAL),
                            (StepCommitted(step=step),),
                            (message,),
                        )
                        continue
                    calls = tuple(
                        RunDriver.pin(agent, i, out) for i, out in enumerate(result.tool_calls)
                    )
                    commit(
                        Disposition.running(),
                        (StepCommitted(step=step), BatchOpened(step=step, calls=calls)),
                        (message,),
                    )
                case rec.Gate(call=call):
                    tool = agent.tool(call.name)
                    assert tool is not None  # the script calls the demo agent's own tools
                    arguments = tool.parse(call.arguments_text)
                    commit(
                        Disposition.running(),
                        (CallExecuting(call_id=call.call_id, attempt=1, worker="floor"),),
                    )
                    tool_ctx = ToolContext(
                        run_id=run_id,
                        call_id=call.call_id,
                        operation_id=call.operation_id,
                        attempt=1,
                        worker_id="floor",
                    )
                    text = free[call.name].run(tool_ctx, arguments)
                    commit(
                        Disposition.running(), (CallCompleted(call_id=call.call_id, result=text),)
                    )
                case rec.Finalize(batch=batch):
                    commit(
                        Disposition.running(),
                        (BatchFinalized(step=batch.step),),
                        publication(batch),
                    )
                case _:
                    raise AssertionError(f"unexpected action {action}")

    one_run()  # warm caches (pydantic adapters, agent registry)
    began = time.perf_counter()
    for _ in range(runs):
        one_run()
    return runs / (time.perf_counter() - began)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="runs per worker measurement")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rss-runs", type=int, default=1000, help="runs for the memory reading")
    parser.add_argument("--floor-runs", type=int, default=2000)
    options = parser.parse_args()

    sys.path.insert(0, str(ROOT))
    label = scratch_database()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django
    from django.core.management import call_command

    django.setup()
    logging.getLogger("runtime").setLevel(logging.WARNING)  # the runs started here, not timed
    call_command("migrate", verbosity=0)
    log = Path(os.environ.get("RUNTIME_VAR_DIR", ROOT / "var")) / "loop_bench.workers.log"
    log.unlink(missing_ok=True)

    print(f"database: {label}; cpus: {os.cpu_count()}; worker stderr: {log}")
    print(f"workload: demo agent, 1 step x 3 ledger calls + 1 text step ({options.runs} runs)\n")
    in_memory = floor(options.floor_runs)
    rows = []
    for workers in options.workers:
        rates = measure_workers(workers, options.runs, log)
        rows.append((f"{workers} worker process(es)", rates["wall"], rates["steady"], rates["cpu"]))
    print(
        f"{'path':<28} {'runs/s (wall)':>14} {'runs/s (steady)':>16} {'floor / steady':>15}"
        f" {'worker CPU ms/run':>18}"
    )
    for name, wall, steady, cpu in rows:
        print(
            f"{name:<28} {wall:>14.1f} {steady:>16.1f} {in_memory / steady:>14.1f}x"
            f" {cpu * 1000:>18.1f}"
        )
    print(f"{'in-memory floor (no DB)':<28} {in_memory:>14.1f} {in_memory:>16.1f} {1:>14.1f}x")

    early, late, rate = measure_memory(options.rss_runs, log)
    print(
        f"\nworker RSS: {early / 1024:.1f} MiB after 50 runs, {late / 1024:.1f} MiB after "
        f"{options.rss_runs} runs (+{(late - early) / 1024:.1f} MiB); {rate} runs/s steady"
    )


if __name__ == "__main__":
    main()
