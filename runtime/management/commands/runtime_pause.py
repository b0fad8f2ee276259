"""``manage.py runtime_pause RUN [--reason R] [--resume]``: pause a run, or resume a paused one."""

from __future__ import annotations

import getpass

from django.core.management.base import CommandError

from runtime.documents import paused_line
from runtime.errors import CommittedUnread, RuntimeFault
from runtime.management.base import RuntimeCommand
from runtime.operations import pause, resume_run


class Command(RuntimeCommand):
    help = (
        "Pause a run (it stops at its next boundary; no worker holds it until it is resumed), "
        "or with --resume let any worker continue a paused run; print its state."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--reason", default="")
        parser.add_argument("--resume", action="store_true", help="resume a paused run")
        parser.add_argument("--idempotency-key", default=None)

    def handle(self, *args, run_id, reason, resume, idempotency_key, **options):
        act, verb = (resume_run, "resumed") if resume else (pause, "paused")
        try:
            document = act(
                run_id,
                actor=f"cli:{getpass.getuser()}",
                reason=reason,
                idempotency_key=idempotency_key,
            )
        except CommittedUnread as done:  # it took effect; only the read after it failed
            self.stdout.write(f"run {run_id}: {verb} (commit #{done.seq}); {done.__cause__}")
            return
        except RuntimeFault as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        line = paused_line(document["pause"]) or "not paused"
        self.stdout.write(f"run {run_id}: {document['state']}, {line}")
