"""Scheduled waits: timer tickets, and the workers that fire them when they are due.

A tool waits with ``ctx.wait_until(when)`` / ``ctx.wait_for(seconds)``: its call moves
Executing -> Awaiting on a ``timer`` ticket holding ``due_at`` (ISO 8601, UTC), and the run
holds no worker. Workers fire the due timers with the matching ResumeCommand (actor
``timer``): each worker looks at most once a second, between claims
(``runtime.worker.TIMER_CHECK_SECONDS``). Several workers may race for one: on PostgreSQL each
claims the ticket row with SKIP LOCKED, and on any database the commit's expected-version check
and the consumed ticket refuse a second fire, so a timer fires exactly once, also across
restarts (a due timer of a stopped deployment fires when a worker returns).
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from django.utils import timezone

from runtime import db
from runtime.crash import crash_point
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import NotAwaiting, RunEnded, TicketConsumed, TicketMismatch, VersionConflict
from runtime.models import Ticket
from runtime.tools import WaitRequested

log = logging.getLogger("runtime.timers")

ACTOR = "timer"
# A refusal here means another writer settled the ticket first (fired, cancelled, ended).
ALREADY_SETTLED = (TicketConsumed, NotAwaiting, RunEnded, TicketMismatch, VersionConflict)


def ticket_request(wait: WaitRequested) -> dict[str, Any]:
    """The request of a timer ticket: ``{"due_at": ISO 8601 UTC}``."""
    return {"due_at": wait.due_at.isoformat()}


def fire(run_id: str, ticket_id: str, *, actor: str = ACTOR) -> dict[str, Any]:
    """Fire a timer now (a worker when it is due, or an operator early); return the run
    document. Raises the resume refusals (TicketConsumed, RunEnded, ...) and NotFound."""
    from runtime.operations import resume

    command = ResumeCommand(ticket_id=ticket_id, kind=TicketKind.TIMER, decision=Decision.APPROVE)
    return resume(run_id, command, actor=actor)


def fire_due(now: datetime | None = None, *, limit: int = 20) -> int:
    """Fire up to ``limit`` due timers, oldest first; return how many this call fired."""
    due = Ticket.objects.filter(state="open", kind="timer", due_at__lte=now or timezone.now())
    if not due.exists():  # the usual answer, in one statement and no transaction
        return 0
    fired = 0
    for _ in range(limit):
        with db.atomic():
            rows = due.order_by("due_at")
            if db.connection.vendor == "postgresql":
                rows = rows.select_for_update(skip_locked=True)
            row = rows.values("id", "run_id").first()
            if row is None:
                return fired
            try:
                fire(row["run_id"], row["id"])
            except ALREADY_SETTLED as exc:
                log.info("timer %s: already settled (%s)", row["id"], exc.code)
                continue
        crash_point("timer_fired")
        fired += 1
    return fired
