"""``manage.py runtime_show RUN [--json]``: print a run's committed state."""

from __future__ import annotations

import json

from django.core.management.base import BaseCommand, CommandError

from runtime.documents import run_document
from runtime.errors import NotFound


class Command(BaseCommand):
    help = "Print the committed state of a run (the run document with --json)."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", help="print the run document")

    def handle(self, *args, run_id, **options):
        try:
            document = run_document(run_id)
        except NotFound as exc:
            raise CommandError(exc.message) from exc
        if options["json"]:
            self.stdout.write(json.dumps(document, indent=2, sort_keys=True))
            return
        cause = f" ({document['end_cause']})" if document["end_cause"] else ""
        self.stdout.write(
            f"run {document['id']} agent={document['agent']} state={document['state']}{cause} "
            f"version={document['version']}"
        )
        if document["ticket"]:
            ticket = document["ticket"]
            self.stdout.write(f"  open ticket {ticket['id']} kind={ticket['kind']}")
        for batch in document["batches"]:
            mark = "finalized" if batch["finalized"] else "open"
            self.stdout.write(f"  step {batch['step']} batch ({mark})")
            for call in batch["calls"]:
                self.stdout.write(
                    f"    [{call['index']}] {call['name']} {call['phase']} "
                    f"attempt={call['attempt']} op={call['operation_id']}"
                )
