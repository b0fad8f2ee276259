"""``manage.py runtime_serve``: the console, the API and an in-process worker, in one process.

The one-command server for development and for embedding (``scripts/start`` runs it): one
daphne process serves HTTP and WebSockets, and a worker drives runs on threads of the same
process (its commits wake it through the in-process signal). A process answers its requests
on threads that share one interpreter, so it uses about one core. Several server processes
are run the standard way instead: one daphne process per port under a process manager
(``deploy/runtime-web@.service``), behind a reverse proxy (``deploy/nginx.conf``), with the
Redis channel layer (``REDIS_URL``) and ``runtime_worker`` processes (README, "Several server
processes"). ``--processes`` is refused with that pointer.

daphne listens first, on Twisted's documented ``tcp:`` endpoint (``tcp6:`` for an IPv6 host):
a busy port stops the command (exit 1, with a message naming the address) before a worker
registers, because the connection pool opens and the worker starts only from daphne's
``ready_callable``, which it calls once it holds the port. The command refuses to start when
the database cannot be reached or has unapplied migrations (``database_problem``).

Stop with Ctrl-C or SIGTERM: the server stops, then the worker stops as ``runtime_worker``
does (it finishes its current boundary, releases its leases and records the stop); a second
signal exits at once. Once stopped, the process exits at once (``leaves_at_exit``,
``runtime.management.base.leave``): a request thread
left waiting (for the stopped event loop, or for a connection to a database that went away)
must not hold the exit.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading
from typing import Any

import psycopg
from channels.routing import get_default_application
from daphne.server import Server
from django.core.management.base import CommandError
from django.db import connections
from django.urls import NoReverseMatch, reverse
from twisted.internet.endpoints import quoteStringArgument

from console.api.mount import docs_url
from console.consumers import max_message_bytes
from console.health import check_migrations
from runtime import db
from runtime.management.base import RuntimeCommand
from runtime.worker import DEFAULT_MAX_INFLIGHT, Worker, leave_now

# Connections the kernel queues before daphne accepts them (Twisted's default is 50): a burst
# of clients connecting at once must not overflow it and wait for their SYN to be resent.
BACKLOG = 1024

SEVERAL_PROCESSES = (
    "--processes is gone: runtime_serve is one process. To serve from several, run one daphne"
    " process per port behind a reverse proxy, with REDIS_URL and runtime_worker processes"
    ' (docs/processes.md, "Several server processes";'
    " deploy/runtime-web@.service, deploy/nginx.conf)"
)


def endpoint(host: str, port: int) -> str:
    """daphne's endpoint string for ``host:port``: Twisted's ``tcp:`` endpoint, or ``tcp6:``
    when ``host`` is an IPv6 address (a colon in it; brackets are dropped), with the colons
    of the address escaped as Twisted's endpoint syntax asks (``quoteStringArgument``)."""
    host = host.strip("[]")
    kind = "tcp6" if ":" in host else "tcp"
    return f"{kind}:port={port}:interface={quoteStringArgument(host)}:backlog={BACKLOG}"


class Command(RuntimeCommand):
    help = "Serve the console and API with one daphne process and an in-process worker."
    leaves_at_exit = True  # see the module docstring

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--processes", help=argparse.SUPPRESS)  # refused: SEVERAL_PROCESSES
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

    def handle(self, *args, host, port, processes, max_inflight, concurrency, no_worker, **o):
        if processes is not None:
            raise CommandError(SEVERAL_PROCESSES)
        if concurrency is not None:
            raise CommandError("--concurrency is replaced by --max-inflight N")
        if max_inflight < 1:
            raise CommandError("--max-inflight must be at least 1")
        if (problem := database_problem()) is not None:
            raise CommandError(problem)
        # A signal before daphne installs its handlers stops the server as soon as it runs.
        signal.signal(signal.SIGTERM, self.stop_early)
        signal.signal(signal.SIGINT, self.stop_early)
        self.host, self.no_worker, self.max_inflight = host, no_worker, max_inflight
        self.worker: Worker | None = None
        self.worker_thread: threading.Thread | None = None
        limit = max_message_bytes()
        self.server = Server(
            application=get_default_application(),
            endpoints=[endpoint(host, port)],
            signal_handlers=True,
            websocket_max_message_size=limit,
            websocket_max_frame_size=limit,
            ready_callable=self.ready,
        )
        # The reactor daphne.server installed (importing it any earlier would install another).
        from twisted.internet import reactor

        reactor.callWhenRunning(close_oversized_sockets, self.server)
        try:
            self.server.run()
        finally:
            if self.worker is not None and self.worker_thread is not None:
                self.stop_worker(self.worker, self.worker_thread)
        if not self.server.listening_addresses:
            # daphne logged why ("Listen failure: ...") and returned without serving.
            raise CommandError(
                f"cannot listen on {host}:{port} (daphne's reason is above). Another process"
                " may be using it; choose another port with PORT=... ./scripts/start or"
                " manage.py runtime_serve --port ..."
            )

    def ready(self) -> None:
        """What daphne calls once it listens, before it serves: open the connection pool (before
        the first request), start the in-process worker, and say where it serves."""
        db.open_pool()
        if not self.no_worker:
            self.worker = Worker(max_inflight=self.max_inflight, shares_process=True)
            self.worker_thread = threading.Thread(
                target=self.worker.run, name="worker", daemon=True
            )
            self.worker_thread.start()
            self.stdout.write(f"worker {self.worker.worker_id}: running in-process")
        # The port bound (--port 0 picks one), and an IPv6 host in brackets, as URLs want it.
        host = self.host.strip("[]")
        address = f"[{host}]" if ":" in host else host
        self.stdout.write(where(f"http://{address}:{self.server.listening_addresses[0][1]}"))

    def stop_early(self, signum, frame) -> None:
        from twisted.internet import reactor as installed  # daphne.server's asyncio reactor

        reactor: Any = installed  # twisted types its global reactor loosely
        reactor.callFromThread(reactor.stop)  # run by the reactor once it starts

    def stop_worker(self, worker: Worker, thread: threading.Thread) -> None:
        """Stop the in-process worker as ``runtime_worker`` stops: wait for its loops to finish
        their boundary, release their leases and record the stop (its thread is a daemon, so
        without this wait the process would exit under it and leave the row to turn stale)."""

        def second(signum, frame):  # a second signal while the worker finishes
            leave_now(signum)

        signal.signal(signal.SIGTERM, second)
        signal.signal(signal.SIGINT, second)
        self.stderr.write(f"worker {worker.worker_id}: stopping after this boundary")
        worker.stop()
        while thread.is_alive():
            thread.join(0.2)
        self.stderr.write(f"worker {worker.worker_id}: stopped")


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
    database = db.wrapper()  # the runtime's alias (RUNTIME_DATABASE)
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


def where(base: str) -> str:
    """ "console: URL   API: URL" for the URL map served (reversed: "console: base/   API:
    base/api/v1/docs" in this repository's project); a part not mounted is left out."""
    parts = []
    with contextlib.suppress(NoReverseMatch):
        parts.append(f"console: {base}{reverse('console:runs')}")
    if docs := docs_url():
        parts.append(f"API: {base}{docs}")
    return "   ".join(parts) or f"serving {base}/"
