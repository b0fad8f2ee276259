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
so the first requests after a start do not wait for connections made one at a time. Once
stopped, it exits at once (``leave``): a request thread left waiting (for the stopped event
loop, or for a connection to a database that went away) must not hold the exit. The command
refuses to start when the database cannot be reached or has unapplied migrations
(``database_problem``). On Linux a child that dies is started again (``Children``) and a
child dies with the first process (``die_with``).

The address is bound before anything else starts: a busy port stops the command (exit 1, with
a message naming the address) before a worker registers. Stop with Ctrl-C or SIGTERM: the
children and the server stop, then the worker stops as ``runtime_worker`` does (it finishes
its current boundary, releases its leases and records the stop); a second signal exits at once.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

import psycopg
from channels.routing import get_default_application
from daphne.server import Server
from django.conf import settings
from django.core.management.base import CommandError
from django.db import DEFAULT_DB_ALIAS, connections
from django.urls import NoReverseMatch, reverse

from console.api.mount import docs_url
from console.consumers import max_message_bytes
from console.health import check_migrations
from runtime.db import open_pool
from runtime.management.base import RuntimeCommand
from runtime.worker import DEFAULT_MAX_INFLIGHT, Worker

MAX_AUTO_PROCESSES = 4
PR_SET_PDEATHSIG = 1  # prctl(2)


def child_command() -> tuple[list[str], dict[str, str]]:
    """How to start this command again in a child process, wherever the package is installed
    (no ``manage.py`` is looked for): ``python -m django`` with this process's settings
    module, and an environment whose PYTHONPATH starts with the folder that module's package
    was imported from, so the child finds the project whatever its working directory."""
    from django.conf import settings

    module = settings.SETTINGS_MODULE
    package = importlib.import_module(module.partition(".")[0])
    folder = str(Path(next(iter(package.__path__))).parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH", "")) if p)
    return [sys.executable, "-m", "django", "runtime_serve", "--settings", module], env


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


class Command(RuntimeCommand):
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
        parser.add_argument("--parent", type=int, help=argparse.SUPPRESS)  # a child's first process
        parser.add_argument(
            "--max-inflight",
            type=int,
            default=DEFAULT_MAX_INFLIGHT,
            help=f"runs the in-process worker drives at once (default {DEFAULT_MAX_INFLIGHT})",
        )
        parser.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="serve only; run `manage.py runtime_worker` separately",
        )

    def handle(
        self, *args, host, port, processes, fd, parent, max_inflight, concurrency, no_worker, **o
    ):
        if concurrency is not None:
            raise CommandError("--concurrency is replaced by --max-inflight N")
        if max_inflight < 1:
            raise CommandError("--max-inflight must be at least 1")
        count = self.process_count(processes)
        if fd is not None:  # a child: serve the address the first process bound
            die_with(parent)
            self.serve(self.endpoints(self.child_socket(fd)))
            leave()
        # Bound first: a busy port stops the command before a worker registers or a child starts.
        sock = first_socket(host, port, count)
        if (problem := database_problem()) is not None:
            sock.close()
            raise CommandError(problem)
        # A signal before daphne installs its handlers stops the server as soon as it runs.
        signal.signal(signal.SIGTERM, self.stop_early)
        signal.signal(signal.SIGINT, self.stop_early)
        worker, worker_thread = None, None
        if not no_worker:
            worker = Worker(max_inflight=max_inflight, shares_process=True)
            worker_thread = threading.Thread(target=worker.run, name="worker", daemon=True)
            worker_thread.start()
            self.stdout.write(f"worker {worker.worker_id}: running in-process")
        # The port bound (--port 0 picks one), and an IPv6 host in brackets, as URLs want it.
        address = f"[{host}]" if ":" in host else host
        base = f"http://{address}:{sock.getsockname()[1]}"
        self.stdout.write(f"{where(base)}   ({count} server process{'es' if count > 1 else ''})")
        children = None
        try:
            children = Children(sock, count - 1, self.stderr)
            self.serve(self.endpoints(sock))
        finally:
            if children is not None:
                children.stop()
            sock.close()
            if worker is not None and worker_thread is not None:
                self.stop_worker(worker, worker_thread)
        leave()

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
        """Serve until stopped. Raises CommandError when daphne could not listen (it logs
        why and stops; without this the command would exit 0 and no supervisor restart it)."""
        open_pool()  # before the first request, in every process
        name_address_families()
        limit = max_message_bytes()
        server = Server(
            application=get_default_application(),
            endpoints=endpoints,
            signal_handlers=True,
            websocket_max_message_size=limit,
            websocket_max_frame_size=limit,
        )
        # The reactor daphne.server installed (importing it any earlier would install another).
        from twisted.internet import reactor

        reactor.callWhenRunning(close_oversized_sockets, server)
        server.run()
        if not server.listening_addresses:
            raise CommandError(f"daphne could not listen on {endpoints}; see the error above")


def close_oversized_sockets(server: Server) -> None:
    """Make daphne fail a WebSocket connection with a close frame instead of dropping it
    (autobahn's ``failByDrop``, on for servers): a message over the size limit gets 1009
    ("message too big"), a text frame that is not UTF-8 1007, so a client learns why. Called
    once the reactor runs, when ``server.run`` has made its WebSocket factory."""
    server.ws_factory.setProtocolOptions(failByDrop=False)


def database_problem() -> str | None:
    """Why the server cannot serve from its database, or None. PostgreSQL is asked directly
    with a 5 s timeout (through the pool, a missing database is a 30 s wait per request,
    and then every request failed while /healthz said ok); then every migration must be
    applied (else every page fails on a missing table)."""
    database = connections[DEFAULT_DB_ALIAS]
    if database.vendor == "postgresql":
        try:
            psycopg.connect(**database.get_connection_params(), connect_timeout=5).close()
        except psycopg.Error as exc:
            reason = str(exc).strip().splitlines()[-1]
            return f"cannot reach the database (DATABASE_URL): {reason}"
    try:
        check_migrations()
    except RuntimeError as exc:
        return f"the database is not migrated ({exc}): run manage.py migrate first"
    finally:
        connections.close_all()  # this thread serves nothing: give its connection back
    return None


class Children:
    """The first process's children: started on a duplicate of the listening socket (daphne
    closes the one it adopts), started again when one exits unasked (a crash must not halve
    the server unnoticed), and stopped with the server."""

    RESTART_SECONDS = 1.0  # how soon a dead child is noticed (and the pace of a crash loop)

    def __init__(self, sock: socket.socket, count: int, log: Any) -> None:
        self.fd = os.dup(sock.fileno())
        os.set_inheritable(self.fd, True)
        self.log = log
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.processes = [self._start() for _ in range(count)]
        if count:
            threading.Thread(target=self._keep, name="server-children", daemon=True).start()

    def _start(self) -> subprocess.Popen[bytes]:
        command, env = child_command()
        command += ["--fd", str(self.fd), "--parent", str(os.getpid())]
        return subprocess.Popen(command, pass_fds=(self.fd,), stdin=subprocess.DEVNULL, env=env)

    def _keep(self) -> None:
        while not self.stopped.wait(self.RESTART_SECONDS):
            with self.lock:
                if self.stopped.is_set():
                    return
                for index, process in enumerate(self.processes):
                    if process.poll() is not None:
                        self.log.write(
                            f"server process {process.pid} exited with code"
                            f" {process.returncode}; starting another"
                        )
                        self.processes[index] = self._start()

    def stop(self) -> None:
        """Stop every child (SIGTERM, then SIGKILL after 10 s) and start no more."""
        with self.lock:
            self.stopped.set()
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        os.close(self.fd)


def leave() -> NoReturn:
    """Exit 0 now that the server, its children and its worker have stopped. A request
    thread may still wait for the event loop that stopped under it (a request running when
    the stop came: /readyz's channel-layer check, say), and the interpreter would wait for
    that thread for ever before exiting."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def die_with(parent: int | None) -> None:
    """Have the kernel stop this child (SIGTERM) when its first process dies, on Linux: a
    first process killed with SIGKILL must not leave children serving its port without a
    worker, and the port busy for its restart."""
    if sys.platform != "linux" or parent is None:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def name_address_families() -> None:
    """Twisted's ``fd`` endpoint parser passes ``domain=INET6`` on as the text "INET6", and
    adopting the socket then fails ("Listen failure: INET6"): map the name to the address
    family it names (AF_INET6) before daphne parses its endpoints."""
    from twisted.plugins.fd_endpoint import _FDParser

    parse = _FDParser._parseServer
    if getattr(parse, "names_families", False):
        return

    def parse_named(self: Any, reactor: Any, fileno: str, domain: Any = socket.AF_INET) -> Any:
        if isinstance(domain, str):
            domain = getattr(socket, f"AF_{domain}")
        return parse(self, reactor, fileno, domain)

    parse_named.names_families = True  # type: ignore[attr-defined]
    _FDParser._parseServer = parse_named  # type: ignore[method-assign]  # the fix above


def where(base: str) -> str:
    """ "console: URL   API: URL" for the URL map served (reversed: "console: base/   API:
    base/api/v1/docs" in this repository's project); a part not mounted is left out."""
    parts = []
    with contextlib.suppress(NoReverseMatch):
        parts.append(f"console: {base}{reverse('console:runs')}")
    if docs := docs_url():
        parts.append(f"API: {base}{docs}")
    return "   ".join(parts) or f"serving {base}/"
