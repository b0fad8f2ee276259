"""``manage.py runtime_serve``: the console, the API and an in-process worker.

daphne serves HTTP and WebSockets; a worker drives runs on threads of the first process (its
commits wake it through the in-process signal). Under ASGI, Django runs every sync view of a
process on one thread, so one process answers one sync request at a time: with
``--processes N`` the command binds the listening socket once and serves it from N daphne
processes (the first one, plus N-1 children started with ``--fd``), and the kernel spreads
connections among them. The default ``auto`` serves with one process per CPU (at most 4)
when the channel layer is shared (``REDIS_URL``) and the platform can hand a socket to a
child (POSIX); with the in-memory layer it serves with one, because live deltas published
in one process reach only the viewers connected to that same process. Stop with Ctrl-C or
SIGTERM: the children and the server stop, then the worker finishes its current boundary.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

from channels.routing import get_default_application
from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from runtime.worker import Worker

MAX_AUTO_PROCESSES = 4
MANAGE = Path(__file__).resolve().parents[3] / "manage.py"


def auto_processes() -> int:
    """How many server processes ``--processes auto`` means here (see the module doc)."""
    backend = settings.CHANNEL_LAYERS["default"]["BACKEND"]
    if os.name != "posix" or backend.endswith("InMemoryChannelLayer"):
        return 1
    return max(1, min(MAX_AUTO_PROCESSES, os.cpu_count() or 1))


def listening_socket(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port``, ready to be shared with child processes."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CommandError(f"cannot listen on {host}:{port}: {exc}") from exc
    sock.listen(1024)
    sock.set_inheritable(True)
    return sock


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
        if fd is not None:  # a child: serve the socket the first process bound
            self.serve(build_endpoint_description_strings(file_descriptor=fd))
            return
        worker = None
        if not no_worker:
            worker = Worker(concurrency=concurrency)
            threading.Thread(target=worker.run, name="worker", daemon=True).start()
            self.stdout.write(f"worker {worker.worker_id}: running in-process")
        self.stdout.write(
            f"console: http://{host}:{port}/   API: http://{host}:{port}/api/v1/docs"
            f"   ({count} server process{'es' if count > 1 else ''})"
        )
        children: list[subprocess.Popen[bytes]] = []
        try:
            if count == 1:
                self.serve(build_endpoint_description_strings(host=host, port=port))
                return
            sock = listening_socket(host, port)
            children = [self.child(sock.fileno()) for _ in range(count - 1)]
            self.serve(build_endpoint_description_strings(file_descriptor=sock.fileno()))
        finally:
            for child in children:
                child.terminate()
            for child in children:
                try:
                    child.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            if worker is not None:
                worker.stop()

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

    def serve(self, endpoints: list[str]) -> None:
        Server(
            application=get_default_application(), endpoints=endpoints, signal_handlers=True
        ).run()
