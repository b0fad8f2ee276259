"""``manage.py runtime_prune --ended-before DAYS [--dry-run] [--batch-size N] [--json]``.

Deletes the logs of threads whose runs all ended more than DAYS days ago (runtime.retention),
in batches, and prints what it pruned and every eligible thread it kept, with the reason:

    kept thread=<id> reason=<unreconciled_indeterminate|open_child>: <why>
    pruned 9900 thread(s), 9900 run(s), 29700 commit(s); kept 100 thread(s)

``--json`` prints ``{"dry_run", "cutoff", "pruned": {"threads", "runs", "commits"},
"kept": [{"thread_id", "reasons"}]}``. Exits 0; 2 for a bad option.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from runtime import retention
from runtime.management.base import RuntimeCommand


class Command(RuntimeCommand):
    help = "Delete the logs of threads whose runs all ended before a cutoff (keeps what matters)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--ended-before",
            type=float,
            required=True,
            metavar="DAYS",
            help="prune threads whose last run ended more than DAYS days ago (0: any ended)",
        )
        parser.add_argument("--dry-run", action="store_true", help="report, delete nothing")
        parser.add_argument(
            "--batch-size",
            type=int,
            default=retention.BATCH_SIZE,
            help=f"threads per transaction (default {retention.BATCH_SIZE})",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, ended_before: float, **options: Any) -> None:
        if ended_before < 0:
            raise CommandError("--ended-before must be 0 or more days", returncode=2)
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1", returncode=2)
        cutoff = timezone.now() - timedelta(days=ended_before)
        report = retention.prune(
            cutoff, dry_run=options["dry_run"], batch_size=options["batch_size"]
        )
        kept = sorted(report.kept.items())
        if options["json"]:
            document = {
                "dry_run": report.dry_run,
                "cutoff": cutoff.isoformat(),
                "pruned": {k: report.pruned[k] for k in ("threads", "runs", "commits")},
                "kept": [{"thread_id": tid, "reasons": reasons} for tid, reasons in kept],
            }
            self.stdout.write(json.dumps(document, indent=2, sort_keys=True))
            return
        for thread_id, reasons in kept:
            why = "; ".join(retention.REASONS[r] for r in reasons)
            self.stdout.write(f"kept thread={thread_id} reason={','.join(reasons)}: {why}")
        verb = "would prune" if report.dry_run else "pruned"
        p = report.pruned
        self.stdout.write(
            f"{verb} {p['threads']} thread(s), {p['runs']} run(s), {p['commits']} commit(s) "
            f"ended before {cutoff:%Y-%m-%d %H:%M:%S %Z}; kept {len(kept)} thread(s)"
        )
