"""``manage.py runtime_resume RUN --ticket ID (--approve | --deny [--reason R] | --input JSON)``."""

from __future__ import annotations

import getpass

from django.core.management.base import CommandError

from runtime.crash import crash_point
from runtime.documents import paused_line
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import CommittedUnread, RuntimeFault
from runtime.management.base import RuntimeCommand
from runtime.models import Ticket
from runtime.operations import resume
from runtime.untrusted import UntrustedJSONError, is_id, parse_json


class Command(RuntimeCommand):
    help = "Answer a run's open ticket and print the run's state."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--ticket", required=True)
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--approve", action="store_true")
        group.add_argument("--deny", action="store_true")
        group.add_argument(
            "--input",
            help="the answer to an input ticket, as JSON text: '\"yes\"' for a string (quoted"
            " inside the shell's quotes), '{\"amount\": 5}' for an object",
        )
        parser.add_argument("--reason", default="")
        parser.add_argument("--idempotency-key")

    def handle(
        self, *args, run_id, ticket, approve, deny, input, reason, idempotency_key, **options
    ):
        if input is not None:
            try:
                value = parse_json(input, "--input")
            except UntrustedJSONError as exc:
                raise CommandError(str(exc)) from exc
            decision = Decision.INPUT
        else:
            value, decision = None, Decision.APPROVE if approve else Decision.DENY
        # The kind comes from the ticket named; a wrong ticket is refused by resume itself.
        kind = (
            Ticket.objects.filter(id=ticket).values_list("kind", flat=True).first()
            if is_id(ticket)
            else None
        )
        command = ResumeCommand(
            ticket_id=ticket,
            kind=TicketKind(kind) if kind else TicketKind.APPROVAL,
            decision=decision,
            input=value,
            reason=reason,
        )
        try:
            document = resume(
                run_id, command, actor=f"cli:{getpass.getuser()}", idempotency_key=idempotency_key
            )
        except CommittedUnread as done:  # it took effect; only the read after it failed
            crash_point("resume_committed")
            self.stdout.write(f"run {run_id}: committed (commit #{done.seq}); {done.__cause__}")
            return
        except RuntimeFault as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        crash_point("resume_committed")
        paused = f", {line}" if (line := paused_line(document["pause"])) else ""
        self.stdout.write(
            f"run {run_id}: {document['state']}{paused} (version {document['version']})"
        )
