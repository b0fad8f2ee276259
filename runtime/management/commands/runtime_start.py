"""``manage.py runtime_start --agent NAME --input TEXT [--metadata JSON]``: print the run id."""

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

    def handle(self, *args, agent, input, metadata, thread, **options):
        try:
            meta = parse_json(metadata, "--metadata")
        except UntrustedJSONError as exc:
            raise CommandError(str(exc)) from exc
        if not isinstance(meta, dict):
            raise CommandError("--metadata must be a JSON object")
        try:
            run_id = start_run(
                agent=agent,
                input=input,
                metadata=meta,
                thread_id=thread,
                actor=f"cli:{getpass.getuser()}",
            )
        except RuntimeFault as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        self.stdout.write(run_id)
