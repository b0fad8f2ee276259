"""``manage.py runtime_worker``: run the worker until stopped (or idle with --until-idle)."""

from __future__ import annotations

import argparse
import signal

from django.core.management.base import CommandError

from runtime import checks, metrics
from runtime.crash import check_environment
from runtime.management.base import RuntimeCommand
from runtime.worker import DEFAULT_MAX_INFLIGHT, Worker, leave_now


class Command(RuntimeCommand):
    help = "Claim runnable runs and drive them. First SIGTERM/SIGINT stops gracefully."
    leaves_at_exit = True  # runtime.management.base.leave: a stopped worker exits at once
    requires_system_checks = [checks.TAG]  # the runtime's own (see runtime.checks.TAG)

    def add_arguments(self, parser):
        parser.add_argument(
            "--until-idle", action="store_true", help="exit 0 once no run is Running"
        )
        parser.add_argument("--worker-id", help="this worker's id (default host:pid)")
        parser.add_argument(
            "--max-inflight",
            type=int,
            default=DEFAULT_MAX_INFLIGHT,
            help=f"runs driven at once on one event loop (default {DEFAULT_MAX_INFLIGHT}); "
            "a run waiting on its model holds no thread and no database connection",
        )
        parser.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
        parser.add_argument(
            "--metrics-port",
            type=int,
            help="serve this process's Prometheus metrics at http://ADDR:PORT/metrics",
        )
        parser.add_argument(
            "--metrics-addr",
            default="127.0.0.1",
            help="the address --metrics-port listens on (default 127.0.0.1)",
        )

    def handle(
        self, *args, until_idle, worker_id, max_inflight, concurrency, metrics_port, **options
    ):
        if concurrency is not None:
            raise CommandError(
                "--concurrency is replaced by --max-inflight N (runs driven at once on one "
                "event loop; the database connections are RUNTIME_WORKER_DB_CONNECTIONS)"
            )
        if max_inflight < 1:
            raise CommandError("--max-inflight must be at least 1")
        if metrics_port is not None:
            self.serve_metrics(metrics_port, options["metrics_addr"])
        try:
            crash_at = check_environment()
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if crash_at:
            self.stderr.write(f"RUNTIME_CRASH_AT={crash_at}: this worker will exit there")
        worker = Worker(worker_id=worker_id, max_inflight=max_inflight, until_idle=until_idle)

        def on_signal(signum, frame):
            if worker.stopping.is_set():  # a second signal: leave now
                leave_now(signum)
            self.stderr.write(f"worker {worker.worker_id}: stopping after this boundary")
            worker.stop()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        self.stderr.write(f"worker {worker.worker_id}: started (max in flight {max_inflight})")
        worker.run()
        self.stderr.write(f"worker {worker.worker_id}: stopped")

    def serve_metrics(self, port: int, addr: str) -> None:
        """Start the metrics endpoint; a port that cannot be bound stops the command."""
        if not 0 < port < 65536:
            raise CommandError(f"--metrics-port must be 1-65535, got {port}")
        try:
            metrics.serve(port, addr)
        except OSError as exc:
            raise CommandError(f"cannot serve metrics on {addr}:{port}: {exc}") from exc
        self.stderr.write(f"metrics: http://{addr}:{port}/metrics")
