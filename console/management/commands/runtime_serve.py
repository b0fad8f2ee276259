"""``manage.py runtime_serve``: the console, the API and an in-process worker in one process.

The embedded default: daphne serves HTTP and WebSockets, and a worker drives runs on threads
of the same process (its commits wake it through the in-process signal). Stop with Ctrl-C or
SIGTERM: the server stops, then the worker finishes its current boundary.
"""

from __future__ import annotations

import threading

from channels.routing import get_default_application
from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from django.core.management.base import BaseCommand, CommandError

from runtime.worker import Worker


class Command(BaseCommand):
    help = "Serve the console and API with daphne, with an in-process worker."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
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

    def handle(self, *args, host, port, concurrency, no_worker, **options):
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        worker = None
        if not no_worker:
            worker = Worker(concurrency=concurrency)
            threading.Thread(target=worker.run, name="worker", daemon=True).start()
            self.stdout.write(f"worker {worker.worker_id}: running in-process")
        self.stdout.write(f"console: http://{host}:{port}/   API: http://{host}:{port}/api/v1/docs")
        try:
            Server(
                application=get_default_application(),
                endpoints=build_endpoint_description_strings(host=host, port=port),
                signal_handlers=True,
            ).run()
        finally:
            if worker is not None:
                worker.stop()
