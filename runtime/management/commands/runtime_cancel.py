"""``manage.py runtime_cancel RUN [--reason R]``: end a run as cancelled."""

from __future__ import annotations

import getpass

from django.core.management.base import CommandError

from runtime.errors import CommittedUnread, RuntimeFault
from runtime.management.base import RuntimeCommand
from runtime.operations import cancel


class Command(RuntimeCommand):
    help = "Cancel a run (an ended run keeps its terminus) and print its state."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--reason", default="")

    def handle(self, *args, run_id, reason, **options):
        try:
            document = cancel(run_id, actor=f"cli:{getpass.getuser()}", reason=reason)
        except CommittedUnread as done:  # it took effect; only the read after it failed
            self.stdout.write(f"run {run_id}: cancelled (commit #{done.seq}); {done.__cause__}")
            return
        except RuntimeFault as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        self.stdout.write(f"run {run_id}: {document['state']} ({document['end_cause']})")
