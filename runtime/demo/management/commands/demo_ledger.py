"""``manage.py demo_ledger [--json]``: print the demo agent's effect ledger."""

from __future__ import annotations

import json

from runtime.demo.models import LedgerEffect
from runtime.management.base import RuntimeCommand


class Command(RuntimeCommand):
    help = "Print every effect the demo tools applied, with how many times each was applied."

    def add_arguments(self, parser):
        parser.add_argument("--json", action="store_true")
        parser.add_argument("--run", help="only this run's effects")

    def handle(self, *args, run, **options):
        rows = LedgerEffect.objects.order_by("created_at", "id")
        if run:
            rows = rows.filter(run_id=run)
        effects = [
            {
                "operation_id": r.operation_id,
                "key": r.key,
                "tool": r.tool,
                "run_id": r.run_id,
                "applied": r.applied,
            }
            for r in rows
        ]
        if options["json"]:
            self.stdout.write(json.dumps(effects, indent=2))
            return
        for e in effects:
            self.stdout.write(f"{e['operation_id']} {e['tool']} key={e['key']} x{e['applied']}")
