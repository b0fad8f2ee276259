"""The inbox of open tickets and answering one (approve, deny with a reason, typed input).

An answer is a ResumeCommand sent through ``runtime.operations.resume``, which checks it
against the committed ticket and validates input with the ticket's JSON schema. When two
people answer one ticket, the second is told who answered it and when (from the Ticket row).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.utils.http import url_has_allowed_host_and_scheme

from console.forms import DenyForm, SchemaForm
from console.models import READ, RESUME
from console.views.common import HtmxHttpRequest, actor, needs, render_page
from runtime import operations
from runtime.domain.model import DECISIONS_FOR_KIND, Decision, ResumeCommand, TicketKind
from runtime.errors import (
    InvalidInput,
    NotAwaiting,
    RunEnded,
    RuntimeFault,
    TicketConsumed,
    TicketMismatch,
)
from runtime.models import Ticket

KEY_PATTERN = re.compile(r"^[0-9a-f]{32}$")
CLOSED_FAULTS = (TicketConsumed, RunEnded, NotAwaiting, TicketMismatch)


@dataclass
class TicketCard:
    """One ticket as a card: its forms, and what happened when it was last answered."""

    ticket: Ticket
    answer_form: SchemaForm | None = None
    deny_form: DenyForm = field(default_factory=DenyForm)
    key: str = field(default_factory=lambda: uuid.uuid4().hex)
    error: str = ""
    notice: str = ""
    done: bool = False

    @property
    def decisions(self) -> list[str]:
        kind = TicketKind(self.ticket.kind)
        return [d.value for d in Decision if d in DECISIONS_FOR_KIND[kind]]

    @property
    def question(self) -> Any:
        request = self.ticket.request or {}
        return request.get("question") if isinstance(request, dict) else None


def build_card(ticket: Ticket, data: Any = None) -> TicketCard:
    card = TicketCard(ticket=ticket)
    if ticket.kind in ("input", "delegation") and ticket.state == "open":
        card.answer_form = SchemaForm(ticket.schema or {}, data=data)
    return card


def closed_notice(ticket: Ticket) -> str:
    """Say who closed the ticket and when, or why it cannot be answered."""
    ticket.refresh_from_db()
    when = ticket.closed_at.strftime("%Y-%m-%d %H:%M:%S UTC") if ticket.closed_at else "?"
    who = ticket.closed_by or "an unnamed actor"
    if ticket.state == "consumed":
        return f"Already answered ({ticket.decision}) by {who} at {when}."
    if ticket.state == "void":
        return (
            f"Closed without an answer: the run ended ({ticket.run.end_cause}), by {who} at {when}."
        )
    return "This ticket is not the run's open ticket."


@needs(READ)
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    """Every open ticket, oldest first, answerable in place; the last answers below."""
    open_tickets = (
        Ticket.objects.filter(state="open")
        .select_related("call", "run")
        .order_by("created_at", "id")
    )
    recent = (
        Ticket.objects.exclude(state="open")
        .select_related("call", "run")
        .order_by("-closed_at")[:15]
    )
    context = {"cards": [build_card(t) for t in open_tickets], "recent": recent}
    return render_page(request, "console/inbox.html", context, partial="tickets")


def _ticket(ticket_id: str) -> Ticket:
    ticket = Ticket.objects.select_related("call", "run").filter(id=ticket_id).first()
    if ticket is None:
        raise Http404(f"ticket {ticket_id} does not exist")
    return ticket


@needs(READ)
def ticket_detail(request: HtmxHttpRequest, ticket_id: str) -> HttpResponse:
    """One ticket on its own page (deep link; where a form answered without JS lands)."""
    ticket = _ticket(ticket_id)
    card = build_card(ticket)
    if ticket.state != "open":
        card.notice = closed_notice(ticket)
    return render_page(request, "console/ticket.html", {"card": card}, partial="card")


def _respond(
    request: HtmxHttpRequest, card: TicketCard, status: int, next_url: str | None
) -> HttpResponse:
    if request.htmx:
        return render_page(
            request, "console/ticket.html", {"card": card}, partial="card", status=status
        )
    if status < 300:
        messages.success(request, card.notice)
        return redirect(
            next_url or "console:ticket", **({} if next_url else {"ticket_id": card.ticket.id})
        )
    return render_page(request, "console/ticket.html", {"card": card}, status=status)


@needs(RESUME, write=True)
def answer_ticket(request: HtmxHttpRequest, ticket_id: str) -> HttpResponse:
    """Approve, deny (with a reason) or give typed input; report refusals with their cause."""
    ticket = _ticket(ticket_id)
    next_url = request.POST.get("next") or None
    if next_url and not url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        next_url = None
    raw = request.POST.get("decision", "")
    card = build_card(ticket, data=request.POST if raw == Decision.INPUT else None)
    key = request.POST.get("key", "")
    if KEY_PATTERN.match(key):
        card.key = key
    if ticket.state != "open":
        card.notice = closed_notice(ticket)
        return _respond(request, card, 409, next_url)
    if raw not in card.decisions:
        card.error = f"This {ticket.kind} ticket is answered with: {', '.join(card.decisions)}."
        return _respond(request, card, 400, next_url)
    decision = Decision(raw)
    answer: Any = None
    reason = ""
    if decision is Decision.INPUT:
        assert card.answer_form is not None
        if not card.answer_form.is_valid():
            card.error = "Check the highlighted fields."
            return _respond(request, card, 422, next_url)
        answer = card.answer_form.answer()
    if decision is Decision.DENY:
        card.deny_form = DenyForm(request.POST)
        if not card.deny_form.is_valid():
            card.error = "The reason is too long."
            return _respond(request, card, 422, next_url)
        reason = card.deny_form.cleaned_data["reason"]
    command = ResumeCommand(
        ticket_id=ticket.id,
        kind=TicketKind(ticket.kind),
        decision=decision,
        input=answer,
        reason=reason,
        call_id=ticket.call_id,
    )
    try:
        operations.resume(
            ticket.run_id,
            command,
            actor=actor(request),
            idempotency_key=f"console:{actor(request)}:{card.key}" if key else None,
        )
    except CLOSED_FAULTS:
        card.notice = closed_notice(ticket)
        card.answer_form = None
        return _respond(request, card, 409, next_url)
    except InvalidInput as exc:
        card.error = exc.message
        return _respond(request, card, exc.status, next_url)
    except RuntimeFault as exc:
        card.error = exc.message
        return _respond(request, card, exc.status, next_url)
    ticket.refresh_from_db()
    card.done = True
    card.answer_form = None
    verb = {"approve": "Approved", "deny": "Denied", "input": "Answered"}[decision.value]
    when = ticket.closed_at.strftime("%H:%M:%S UTC") if ticket.closed_at else ""
    card.notice = f"{verb} by {ticket.closed_by or actor(request)} at {when}."
    return _respond(request, card, 200, next_url)
