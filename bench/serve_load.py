"""Serving under load (issue 12, item 8): GET /runs latency while 50 SSE clients stream.

    .venv/bin/python bench/serve_load.py                       # SQLite, runtime_serve
    .venv/bin/python bench/serve_load.py --seconds 30
    REDIS_URL=redis://127.0.0.1:6379/5 .venv/bin/python bench/serve_load.py \\
        --database-url postgres://postgres@127.0.0.1:5432/rt_serve_bench --servers 2
    REDIS_URL=... .venv/bin/python bench/serve_load.py --database-url ... --servers 2 \\
        --asgi bench.stock_asgi:application      # the same, with Django's stock ASGI handler

Bounded and loopback only. It migrates a fresh database (a SQLite file in a temporary
directory by default; a PostgreSQL database is used as given), creates a user with an API
token and ``--sse`` runs of the demo agent whose scripted model streams text for a few
seconds and then waits for an approval, starts the server on free loopback ports, and then,
for ``--seconds``:

- ``--sse`` clients each follow one run's ``/events?live=1`` (time to the first byte is kept);
- ``--pollers`` clients each ``GET /runs?limit=50`` every ``--interval`` seconds.

The server is, by default, ``manage.py runtime_serve`` (one process, with its in-process
worker). With ``--servers N`` it is the documented way to run several server processes
(README, "Several server processes"): N ``daphne`` processes (one per port, as
``deploy/runtime-web@.service`` runs them) serving ``--asgi`` (``console.asgi:application``
by default; ``bench.stock_asgi:application`` is the same application around Django's stock
ASGI handler), one ``manage.py runtime_worker`` process, and nginx in front (a configuration
written into the temporary directory, modelled on ``deploy/nginx.conf``: ``least_conn`` over
the N ports, WebSocket upgrades, no buffering; one nginx worker process), which the clients
connect to. nginx must be installed (Debian: ``apt-get install nginx-light``); set
``REDIS_URL`` so that live deltas cross processes, as in production.

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
import pwd
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
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


NGINX_CONF = """
# Written by bench/serve_load.py, modelled on deploy/nginx.conf (no TLS: loopback only).
{user}
worker_processes 1;
pid {tmp}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/nginx-body;
    proxy_temp_path {tmp}/nginx-proxy;
    fastcgi_temp_path {tmp}/nginx-fastcgi;
    uwsgi_temp_path {tmp}/nginx-uwsgi;
    scgi_temp_path {tmp}/nginx-scgi;
    upstream runtime_web {{
        least_conn;
{servers}
        keepalive 16;
    }}
    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ""      "";
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 2m;
        location / {{
            proxy_pass http://runtime_web;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Request-ID $request_id;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_buffering off;
            proxy_read_timeout 3600s;
        }}
    }}
}}
"""


def find_nginx() -> str:
    """The nginx binary (on PATH, or Debian's /usr/sbin/nginx); exits with what to install."""
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        raise SystemExit(
            "--servers puts nginx in front of the daphne processes, as deploy/nginx.conf does,"
            " and nginx is not installed: apt-get install nginx-light (Debian), or put nginx"
            " on PATH"
        )
    return found


def nginx_conf(tmp: Path, port: int, upstreams: list[int]) -> Path:
    """Write the bench's nginx configuration (NGINX_CONF) into ``tmp``; return its path. Run
    as root, nginx's workers run as root too (the user running the bench, as they would for
    anyone else), so that they can write the temporary directory."""
    user = f"user {pwd.getpwuid(0).pw_name};" if os.geteuid() == 0 else ""
    servers = "\n".join(f"        server 127.0.0.1:{p};" for p in upstreams)
    path = tmp / "nginx.conf"
    path.write_text(NGINX_CONF.format(user=user, tmp=tmp, servers=servers, port=port))
    return path


def wait_for_port(port: int, process: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """Wait until something accepts connections on loopback ``port``; exit with ``log``'s
    text if ``process`` exits first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"nothing listens on {port}:\n{log.read_text()}") from None
            time.sleep(0.2)


def start(stack: ExitStack, command: list[str], env: dict[str, str], log: Path):
    """Start ``command`` from the repository's root, its output in ``log``; it is stopped
    (SIGTERM, then SIGKILL after 30 s) when ``stack`` closes."""
    with log.open("w") as out:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out)

    def stop() -> None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    stack.callback(stop)
    return process


def serve(stack: ExitStack, args: argparse.Namespace, env: dict[str, str], tmp: Path) -> tuple:
    """Start the server ``args`` asks for; return its base URL and its logs."""
    if not args.servers:
        port = free_port()
        log = tmp / "serve.log"
        command = [sys.executable, "manage.py", "runtime_serve", "--port", str(port)]
        server = start(stack, [*command, "--max-inflight", "4"], env, log)
        wait_for_port(port, server, log)
        return f"http://127.0.0.1:{port}", [log]
    nginx = find_nginx()
    ports, logs = [free_port() for _ in range(args.servers)], []
    for index, port in enumerate(ports):
        log = tmp / f"daphne-{index}.log"
        daphne = [sys.executable, "-m", "daphne", "--bind", "127.0.0.1", "--port", str(port)]
        server = start(stack, [*daphne, "--proxy-headers", args.asgi], env, log)
        logs.append(log)
        wait_for_port(port, server, log)
    worker = [sys.executable, "manage.py", "runtime_worker", "--max-inflight", "4"]
    logs.append(tmp / "worker.log")
    start(stack, worker, env, logs[-1])
    port = free_port()
    conf = nginx_conf(tmp, port, ports)
    logs.append(tmp / "nginx.log")
    # -e: its errors on stderr (its log here) from the start, before the configuration is read.
    command = [nginx, "-p", str(tmp), "-c", str(conf), "-e", "stderr"]
    proxy = start(stack, [*command, "-g", "daemon off;"], env, logs[-1])
    wait_for_port(port, proxy, logs[-1])
    return f"http://127.0.0.1:{port}", logs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL"))
    parser.add_argument(
        "--servers",
        type=int,
        default=0,
        help="N daphne processes, a runtime_worker and nginx (default: runtime_serve alone)",
    )
    parser.add_argument(
        "--asgi",
        default="console.asgi:application",
        help="the application of --servers' daphne processes (MODULE:ATTR)",
    )
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
    if not 0 <= args.servers <= 16:
        raise SystemExit("--servers is between 1 and 16 (0: runtime_serve alone)")
    if not args.servers and args.asgi != parser.get_default("asgi"):
        raise SystemExit(
            "--asgi picks the application of --servers N (runtime_serve serves ASGI_APPLICATION)"
        )
    if args.servers:
        find_nginx()  # before anything is set up
        if not os.environ.get("REDIS_URL"):
            print(
                "serve_load: REDIS_URL is unset, so live deltas stay in the worker's process"
                " (the streams still get commits); production sets it",
                file=sys.stderr,
            )
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        env = dict(os.environ, DJANGO_SETTINGS_MODULE="console.settings", PYTHONUNBUFFERED="1")
        env["DATABASE_URL"] = args.database_url or f"sqlite:///{tmp}/bench.sqlite3"
        env.setdefault("RUNTIME_LOG_LEVEL", "WARNING")
        if args.database_url:
            manage(env, "flush", "--noinput")
        manage(env, "migrate", "--noinput", "-v0")
        env["BENCH_SETUP"] = json.dumps({"runs": args.sse, "steps": [STREAM_THEN_APPROVAL]})
        made = json.loads(manage(env, "shell", "-c", SETUP).splitlines()[-1])
        base, logs = serve(stack, args, env, Path(tmp))
        report = asyncio.run(measure(base, made["token"], made["runs"], args))
        stack.close()  # every server process has stopped: their logs are complete
        report["setup"] = {
            "database": env["DATABASE_URL"].split("@")[-1],
            "server": (
                f"{args.servers} daphne ({args.asgi}) + runtime_worker behind nginx"
                if args.servers
                else "runtime_serve (one process, in-process worker)"
            ),
            "channel_layer": "redis" if env.get("REDIS_URL") else "in-memory",
            "sse": args.sse,
            "pollers": args.pollers,
            "interval_s": args.interval,
            "seconds": args.seconds,
            "logs": {log.name: log.read_text().splitlines()[:3] for log in logs},
        }
        print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
