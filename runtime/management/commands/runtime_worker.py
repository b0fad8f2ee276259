"""``manage.py runtime_worker``: run the worker until stopped (or idle with --until-idle)."""

from __future__ import annotations

import os
import signal

from django.core.management.base import BaseCommand, CommandError

from runtime.crash import check_environment
from runtime.worker import Worker


class Command(BaseCommand):
    help = "Claim runnable runs and drive them. First SIGTERM/SIGINT stops gracefully."

    def add_arguments(self, parser):
        parser.add_argument(
            "--until-idle", action="store_true", help="exit 0 once no run is Running"
        )
        parser.add_argument("--worker-id", help="this worker's id (default host:pid)")
        parser.add_argument(
            "--concurrency",
            type=int,
            default=1,
            help="runs driven at once, each on its own thread (default 1)",
        )

    def handle(self, *args, until_idle, worker_id, concurrency, **options):
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        try:
            crash_at = check_environment()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if crash_at:
            self.stderr.write(f"RUNTIME_CRASH_AT={crash_at}: this worker will exit there")
        worker = Worker(worker_id=worker_id, concurrency=concurrency, until_idle=until_idle)

        def on_signal(signum, frame):
            if worker.stopping.is_set():  # a second signal: leave now
                os._exit(128 + signum)
            self.stderr.write(f"worker {worker.worker_id}: stopping after this boundary")
            worker.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.stderr.write(f"worker {worker.worker_id}: started (concurrency {concurrency})")
        worker.run()
        self.stderr.write(f"worker {worker.worker_id}: stopped")
