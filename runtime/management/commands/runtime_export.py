"""``manage.py runtime_export (RUN | --thread ID) [--output FILE]``: a thread's log as JSON lines.

A RUN exports the thread it belongs to: a thread's log is only meaningful whole. The format is
runtime.retention's: a header line, then one line per commit; ``runtime_import`` loads it.
Writes to stdout unless ``--output``. Exits 2 for an unknown run or thread.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import CommandError

from runtime import retention
from runtime.errors import NotFound
from runtime.management.base import RuntimeCommand
from runtime.models import Run


class Command(RuntimeCommand):
    help = "Write a thread's commit log (of a run's thread, or --thread) as JSON lines."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id", nargs="?", metavar="RUN", help="export this run's thread")
        parser.add_argument("--thread", dest="thread_id", metavar="ID", help="the thread")
        parser.add_argument("--output", "-o", metavar="FILE", help="write here, not stdout")

    def handle(self, *args: Any, run_id: str | None, thread_id: str | None, **options: Any):
        if (run_id is None) == (thread_id is None):
            raise CommandError("give a RUN or --thread ID (one of them)", returncode=2)
        if run_id is not None:
            thread_id = Run.objects.filter(id=run_id).values_list("thread_id", flat=True).first()
            if thread_id is None:
                raise CommandError(f"run {run_id} does not exist", returncode=2)
        assert thread_id is not None
        try:
            lines = list(retention.export_thread(thread_id))
        except NotFound as exc:
            raise CommandError(exc.message, returncode=2) from exc
        if options["output"]:
            with open(options["output"], "w", encoding="utf-8", newline="\n") as out:
                out.writelines(lines)
        else:
            sys.stdout.writelines(lines)
            sys.stdout.flush()
