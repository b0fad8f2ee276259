"""``manage.py runtime_fsck [--thread ID | --since DAYS] [--json]``: the log checker.

Folds every thread's commit log (or one thread's, or those of the threads with a commit in
the last DAYS days) and compares it with the projections (runtime.fsck). ``--since`` reads
its threads from the ``commit_created`` index, so its cost follows the recent commits, not
the history; DAYS is a number of days, fractions allowed (``--since 0.5``: the last 12 hours).
Prints one line per violation, ``thread=<id> seq=<n> <what>``, then ``checked <n> thread(s):
<m> violation(s)``, or with ``--json`` one object ``{"threads", "violations": [{"thread_id",
"seq", "what"}], "ok"}``. Exits 0 when the log and the projections agree, 1 on any violation,
2 for an unknown thread, a negative DAYS, or ``--thread`` with ``--since``.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandError
from django.utils import timezone

from runtime import fsck
from runtime.errors import NotFound
from runtime.management.base import RuntimeCommand
from runtime.models import Thread


class Command(RuntimeCommand):
    help = "Fold each thread's commit log and compare it with the projections (the log checker)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--thread", dest="thread_id", metavar="ID", help="check one thread")
        parser.add_argument(
            "--since",
            type=float,
            metavar="DAYS",
            help="check only the threads with a commit in the last DAYS days",
        )
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(
        self, *args: Any, thread_id: str | None = None, since: float | None = None, **options: Any
    ) -> None:
        if thread_id is not None and since is not None:
            raise CommandError("--thread and --since exclude each other: give one", returncode=2)
        if since is not None and since < 0:
            raise CommandError("--since must be 0 or more days", returncode=2)
        if since is not None:
            recent = fsck.recent_threads(timezone.now() - timedelta(days=since))
            violations = fsck.check_each(recent)
            threads = len(recent)
        else:
            try:
                violations = fsck.check(thread_id)
            except NotFound as exc:
                raise CommandError(exc.message, returncode=2) from exc
            threads = 1 if thread_id is not None else Thread.objects.count()
        if options["json"]:
            document = {
                "threads": threads,
                "violations": [v.as_dict() for v in violations],
                "ok": not violations,
            }
            self.stdout.write(json.dumps(document, indent=2, sort_keys=True))
        else:
            for violation in violations:
                self.stdout.write(str(violation))
            self.stdout.write(f"checked {threads} thread(s): {len(violations)} violation(s)")
        if violations:
            raise CommandError(
                f"the log and the projections disagree ({len(violations)} violation(s))",
                returncode=1,
            )
