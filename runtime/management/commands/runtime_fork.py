"""``manage.py runtime_fork RUN --at-step N [--input TEXT] [--json] [--idempotency-key KEY]``:
fork a run from a step.

Starts a new run on a new thread whose committed history is RUN's up to the end of Step N
(copied; nothing runs again), then ``--input`` as a new user message, and prints the new
run's id (``--json``: its run document). RUN is never changed. With ``--idempotency-key``, the
same command sent again prints the fork it made and forks nothing. Exits 1 when the run cannot be
forked there (no such step, or it has not finished), 2 for a bad option.
"""

from __future__ import annotations

import getpass
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from runtime.documents import run_document
from runtime.errors import RuntimeFault
from runtime.operations import fork_run


class Command(BaseCommand):
    help = "Fork a run after one of its steps onto a new thread (nothing runs again)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("run_id")
        parser.add_argument(
            "--at-step", type=int, required=True, metavar="N", help="copy history to step N's end"
        )
        parser.add_argument("--input", default=None, help="a user message after the history")
        parser.add_argument("--json", action="store_true", help="print the new run's document")
        parser.add_argument(
            "--idempotency-key",
            default=None,
            help="the same key and options again print the fork it made, forking nothing",
        )

    def handle(self, *args: Any, run_id: str, at_step: int, **options: Any) -> None:
        try:
            new = fork_run(
                run_id,
                at_step=at_step,
                input=options["input"],
                actor=f"cli:{getpass.getuser()}",
                idempotency_key=options["idempotency_key"],
            )
        except RuntimeFault as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        if options["json"]:
            self.stdout.write(json.dumps(run_document(new), indent=2, sort_keys=True))
            return
        self.stdout.write(new)
