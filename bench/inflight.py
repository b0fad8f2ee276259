"""Runs that WAIT on their model, side by side: our worker, LangGraph and DBOS Transact.

One local OpenAI-compatible streaming model server (``bench/model_server.py``, real HTTP and
SSE) is started once. Every system then drives the same agent shape against it: a first
streamed answer of 3 ``ledger`` tool calls, each call writing one row keyed by its operation
id, then a streamed text answer. N runs are put in flight at once, N at each ``--levels``
(default 100, 500, 1,000, and 5,000 for ours only), the systems interleaved at each level
(ours with 1 worker, ours with 4, LangGraph, DBOS, in turn, ``--rounds`` times):

- **ours** (``ours-1``, ``ours-4``: K ``manage.py runtime_worker`` processes): the agent of
  ``bench/inflight_agent.py`` on the project's OpenAI-compatible provider
  (``runtime/providers/openai_compat.py``). The workers are spawned and registered first (a
  deployment's workers are long-running), each with ``--max-inflight ceil(N/K)`` when
  ``runtime_worker --help`` lists that flag, else with the old ``--concurrency`` (one thread
  and two database connections per run driven at once), capped so that the K workers stay
  within ``--connection-budget`` connections (PostgreSQL's ``max_connections`` is shared);
  then the N runs are started with ``runtime.operations.start_run``. Timed from the first
  start to the runs' last commit (the starts included); then the workers get SIGTERM. Every run
  must end ``natural`` with its 3 ledger rows applied once, and ``manage.py runtime_fsck``
  must be clean (reported per round).
- **langgraph** (``bench/peers/inflight_langgraph.py``): an async ``StateGraph`` (model node
  on ``AsyncOpenAI``, tools node), ``AsyncPostgresSaver`` on an ``AsyncConnectionPool`` of
  ``--pool-size`` connections; all N runs at once (``asyncio.gather``).
- **dbos** (``bench/peers/inflight_dbos.py``): an async workflow, one step per inference and
  per tool call, N workflows started at once with ``DBOS.start_workflow_async``.

Each system has its own database on the server of ``DATABASE_URL``: ``<prefix>_ours``
(migrated once, its tables emptied before each round), ``<prefix>_langgraph`` and
``<prefix>_dbos`` (dropped and re-created before each round). The peers run in their own
processes and time themselves from their first start to their last result.

Reported per system and level (the median over the rounds):

- **wall** (s): ours, from starting the N runs (workers already up) to their last commit;
  the peers, from starting their N runs to the last result.
- **ideal** (s): the latency-bound time of one run, ``2 x (latency + (chunks - 1) x
  token_delay)``, from the model server's settings; **wall/ideal**; **runs/s** = N / wall.
- **to 1st req** (s): from the start of the wall time to the model server's first request.
- **peak conns**: the most connections open at once to the system's own database (sampled
  from ``pg_stat_activity`` every ``--sample-interval`` seconds, default 0.05, the bench's
  own connections excluded by their ``application_name``).
- **peak RSS** (MiB): the most resident memory of the system's processes, sampled with the
  connections (the sum of VmRSS over our worker processes; for a peer, its process, or its
  own VmHWM at the end when higher).
- **overhead/step p50, p99** (ms): from the model server's records, per conversation (the
  user message is unique per run): the next request's arrival minus the previous answer's
  last chunk ([DONE]); the runtime's own time between two inferences of a run (committing
  the answer, the 3 tool calls and their commits, building the next request).
- **delta p99** (ms, ours only; peers: n/a): with ``--redis-url`` (default
  ``redis://127.0.0.1:6379/6``; ``''`` turns it off) the workers publish live deltas over
  Channels (``REDIS_URL``). The bench subscribes, with channels-redis, one channel to the
  group of each of ``--delta-sample`` runs (default 20, spread over the runs) before the
  workers start. Every text token the model server sends carries its send time
  (``"[i:<time.time()>] "``), so each text delta's latency is its arrival at the subscriber
  minus that stamp: model server -> worker -> Redis -> subscriber, on one machine's clock.
  In brackets: the share of those runs' text tokens that reached the subscriber at all (a
  worker that exits drops what its publisher has not sent yet).

The table is printed as Markdown; ``--json PATH`` writes every round's raw figures (with
each step overhead and delta latency). Subprocess stderr goes to ``var/inflight.log``
(``RUNTIME_VAR_DIR``).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        .venv/bin/python bench/inflight.py --levels 100 --json var/inflight.json
    .venv/bin/python bench/inflight.py --database-url postgres://postgres@127.0.0.1:5432/x \\
        --levels 5 --systems ours-1 langgraph --latency 0.05 --tokens 4

Flags (``--help`` lists them with their defaults): ``--database-url`` (default
``$DATABASE_URL``), ``--database-prefix``, ``--levels``, ``--systems`` (``ours-K``,
``langgraph``, ``dbos``), ``--peer-max-level`` (peers up to 1,000 runs), ``--rounds``; the model
server's ``--latency`` (s), ``--tokens``, ``--token-delay`` (s), ``--tool-calls``; ours'
``--connection-budget`` (today's ``--concurrency`` only) and ``--worker-db-connections``
(``RUNTIME_WORKER_DB_CONNECTIONS``); the peers' ``--pool-size``; ``--redis-url``,
``--delta-sample``, ``--sample-interval`` (s), ``--json`` and ``--keep-databases``.

The peers need the ``bench`` extra (``pip install -e '.[bench]'``); a system whose package is
missing is skipped with a note. Exit status 1 when a round failed or fsck was not clean.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import re
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import psycopg

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from model_server import Settings, options  # noqa: E402  (bench/ is this script's folder)

AGENT_PATH = "bench.inflight_agent.inflight"
BENCH_APP = "inflight-bench"  # application_name of the bench's own connections (not counted)
STAMP = re.compile(r"\[\d+:(\d+\.\d+)\]")
START_SECONDS = 30.0  # bound on a child's start-up (the model server, a subscription)
STOP_SECONDS = 30.0
# How long the delta probe waits, after the runs ended, for a token that has not arrived while
# none arrives (a publisher that fell behind sends after the run's last commit).
DRAIN_QUIET_SECONDS = 5.0
POLL_SECONDS = 0.05  # how often the bench looks whether a process it waits for has exited


@dataclass(frozen=True, slots=True)
class System:
    """One measured configuration: ours with ``workers`` processes, or a peer's module."""

    name: str
    label: str
    workers: int = 0  # ours only
    module: str = ""  # a peer: ``peers.<module>``, run from bench/
    needs: str = ""  # the peer's package


def parse_system(name: str) -> System:
    """``ours-K`` (K worker processes), ``langgraph`` or ``dbos``."""
    if match := re.fullmatch(r"ours-(\d+)", name):
        workers = int(match.group(1))
        return System(name, f"ours, {workers} worker{'s' * (workers > 1)}", workers=workers)
    if name == "langgraph":
        return System(name, "LangGraph", module="peers.inflight_langgraph", needs="langgraph")
    if name == "dbos":
        return System(name, "DBOS", module="peers.inflight_dbos", needs="dbos")
    raise argparse.ArgumentTypeError(f"unknown system {name!r} (ours-K, langgraph, dbos)")


# -- the model server ------------------------------------------------------------------------


class ModelServer:
    """``bench/model_server.py`` in a child process on a free loopback port."""

    def __init__(self, settings: Settings, log: Path) -> None:
        self.settings = settings
        args = [
            sys.executable,
            str(BENCH / "model_server.py"),
            "--port",
            "0",
            "--latency",
            str(settings.latency),
            "--tokens",
            str(settings.tokens),
            "--token-delay",
            str(settings.token_delay),
            "--tool-calls",
            str(settings.tool_calls),
            "--tool-name",
            settings.tool_name,
        ]
        with log.open("ab") as err:
            self.process = subprocess.Popen(
                args, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL
            )
        port = self._port()
        self.base = f"http://127.0.0.1:{port}"
        self.http = httpx.Client(base_url=self.base, timeout=60.0)
        deadline = time.monotonic() + START_SECONDS
        while not self._healthy():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise SystemExit(f"the model server did not answer /healthz; see {log}")
            time.sleep(POLL_SECONDS)

    @property
    def url(self) -> str:
        """The OpenAI base URL (``.../v1``)."""
        return f"{self.base}/v1"

    def _port(self) -> int:
        """The port the server prints on its first line (bounded wait)."""
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], START_SECONDS)
        line = self.process.stdout.readline().decode() if ready else ""
        if not line.startswith("port "):
            self.process.kill()
            raise SystemExit(f"the model server did not start (it said {line!r})")
        return int(line.split()[1])

    def _healthy(self) -> bool:
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def reset(self) -> None:
        self.http.post("/reset").raise_for_status()

    def records(self) -> list[dict[str, Any]]:
        response = self.http.get("/stats")
        response.raise_for_status()
        return response.json()["requests"]

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def step_overheads_ms(records: list[dict[str, Any]]) -> list[float]:
    """Per conversation, each request's arrival minus the previous answer's end, ms."""
    by_conversation: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_conversation[record["conversation"]].append(record)
    gaps = []
    for requests in by_conversation.values():
        requests.sort(key=lambda r: r["received"])
        gaps += [(b["received"] - a["ended"]) * 1000 for a, b in pairwise(requests)]
    return gaps


# -- the database ------------------------------------------------------------------------------


class Server:
    """The PostgreSQL server of ``--database-url``: URLs of its databases, and its admin."""

    def __init__(self, url: str) -> None:
        if not url.startswith(("postgres://", "postgresql://")):
            raise SystemExit("set DATABASE_URL (or --database-url) to a PostgreSQL server")
        self.base = "postgresql://" + url.split("://", 1)[1].rsplit("/", 1)[0]

    def url(self, database: str) -> str:
        return f"{self.base}/{database}"

    def admin(self) -> psycopg.Connection[Any]:
        """A connection to the server's ``postgres`` database (autocommit)."""
        return psycopg.connect(self.url("postgres"), autocommit=True)

    def recreate(self, database: str) -> None:
        with self.admin() as db:
            db.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
            db.execute(f'CREATE DATABASE "{database}"')

    def drop(self, database: str) -> None:
        with self.admin() as db:
            db.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def vm_rss_mib(pid: int) -> float:
    """The process's resident set now (VmRSS), MiB; 0 once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0.0


class Sampler(threading.Thread):
    """Every ``interval`` seconds: the connections to ``database`` (the bench's own left out)
    and the summed VmRSS of ``pids``; keeps the peaks."""

    def __init__(self, server: Server, database: str, interval: float) -> None:
        super().__init__(name="sampler", daemon=True)
        self.server, self.database, self.interval = server, database, interval
        self.pids: list[int] = []
        self.peak_connections = 0
        self.peak_rss_mib = 0.0
        self.samples = 0
        self.done = threading.Event()

    def run(self) -> None:
        with self.server.admin() as db:
            while True:
                row = db.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
                    " AND application_name <> %s",
                    (self.database, BENCH_APP),
                ).fetchone()
                self.peak_connections = max(self.peak_connections, row[0] if row else 0)
                rss = sum(vm_rss_mib(pid) for pid in list(self.pids))
                self.peak_rss_mib = max(self.peak_rss_mib, rss)
                self.samples += 1
                if self.done.wait(self.interval):
                    return

    def stop(self) -> None:
        self.done.set()
        self.join(STOP_SECONDS)


@contextmanager
def sampling(server: Server, database: str, interval: float) -> Iterator[Sampler]:
    sampler = Sampler(server, database, interval)
    sampler.start()
    try:
        yield sampler
    finally:
        sampler.stop()


# -- live deltas through Redis (ours) -----------------------------------------------------------


class DeltaProbe:
    """Subscribes one channel to the live group of each of ``run_ids`` (channels-redis, on a
    private event loop) and records each text delta's latency: its arrival minus the send time
    the model server stamped into the token, ms."""

    def __init__(self, redis_url: str, run_ids: list[str], expected: int) -> None:
        from channels_redis.core import RedisChannelLayer

        # Read for longer than the 5 s BZPOPMIN of a receive (console/settings.py says why).
        host = {"address": redis_url, "socket_timeout": 30}
        self.layer = RedisChannelLayer(hosts=[host], capacity=1000)
        self.run_ids = run_ids
        self.expected = expected  # text tokens the sampled runs stream in all
        self.latencies_ms: list[float] = []
        self.last_arrival = time.monotonic()
        self.deltas = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="probe", daemon=True)
        self.channels: list[str] = []
        self.viewings: list[Any] = []  # runtime.live.Viewing, one per sampled run
        self.redis_url = redis_url

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(START_SECONDS)

    def __enter__(self) -> DeltaProbe:
        from runtime.live import Viewing, run_group

        async def subscribe() -> list[str]:
            channels = []
            for run_id in self.run_ids:
                # Watched, as a console page watches: only watched runs' deltas are sent.
                viewing = Viewing(run_id, redis_url=self.redis_url)
                await viewing.start()
                self.viewings.append(viewing)
                channel = await self.layer.new_channel()
                await self.layer.group_add(run_group(run_id), channel)
                channels.append(channel)
            return channels

        self.thread.start()
        self.channels = self._call(subscribe())
        self.receiving = asyncio.run_coroutine_threadsafe(self._receive_all(), self.loop)
        return self

    async def _receive_all(self) -> None:
        await asyncio.gather(*(self._receive(channel) for channel in self.channels))

    async def _receive(self, channel: str) -> None:
        while True:
            message = await self.layer.receive(channel)
            arrived = time.time()
            if message["type"] == "bench.stop":
                return
            if message["type"] == "run.delta" and message.get("kind") == "text":
                self.deltas += 1
                self.last_arrival = time.monotonic()
                for stamp in STAMP.findall(message.get("text") or ""):
                    self.latencies_ms.append((arrived - float(stamp)) * 1000)

    def drain(self, quiet_seconds: float = DRAIN_QUIET_SECONDS) -> None:
        """Wait, once every run has ended, for the deltas still on their way: a worker's
        publisher sends after the commit that ends a run, and late on a busy machine. Returns
        when every expected token has arrived or none has for ``quiet_seconds``."""
        while len(self.latencies_ms) < self.expected:
            if time.monotonic() - self.last_arrival > quiet_seconds:
                return
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        from runtime.live import run_group

        async def stop() -> None:
            for channel in self.channels:
                await self.layer.send(channel, {"type": "bench.stop"})

        async def unsubscribe() -> None:
            for viewing in self.viewings:
                await viewing.stop()
            for run_id, channel in zip(self.run_ids, self.channels, strict=True):
                await self.layer.group_discard(run_group(run_id), channel)
            await self.layer.close_pools()

        try:
            self._call(stop())
            self.receiving.result(START_SECONDS)
            self._call(unsubscribe())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(STOP_SECONDS)


# -- ours --------------------------------------------------------------------------------------


def setup_django(server: Server, database: str, model_url: str) -> None:
    """Create and migrate our database; set Django up on it in this process."""
    server.recreate(database)
    os.environ["DATABASE_URL"] = server.url(database)
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["RUNTIME_AGENTS"] = f"runtime.demo.agent.demo,{AGENT_PATH}"
    os.environ["BENCH_MODEL_URL"] = model_url
    os.environ.setdefault("RUNTIME_LOG_LEVEL", "WARNING")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def worker_flag() -> str:
    """``--max-inflight`` when ``runtime_worker --help`` lists it, else ``--concurrency``."""
    done = subprocess.run(
        [sys.executable, "manage.py", "runtime_worker", "--help"],
        cwd=ROOT,
        env=child_env("ours"),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return "--max-inflight" if "--max-inflight" in done.stdout else "--concurrency"


def per_worker(runs: int, workers: int, flag: str, budget: int) -> int:
    """Runs each worker drives at once: ``ceil(runs / workers)``; with today's
    ``--concurrency`` (two connections per run driven, plus about four per process) no more
    than ``budget`` connections allow across the workers."""
    wanted = math.ceil(runs / workers)
    if flag == "--max-inflight":
        return wanted
    return max(1, min(wanted, (budget // workers - 4) // 2))


def child_env(system_name: str, **extra: str) -> dict[str, str]:
    """The environment of a system's processes: tagged ``inflight-<system>`` in
    ``pg_stat_activity`` (libpq's PGAPPNAME), no crash injection."""
    env = {**os.environ, "PGAPPNAME": f"inflight-{system_name}", **extra}
    env.pop("RUNTIME_CRASH_AT", None)
    return env


def empty_ours() -> None:
    """Empty our tables (runs, threads and everything under them, the ledger)."""
    from django.db import connection

    from runtime.demo.models import LedgerEffect
    from runtime.models import LateEvidence, StreamCheckpoint, Thread

    tables = [m._meta.db_table for m in (Thread, LedgerEffect, StreamCheckpoint, LateEvidence)]
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {', '.join(tables)} CASCADE")


def start_ours(runs: int) -> list[str]:
    from runtime.operations import start_run

    return [
        start_run(agent="inflight", input=f"Record k0, k1 and k2 in the ledger. (run {i})")
        for i in range(runs)
    ]


def ours_outcome(run_ids: list[str], calls: int) -> tuple[str, float]:
    """("" when every run ended natural with ``calls`` ledger rows applied once, else what is
    wrong; the time.time() of the runs' last commit)."""
    from django.db.models import Count, Max

    from runtime.demo.models import LedgerEffect
    from runtime.models import Run, ThreadCommit

    causes = dict(
        Run.objects.filter(id__in=run_ids)
        .values_list("end_cause")
        .annotate(n=Count("id"))
        .values_list("end_cause", "n")
    )
    applied = dict(
        LedgerEffect.objects.filter(run_id__in=run_ids)
        .values_list("applied")
        .annotate(n=Count("id"))
        .values_list("applied", "n")
    )
    last = ThreadCommit.objects.filter(run_id__in=run_ids).aggregate(last=Max("created_at"))
    wrong = ""
    if causes != {"natural": len(run_ids)} or applied != {1: calls * len(run_ids)}:
        wrong = f"end causes {causes}, ledger rows by applications {applied}"
    return wrong, last["last"].timestamp() if last["last"] else math.nan


def takeovers(run_ids: list[str]) -> int:
    """The claims of the runs beyond each one's first (its lease epoch less one): no worker
    dies or stops during a round and none waits for a limit, so each is a live worker's run
    taken over (target 0, issue 29)."""
    from django.db.models import F, Sum

    from runtime.models import Run

    total = Run.objects.filter(id__in=run_ids).aggregate(n=Sum(F("lease_epoch") - 1))["n"]
    return int(total or 0)


def lease_warnings(log: Path, start: int) -> int:
    """The workers' "lease lost" and "fenced" warnings in ``log`` from byte ``start`` on."""
    with log.open("rb") as lines:
        lines.seek(start)
        return sum(1 for line in lines if b"lease lost" in line or b"fenced" in line)


def fsck(env: dict[str, str], timeout: float) -> str:
    """``manage.py runtime_fsck --json``: "clean", "<n> violations" or what failed."""
    try:
        done = subprocess.run(
            [sys.executable, "manage.py", "runtime_fsck", "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        report = json.loads(done.stdout)
    except (subprocess.TimeoutExpired, ValueError) as exc:
        return f"failed: {exc}"[:200]
    return "clean" if report["ok"] else f"{len(report['violations'])} violations"


def workers_up(worker_ids: list[str]) -> bool:
    from runtime.models import WorkerProcess

    return WorkerProcess.objects.filter(id__in=worker_ids, stopped_at=None).count() == len(
        worker_ids
    )


def runs_ended(run_ids: list[str]) -> bool:
    from runtime.models import Run

    return not Run.objects.filter(id__in=run_ids).exclude(state="ended").exists()


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``predicate`` every 50 ms until true; raise TimeoutError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"gave up after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def wait_all(processes: list[subprocess.Popen[bytes]], timeout: float) -> list[int | None]:
    """Wait until every process exited, at most ``timeout`` seconds in all; kill the rest.
    Returns the exit codes (None for a process that had to be killed)."""
    deadline = time.monotonic() + timeout
    while any(p.poll() is None for p in processes) and time.monotonic() < deadline:
        time.sleep(POLL_SECONDS)
    codes = [p.poll() for p in processes]
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()
    return codes


def round_timeout(runs: int, in_flight: int, ideal: float) -> float:
    """A generous bound on one round, seconds: a stuck system fails it, never hangs it."""
    return 120.0 + 4 * ideal * math.ceil(runs / max(in_flight, 1)) + 0.05 * runs


def measure_ours(
    system: System, runs: int, args: argparse.Namespace, ctx: Context
) -> dict[str, Any]:
    """One round of ours: spawn the workers and wait until they are up (a deployment's
    workers are long-running), then start ``runs`` runs and time them from the first start
    to the last commit; check the outcome and the log, then stop the workers (SIGTERM)."""
    from django.db import transaction

    empty_ours()
    ctx.model.reset()
    each = per_worker(runs, system.workers, ctx.flag, args.connection_budget)
    extra = {"REDIS_URL": args.redis_url} if args.redis_url else {}
    if args.worker_db_connections:
        extra["RUNTIME_WORKER_DB_CONNECTIONS"] = str(args.worker_db_connections)
    env = child_env("ours", **extra)
    timeout = round_timeout(runs, each * system.workers, ctx.ideal)
    ids = [f"inflight-{system.workers}-{i}" for i in range(system.workers)]
    logged = ctx.log.stat().st_size if ctx.log.exists() else 0  # this round's log starts here
    with ctx.log.open("ab") as err:
        workers = [
            subprocess.Popen(
                [sys.executable, "manage.py", "runtime_worker", "--worker-id", worker_id]
                + [ctx.flag, str(each)],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
            for worker_id in ids
        ]
    wait_until(lambda: workers_up(ids), START_SECONDS * 4, "the workers to register")
    with sampling(ctx.server, ctx.ours_db, args.sample_interval) as sampler:
        sampler.pids = [w.pid for w in workers]
        began = time.time()
        with ExitStack() as listening:
            # One transaction: the runs become claimable together, once the probe listens to
            # the sampled ones (subscribed after, it missed the tokens streamed before).
            with transaction.atomic():
                run_ids = start_ours(runs)
                sample = run_ids[:: max(1, len(run_ids) // args.delta_sample)][: args.delta_sample]
                if args.redis_url and args.delta_sample:
                    probe = DeltaProbe(args.redis_url, sample, len(sample) * ctx.settings.tokens)
                    listening.enter_context(probe)
                else:
                    probe = None
            wait_until(lambda: runs_ended(run_ids), timeout, "every run to end")
            if probe is not None:
                probe.drain()
    for worker in workers:
        worker.send_signal(signal.SIGTERM)
    codes = wait_all(workers, timeout)
    wrong, last_commit = ours_outcome(run_ids, ctx.settings.tool_calls)
    if codes != [0] * len(workers):
        wrong = f"worker exit codes {codes}; {wrong}".rstrip("; ")
    figures = figures_of(ctx, runs, began, last_commit, sampler)
    figures.update(
        in_flight=each * system.workers,
        worker_flag=f"{ctx.flag} {each}",
        fsck=fsck(env, timeout=300 + runs * 0.1),
        error=wrong,
        takeovers=takeovers(run_ids),
        lease_warnings=lease_warnings(ctx.log, logged),
    )
    if probe is not None:
        figures.update(
            delta_latencies_ms=probe.latencies_ms,
            delta_p99_ms=percentile(probe.latencies_ms, 99),
            delta_runs=len(sample),
            # Text tokens of the sampled runs that reached the subscriber (a worker that
            # exits drops what its publisher has not sent yet).
            delta_received=len(probe.latencies_ms) / (len(sample) * ctx.settings.tokens),
        )
    return figures


# -- the peers ---------------------------------------------------------------------------------


def measure_peer(
    system: System, runs: int, args: argparse.Namespace, ctx: Context
) -> dict[str, Any]:
    """One round of a peer: its module in a child process on a fresh database of its own."""
    database = f"{args.database_prefix}_{system.name}"
    ctx.server.recreate(database)
    ctx.model.reset()
    command = [sys.executable, "-m", system.module, "--runs", str(runs)]
    command += ["--model-url", ctx.model.url, "--database-url", ctx.server.url(database)]
    command += ["--pool-size", str(args.pool_size), "--tool-calls", str(ctx.settings.tool_calls)]
    timeout = round_timeout(runs, runs, ctx.ideal)
    with sampling(ctx.server, database, args.sample_interval) as sampler:
        with ctx.log.open("ab") as err:
            process = subprocess.Popen(
                command,
                cwd=BENCH,
                env=child_env(system.name),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        sampler.pids = [process.pid]
        try:
            out, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
    lines = out.decode().strip().splitlines()
    if process.returncode or not lines:
        return {"error": f"exit code {process.returncode}; see {ctx.log}", "runs": runs}
    reported = json.loads(lines[-1])
    sampler.peak_rss_mib = max(sampler.peak_rss_mib, reported["peak_rss_mib"])
    figures = figures_of(ctx, runs, reported["started"], reported["ended"], sampler)
    figures.update(in_flight=runs, error="")
    return figures


# -- figures -----------------------------------------------------------------------------------


@dataclass
class Context:
    """What every round uses."""

    server: Server
    model: ModelServer
    settings: Settings
    ideal: float
    flag: str
    ours_db: str
    log: Path
    results: list[dict[str, Any]] = field(default_factory=list)


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (linear interpolation); NaN when there are no values."""
    if not values:
        return math.nan
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def figures_of(
    ctx: Context, runs: int, began: float, ended: float, sampler: Sampler
) -> dict[str, Any]:
    """The figures every system has, from its wall span and the model server's records."""
    records = ctx.model.records()
    overheads = step_overheads_ms(records)
    wall = ended - began
    first = min((r["received"] for r in records), default=math.nan)
    return {
        "runs": runs,
        "wall_seconds": wall,
        "ideal_seconds": ctx.ideal,
        "wall_over_ideal": wall / ctx.ideal,
        "runs_per_second": runs / wall,
        "first_request_seconds": first - began,
        "model_requests": len(records),
        "peak_connections": sampler.peak_connections,
        "peak_rss_mib": sampler.peak_rss_mib,
        "samples": sampler.samples,
        "step_overheads_ms": overheads,
        "overhead_p50_ms": percentile(overheads, 50),
        "overhead_p99_ms": percentile(overheads, 99),
    }


def median_row(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the table: the median of each numeric figure over the rounds."""
    row: dict[str, Any] = {}
    for key in rounds[0]:
        values = [r.get(key) for r in rounds]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if len(numbers) == len(values) and numbers:
            row[key] = statistics.median(numbers)
        elif all(isinstance(v, str) for v in values):
            row[key] = "; ".join(sorted({v for v in values if v})) or ""
    return row


def _f(value: Any, spec: str) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "n/a"
    return f"{value:{spec}}"


def delta(row: dict[str, Any]) -> str:
    """The delta column: p99 (ms) and the share of sampled text tokens received."""
    if "delta_received" not in row:
        return "n/a"
    return f"{_f(row['delta_p99_ms'], '.0f')} ({row['delta_received']:.0%})"


def taken(row: dict[str, Any]) -> str:
    """The takeovers column (ours only): live workers' runs taken over, and the "lease lost"
    and "fenced" warnings the workers logged."""
    if "takeovers" not in row:
        return "n/a"
    return f"{_f(row['takeovers'], '.0f')} ({_f(row['lease_warnings'], '.0f')})"


def markdown(ctx: Context, systems: list[System], levels: list[int]) -> str:
    """The Markdown table of every (system, level) measured, medians over the rounds."""
    head = (
        "| system | runs | driven at once | wall s | ideal s | wall/ideal | runs/s "
        "| to 1st req s | peak conns | peak RSS MiB | overhead/step p50 / p99 ms "
        "| delta p99 ms (received) | takeovers (warnings) | fsck |"
    )
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for level in levels:
        for system in systems:
            rounds = [
                r for r in ctx.results if r["system"] == system.name and r.get("level") == level
            ]
            if not rounds:
                continue
            row = median_row(rounds)
            if row.get("error"):
                lines.append(f"| {system.label} | {level} | FAILED: {row['error']} |")
                continue
            lines.append(
                f"| {system.label} | {level} | {_f(row.get('in_flight'), 'd')} "
                f"| {_f(row['wall_seconds'], '.2f')} | {_f(row['ideal_seconds'], '.2f')} "
                f"| {_f(row['wall_over_ideal'], '.2f')} | {_f(row['runs_per_second'], '.1f')} "
                f"| {_f(row['first_request_seconds'], '.2f')} "
                f"| {_f(row['peak_connections'], '.0f')} | {_f(row['peak_rss_mib'], '.0f')} "
                f"| {_f(row['overhead_p50_ms'], '.1f')} / {_f(row['overhead_p99_ms'], '.1f')} "
                f"| {delta(row)} | {taken(row)} | {row.get('fsck') or 'n/a'} |"
            )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("DATABASE_URL", ""),
        help="the PostgreSQL server (its path is ignored); default $DATABASE_URL",
    )
    parser.add_argument(
        "--database-prefix",
        default="inflight",
        help="databases <prefix>_ours, <prefix>_langgraph, <prefix>_dbos (dropped, re-created)",
    )
    parser.add_argument(
        "--levels",
        type=int,
        nargs="+",
        default=[100, 500, 1000, 5000],
        help="runs in flight at once, one level after another (default 100 500 1000 5000)",
    )
    parser.add_argument(
        "--systems",
        type=parse_system,
        nargs="+",
        default=[parse_system(s) for s in ("ours-1", "ours-4", "langgraph", "dbos")],
        help="ours-K (K worker processes), langgraph, dbos; measured in this order",
    )
    parser.add_argument(
        "--peer-max-level",
        type=int,
        default=1000,
        help="the peers are measured up to this many runs (default 1000)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="rounds per level (default 1)")
    options(parser)  # --latency, --tokens, --token-delay, --tool-calls, --tool-name
    parser.add_argument(
        "--connection-budget",
        type=int,
        default=60,
        help="with today's --concurrency only: connections all our workers may hold (default "
        "60 of PostgreSQL's max_connections); caps the runs each worker drives at once",
    )
    parser.add_argument(
        "--worker-db-connections",
        type=int,
        default=0,
        help="RUNTIME_WORKER_DB_CONNECTIONS for our workers (default: the setting's default)",
    )
    parser.add_argument(
        "--pool-size", type=int, default=10, help="the peers' database pool (default 10)"
    )
    parser.add_argument(
        "--redis-url",
        default="redis://127.0.0.1:6379/6",
        help="REDIS_URL of our workers and the delta subscriber; '' for none",
    )
    parser.add_argument(
        "--delta-sample", type=int, default=20, help="runs whose live deltas are timed"
    )
    parser.add_argument(
        "--sample-interval",
        type=float,
        default=0.05,
        help="seconds between two samples of connections and RSS (default 0.05)",
    )
    parser.add_argument("--json", type=Path, help="write every round's raw figures here")
    parser.add_argument(
        "--keep-databases", action="store_true", help="leave the scratch databases behind"
    )
    args = parser.parse_args(argv)
    if args.tool_name != "ledger":
        parser.error("--tool-name: the agents here have one tool, ledger")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server = Server(args.database_url)
    os.environ["PGAPPNAME"] = BENCH_APP  # this process's connections are not counted
    var = Path(os.environ.get("RUNTIME_VAR_DIR", ROOT / "var"))
    var.mkdir(parents=True, exist_ok=True)
    log = var / "inflight.log"
    log.unlink(missing_ok=True)
    systems = []
    for system in args.systems:
        if system.needs and importlib.util.find_spec(system.needs) is None:
            print(f"skipping {system.label}: {system.needs} is not installed (the bench extra)")
        else:
            systems.append(system)
    settings = Settings(
        latency=args.latency,
        tokens=args.tokens,
        token_delay=args.token_delay,
        tool_calls=args.tool_calls,
        tool_name=args.tool_name,
    )
    # The first answer streams the calls' arguments, the second the text tokens.
    ideal = settings.answer_seconds(settings.tool_answer_chunks()) + settings.answer_seconds()
    model = ModelServer(settings, log)
    ours_db = f"{args.database_prefix}_ours"
    databases = [ours_db] + [f"{args.database_prefix}_{s.name}" for s in systems if s.module]
    try:
        setup_django(server, ours_db, model.url)
        flag = worker_flag() if any(s.workers for s in systems) else ""
        ctx = Context(server, model, settings, ideal, flag, ours_db, log)
        print(
            f"model: latency {settings.latency} s, {settings.tokens} chunks per answer "
            f"{settings.token_delay} s apart, {settings.tool_calls} tool calls; ideal run "
            f"{ideal:.2f} s. ours: runtime_worker {flag or '-'}; cpus {os.cpu_count()}; "
            f"stderr: {log}",
            flush=True,
        )
        for level in args.levels:
            for round_ in range(args.rounds):
                for system in systems:
                    if system.module and level > args.peer_max_level:
                        continue
                    measure = measure_peer if system.module else measure_ours
                    figures = measure(system, level, args, ctx)
                    ctx.results.append(
                        {"system": system.name, "label": system.label, "level": level}
                        | {"round": round_ + 1}
                        | figures
                    )
                    print(progress(system, level, round_, figures), flush=True)
        print()
        print(markdown(ctx, systems, args.levels))
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            document: dict[str, Any] = {"settings": asdict(settings)}
            document.update(ideal_seconds=ideal, worker_flag=flag, results=ctx.results)
            args.json.write_text(json.dumps(document, indent=1))
        failed = [r for r in ctx.results if r.get("error") or r.get("fsck", "clean") != "clean"]
        return 1 if failed else 0
    finally:
        model.close()
        if not args.keep_databases:
            from django.db import connections

            connections.close_all()
            for database in databases:
                server.drop(database)


def progress(system: System, level: int, round_: int, figures: dict[str, Any]) -> str:
    if figures.get("error"):
        return (
            f"  {level:>5} runs, round {round_ + 1}: {system.label:<16} FAILED: {figures['error']}"
        )
    return (
        f"  {level:>5} runs, round {round_ + 1}: {system.label:<16} "
        f"{figures['wall_seconds']:7.2f} s ({figures['wall_over_ideal']:.2f}x ideal), "
        f"{figures['peak_connections']} conns, {figures['peak_rss_mib']:.0f} MiB"
        + (f", {figures['takeovers']} takeovers" if "takeovers" in figures else "")
    )


if __name__ == "__main__":
    raise SystemExit(main())
