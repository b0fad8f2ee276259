"""``manage.py runtime_serve``: the console, the API and an in-process worker.

daphne serves HTTP and WebSockets; a worker drives runs on threads of the first process (its
commits wake it through the in-process signal). Under ASGI, Django answers requests on
threads (``console.asgi``), but the threads of a process share one interpreter, so a process
uses about one core however many requests it has: with ``--processes N`` the command binds the
listening socket once and serves the address from N daphne processes (the first one, plus
N-1 children started with ``--fd``). On Linux each child binds a socket of its own to the
same address (``SO_REUSEPORT``) and the kernel deals new connections among the sockets
evenly; a shared socket would go to whichever process woke first, and that one took nearly
every connection of a burst (70 clients at once: 44 of them to one of two processes). Other
platforms share the one socket. The
default ``auto`` serves with one process per CPU (at most 4) when the channel layer is
shared (``REDIS_URL``) and the platform can hand a socket to a child (POSIX); with the
in-memory layer it serves with one, because live deltas published in one process reach only
the viewers connected to that same process.

Each process opens its database connection pool before it serves (``runtime.db.open_pool``),
so the first requests after a start do not wait for connections made one at a time.

The address is bound before anything else starts: a busy port stops the command (exit 1, with
a message naming the address) before a worker registers. Stop with Ctrl-C or SIGTERM: the
children and the server stop, then the worker stops as ``runtime_worker`` does (it finishes
its current boundary, releases its leases and records the stop); a second signal exits at once.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from channels.routing import get_default_application
from daphne.server import Server
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runtime.db import open_pool
from runtime.worker import Worker

MAX_AUTO_PROCESSES = 4
MANAGE = Path(__file__).resolve().parents[3] / "manage.py"


def auto_processes() -> int:
    """How many server processes ``--processes auto`` means here (see the module doc)."""
    backend = settings.CHANNEL_LAYERS["default"]["BACKEND"]
    if os.name != "posix" or backend.endswith("InMemoryChannelLayer"):
        return 1
    return max(1, min(MAX_AUTO_PROCESSES, os.cpu_count() or 1))


# Whether each process listens on a socket of its own: Linux balances SO_REUSEPORT sockets.
REUSE_PORT = sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")


def listening_socket(
    host: str, port: int, *, family: int | None = None, reuse_port: bool = False
) -> socket.socket:
    """Bind and listen on ``host:port``, inheritable by child processes; ``reuse_port`` sets
    SO_REUSEPORT, so that other sockets with it can bind the same address beside it.

    Raises CommandError, naming the address, when it cannot be bound."""
    if family is None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CommandError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}. Another process may be"
            " using it; choose another port with PORT=... ./scripts/start or"
            " manage.py runtime_serve --port ..."
        ) from exc
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


def first_socket(host: str, port: int, processes: int) -> socket.socket:
    """The first process's socket. With children on Linux it is bound with SO_REUSEPORT, but
    only after a plain bind proved the address free: a second server started on the same
    port would otherwise join this one's sockets instead of failing."""
    sock = listening_socket(host, port)
    if processes == 1 or not REUSE_PORT:
        return sock
    with sock:
        address, family = sock.getsockname(), sock.family
    return listening_socket(address[0], address[1], family=family, reuse_port=True)


class Command(BaseCommand):
    help = "Serve the console and API with daphne (several processes), with an in-process worker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--processes",
            default="auto",
            help="server processes: a number, or auto (default; see the command's docs)",
        )
        parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)  # a child's inherited socket
        parser.add_argument(
            "--concurrency",
            type=int,
            default=2,
            help="runs the in-process worker drives at once (default 2)",
        )
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="serve only; run `manage.py runtime_worker` separately",
        )

    def handle(self, *args, host, port, processes, fd, concurrency, no_worker, **options):
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        count = self.process_count(processes)
        if fd is not None:  # a child: serve the address the first process bound
            self.serve(self.endpoints(self.child_socket(fd)))
            return
        # Bound first: a busy port stops the command before a worker registers or a child starts.
        sock = first_socket(host, port, count)
        # A signal before daphne installs its handlers stops the server as soon as it runs.
        signal.signal(signal.SIGTERM, self.stop_early)
        signal.signal(signal.SIGINT, self.stop_early)
        worker, worker_thread = None, None
        if not no_worker:
            worker = Worker(concurrency=concurrency)
            worker_thread = threading.Thread(target=worker.run, name="worker", daemon=True)
            worker_thread.start()
            self.stdout.write(f"worker {worker.worker_id}: running in-process")
        self.stdout.write(
            f"console: http://{host}:{port}/   API: http://{host}:{port}/api/v1/docs"
            f"   ({count} server process{'es' if count > 1 else ''})"
        )
        children: list[subprocess.Popen[bytes]] = []
        try:
            children = [self.child(sock.fileno()) for _ in range(count - 1)]
            self.serve(self.endpoints(sock))
        finally:
            for child in children:
                child.terminate()
            for child in children:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            sock.close()
            if worker is not None and worker_thread is not None:
                self.stop_worker(worker, worker_thread)

    def stop_early(self, signum, frame) -> None:
        from twisted.internet import reactor as installed  # daphne.server's asyncio reactor

        reactor: Any = installed  # twisted types its global reactor loosely
        reactor.callFromThread(reactor.stop)  # run by the reactor once it starts

    def stop_worker(self, worker: Worker, thread: threading.Thread) -> None:
        """Stop the in-process worker as ``runtime_worker`` stops: wait for its loops to finish
        their boundary, release their leases and record the stop (its thread is a daemon, so
        without this wait the process would exit under it and leave the row to turn stale)."""

        def leave_now(signum, frame):  # a second signal while the worker finishes
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, leave_now)
        signal.signal(signal.SIGINT, leave_now)
        self.stderr.write(f"worker {worker.worker_id}: stopping after this boundary")
        worker.stop()
        while thread.is_alive():
            thread.join(0.2)
        self.stderr.write(f"worker {worker.worker_id}: stopped")

    def process_count(self, processes: str) -> int:
        if processes == "auto":
            return auto_processes()
        try:
            count = int(processes)
        except ValueError:
            raise CommandError("--processes is a number or auto") from None
        if count < 1:
            raise CommandError("--processes must be at least 1")
        if count > 1 and os.name != "posix":
            raise CommandError("several server processes need a POSIX platform")
        return count

    def child(self, fd: int) -> subprocess.Popen[bytes]:
        command = [sys.executable, str(MANAGE), "runtime_serve", "--fd", str(fd)]
        return subprocess.Popen(command, pass_fds=(fd,), stdin=subprocess.DEVNULL)

    def child_socket(self, fd: int) -> socket.socket:
        """A child's socket: on Linux its own, bound to the inherited socket's address (the
        inherited one is closed here; the first process keeps serving it), else the
        inherited one."""
        inherited = socket.socket(fileno=fd)
        if not REUSE_PORT:
            return inherited
        with inherited:
            host, port = inherited.getsockname()[:2]
            return listening_socket(host, port, family=inherited.family, reuse_port=True)

    def endpoints(self, sock: socket.socket) -> list[str]:
        """daphne's endpoint for the socket bound up front (IPv6 needs its domain named)."""
        domain = ":domain=INET6" if sock.family == socket.AF_INET6 else ""
        endpoint = f"fd:fileno={sock.fileno()}{domain}"
        sock.detach()  # daphne serves the descriptor itself
        return [endpoint]

    def serve(self, endpoints: list[str]) -> None:
        open_pool()  # before the first request, in every process
        Server(
            application=get_default_application(), endpoints=endpoints, signal_handlers=True
        ).run()
