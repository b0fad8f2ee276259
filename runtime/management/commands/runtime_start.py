"""``manage.py runtime_start --agent NAME --input TEXT [--metadata JSON] [--thread ID]
[--idempotency-key KEY]``: print the run id. With a key, the same command sent again (say,
after it died past its commit) prints the run it started and starts nothing."""

from __future__ import annotations

import getpass

from django.core.management.base import CommandError

from runtime.errors import RuntimeFault
from runtime.management.base import RuntimeCommand
from runtime.operations import start_run
from runtime.untrusted import UntrustedJSONError, parse_json


class Command(RuntimeCommand):
    help = "Start a run on a new thread (or --thread) and print its id."

    def add_arguments(self, parser):
        parser.add_argument("--agent", required=True)
        parser.add_argument("--input", required=True, help="the user's message")
        parser.add_argument("--metadata", default="{}", help="a JSON object (may hold a script)")
        parser.add_argument("--thread", help="start on this thread instead of a new one")
        parser.add_argument(
            "--idempotency-key",
            default=None,
            help="the same key and options again print the run it started, starting nothing",
        )

    def handle(self, *args, agent, input, metadata, thread, idempotency_key, **options):
        try:
            meta = parse_json(metadata, "--metadata")
        except UntrustedJSONError as exc:
            said = str(exc) if "--metadata" in str(exc) else f"--metadata: {exc}"
            raise CommandError(said, returncode=2) from exc  # 2: an argument refused
        if not isinstance(meta, dict):
            raise CommandError("--metadata must be a JSON object", returncode=2)
        try:
            run_id = start_run(
                agent=agent,
                input=input,
                metadata=meta,
                thread_id=thread,
                actor=f"cli:{getpass.getuser()}",
                idempotency_key=idempotency_key,
            )
        except RuntimeFault as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        self.stdout.write(run_id)
