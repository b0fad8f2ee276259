"""Serving under load (issue 12, item 8): GET /runs latency while 50 SSE clients stream.

    .venv/bin/python bench/serve_load.py                       # SQLite, processes=auto
    .venv/bin/python bench/serve_load.py --processes 1 --seconds 30
    REDIS_URL=redis://127.0.0.1:6379/5 .venv/bin/python bench/serve_load.py \\
        --database-url postgres://postgres@127.0.0.1:5432/rt_serve_bench

Bounded and loopback only. It migrates a fresh database (a SQLite file in a temporary
directory by default; a PostgreSQL database is used as given), creates a user with an API
token and ``--sse`` runs of the demo agent whose scripted model streams text for a few
seconds and then waits for an approval, starts ``manage.py runtime_serve`` (with its
in-process worker) on a free loopback port, and then, for ``--seconds``:

- ``--sse`` clients each follow one run's ``/events?live=1`` (time to the first byte is kept);
- ``--pollers`` clients each ``GET /runs?limit=50`` every ``--interval`` seconds.

The stream clients run in a client process of their own, started together with the pollers
(both wait for one wall-clock instant): in one process, the client's event loop opened 70
connections and read 50 streams one callback at a time, and every poll's time included up
to 150 ms of that queue, which no server could remove.

It prints the latency of ``GET /runs`` alone (before the load) and under the load (p50, p90,
p99, max, in ms), the SSE first-byte times, and the errors. Target (issue 12): p99 of
``GET /runs`` under 300 ms under this load on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
# Text streamed for about 5 s, then a call that waits for an approval: the stream stays open.
STREAM_THEN_APPROVAL = {
    "text": "token " * 300,
    "chunks": 60,
    "delay_ms": 80,
    "tool_calls": [{"name": "ledger_approval", "arguments": {"key": "k"}}],
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout.strip()


SETUP = """
import json, os
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from console.models import ApiToken
from runtime.operations import start_run
user = get_user_model().objects.create_user("bench")
user.user_permissions.add(*Permission.objects.filter(content_type__app_label="console"))
_, token = ApiToken.issue(user, name="bench")
setup = json.loads(os.environ["BENCH_SETUP"])
script = {"steps": setup["steps"]}
runs = [start_run(agent="demo", input="go", metadata={"script": script})
        for _ in range(setup["runs"])]
print(json.dumps({"token": token, "runs": runs}))
"""


def percentiles(samples: list[float]) -> dict[str, float]:
    if not samples:
        return {}
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)

    return {
        "n": len(ordered),
        "p50": at(0.5),
        "p90": at(0.9),
        "p99": at(0.99),
        "max": round(ordered[-1] * 1000, 1),
        "mean": round(statistics.fmean(ordered) * 1000, 1),
    }


async def poll(client: httpx.AsyncClient, until: float, interval: float, out: list, errors: list):
    """GET /runs every ``interval`` s until ``until``; append (start, seconds) to ``out``."""
    while time.monotonic() < until:
        began = time.monotonic()
        try:
            response = await client.get("/runs", params={"limit": 50})
            if response.status_code == 200:
                out.append((began, time.monotonic() - began))
            else:
                errors.append(f"GET /runs {response.status_code}")
        except httpx.HTTPError as exc:
            errors.append(f"GET /runs {type(exc).__name__}")
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))


async def follow(client: httpx.AsyncClient, run_id: str, seconds: float, first: list, errors):
    began: float | None = time.monotonic()
    params = {"live": 1, "timeout": seconds}
    try:
        async with client.stream("GET", f"/runs/{run_id}/events", params=params) as response:
            if response.status_code != 200:
                errors.append(f"events {response.status_code}")
                return
            async for _ in response.aiter_bytes():
                if began is not None:
                    first.append(time.monotonic() - began)
                    began = None
    except httpx.HTTPError as exc:
        errors.append(f"events {type(exc).__name__}")


def client(base: str, token: str, connections: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"}
    limits = httpx.Limits(max_connections=connections + 10)
    return httpx.AsyncClient(base_url=base + "/api/v1", headers=headers, timeout=60, limits=limits)


async def wait_until(instant: float) -> None:
    """Sleep until the wall-clock ``instant`` (time.time()), shared by both client processes."""
    await asyncio.sleep(max(0.0, instant - time.time()))


async def streams(base: str, token: str, runs: list[str], start_at: float, seconds: float):
    """The stream clients' process: follow every run from ``start_at``; print what it saw."""
    async with client(base, token, len(runs)) as http:
        await wait_until(start_at)
        first: list[float] = []
        errors: list[str] = []
        await asyncio.gather(*(follow(http, r, seconds, first, errors) for r in runs))
    print(json.dumps({"first": first, "errors": errors}))


async def measure(base: str, token: str, runs: list[str], args: argparse.Namespace) -> dict:
    async with client(base, token, args.pollers) as http:
        alone: list[tuple[float, float]] = []
        errors: list[str] = []
        await poll(http, time.monotonic() + 5, 0.25, alone, errors)
        start_at = time.time() + 2  # the stream clients' process has started by then
        followers = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--follow",
            json.dumps({"base": base, "token": token, "runs": runs[: args.sse]}),
            "--start-at",
            str(start_at),
            "--seconds",
            str(args.seconds),
            stdout=asyncio.subprocess.PIPE,
        )
        await wait_until(start_at)
        loaded: list[tuple[float, float]] = []
        began = time.monotonic()
        until = began + args.seconds
        await asyncio.gather(
            *(poll(http, until, args.interval, loaded, errors) for _ in range(args.pollers))
        )
        out, _ = await followers.communicate()
    seen = json.loads(out.decode().strip().splitlines()[-1])
    errors += seen["errors"]
    burst = [took for at, took in loaded if at < began + 1]
    return {
        "GET /runs alone": percentiles([took for _, took in alone]),
        "GET /runs under load": percentiles([took for _, took in loaded]),
        "of which in the first second (every client connecting)": percentiles(burst),
        "of which later": percentiles([took for at, took in loaded if at >= began + 1]),
        "SSE first byte": percentiles(seen["first"]),
        "errors": errors[:20],
        "error_count": len(errors),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL"))
    parser.add_argument("--processes", default="auto")
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--sse", type=int, default=50)
    parser.add_argument("--pollers", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between polls")
    parser.add_argument("--follow", help=argparse.SUPPRESS)  # the stream clients' process
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.follow:
        given = json.loads(args.follow)
        run = streams(given["base"], given["token"], given["runs"], args.start_at, args.seconds)
        asyncio.run(run)
        return
    if not 1 <= args.seconds <= 600:
        raise SystemExit("--seconds is between 1 and 600")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="console.settings", PYTHONUNBUFFERED="1")
        env["DATABASE_URL"] = args.database_url or f"sqlite:///{tmp}/bench.sqlite3"
        env.setdefault("RUNTIME_LOG_LEVEL", "WARNING")
        if args.database_url:
            manage(env, "flush", "--noinput")
        manage(env, "migrate", "--noinput", "-v0")
        env["BENCH_SETUP"] = json.dumps({"runs": args.sse, "steps": [STREAM_THEN_APPROVAL]})
        made = json.loads(manage(env, "shell", "-c", SETUP).splitlines()[-1])
        port = free_port()
        log = Path(tmp) / "serve.log"
        command = [sys.executable, "manage.py", "runtime_serve", "--port", str(port)]
        command += ["--processes", args.processes, "--max-inflight", "4"]
        with log.open("w") as out:
            server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"no server:\n{log.read_text()}") from None
                    time.sleep(0.2)
            report = asyncio.run(
                measure(f"http://127.0.0.1:{port}", made["token"], made["runs"], args)
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
        report["setup"] = {
            "database": env["DATABASE_URL"].split("@")[-1],
            "processes": args.processes,
            "channel_layer": "redis" if env.get("REDIS_URL") else "in-memory",
            "sse": args.sse,
            "pollers": args.pollers,
            "interval_s": args.interval,
            "seconds": args.seconds,
            "server": log.read_text().splitlines()[:3],
        }
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
