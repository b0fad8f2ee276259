"""The inbox of open tickets and answering one (approve, deny with a reason, typed input).

An answer is a ResumeCommand sent through ``runtime.operations.resume``, which checks it
against the committed ticket and validates input with the ticket's JSON schema. When two
people answer one ticket, the second is told who answered it and when (from the Ticket row).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.db.models import Q
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme

from console.forms import DenyForm, InboxFilterForm, SchemaForm, schema_order
from console.models import READ, RESUME
from console.views.common import (
    HtmxHttpRequest,
    actor,
    choices,
    needs,
    parse_cursor,
    registered_tools,
    render_page,
)
from runtime import operations
from runtime.agents import registry
from runtime.domain.commit import check_operator_decision
from runtime.domain.model import OPERATOR_DECISIONS, Decision, ResumeCommand, TicketKind
from runtime.errors import (
    CommittedUnread,
    KindMismatch,
    NotAwaiting,
    RunEnded,
    RuntimeFault,
    TicketConsumed,
    TicketMismatch,
)
from runtime.keyset import RowCompare
from runtime.models import MessageRecord, ThreadCommit, Ticket

KEY_PATTERN = re.compile(r"^[0-9a-f]{32}$")
INBOX_PAGE = 25
PAST = {"approve": "approved", "deny": "denied", "input": "answered", "respond": "responded"}
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
    context: dict[str, str] = field(default_factory=dict)
    # The notice's parts, so that the page shows its time in the reader's zone like every
    # other time on the card: "<lead> at <time>.<tail>" (issue 22, 8: no CET beside UTC).
    notice_lead: str = ""
    notice_at: datetime | None = None
    notice_tail: str = ""
    denied: bool = False  # answered (now or before) with a deny: never shown as a success

    def say(self, lead: str, at: datetime | None, tail: str = "") -> None:
        """Set the notice: ``lead`` at ``at`` (UTC in plain text, the reader's zone on the
        page), then ``tail``."""
        self.notice_lead, self.notice_at, self.notice_tail = lead, at, tail
        stamp = at.strftime("%Y-%m-%d %H:%M:%S UTC") if at else "?"
        self.notice = f"{lead} at {stamp}.{tail}"

    @property
    def decisions(self) -> list[str]:
        """The answers a person may give (none for a delegation ticket; "Fire now" only for
        a timer): the card offers a form for these only."""
        allowed = OPERATOR_DECISIONS[TicketKind(self.ticket.kind)]
        return [d.value for d in Decision if d in allowed]

    @property
    def question(self) -> Any:
        request = self.ticket.request or {}
        return request.get("question") if isinstance(request, dict) else None


def build_card(ticket: Ticket, data: Any = None) -> TicketCard:
    card = TicketCard(ticket=ticket)
    if ticket.kind == "input" and ticket.state == "open":
        # jsonb (PostgreSQL) keeps no key order; the call's raw argument text does.
        order = schema_order(ticket.schema, ticket.call.arguments_text)
        card.answer_form = SchemaForm(ticket.schema or {}, data=data, order=order)
    return card


def attach_notes(tickets: list[Ticket]) -> list[Ticket]:
    """Set ``note`` on each closed ticket: the reason its answer carried (CallResumed).

    One query for all tickets: the commits that closed them, by (thread, seq).
    """
    closed = [t for t in tickets if t.closed_seq is not None]
    for t in tickets:
        t.note, t.edited_arguments = "", None
    if not closed:
        return tickets
    where = Q()
    for t in closed:
        where |= Q(thread_id=t.run.thread_id, seq=t.closed_seq)
    resumed: dict[str, dict[str, Any]] = {}
    for events in ThreadCommit.objects.filter(where).values_list("events", flat=True):
        for e in events:
            if e.get("type") == "CallResumed":
                resumed[e.get("ticket_id", "")] = e
    for t in closed:
        event = resumed.get(t.id, {})
        t.note, t.edited_arguments = event.get("reason") or "", event.get("arguments")
    return tickets


def closed_notice(ticket: Ticket, card: TicketCard | None = None) -> str:
    """Say who closed the ticket and when, or why it cannot be answered; with ``card``, set
    its notice (and its parts) too."""
    ticket.refresh_from_db()
    card = card or TicketCard(ticket=ticket)
    who = ticket.closed_by or "an unnamed actor"
    if ticket.state == "consumed":
        note = attach_notes([ticket])[0].note
        past = PAST.get(ticket.decision, ticket.decision)
        card.denied = ticket.decision == Decision.DENY.value
        card.say(
            f"Already answered: {past} by {who}", ticket.closed_at, f" Note: {note}" if note else ""
        )
    elif ticket.state == "void":
        card.say(
            f"Closed without an answer: the run ended ({ticket.run.end_cause}), by {who}",
            ticket.closed_at,
        )
    else:
        card.notice = "This ticket is not the run's open ticket."
    return card.notice


def _cursor(ticket: Ticket) -> str:
    return f"{ticket.created_at.isoformat()}~{ticket.id}"


def _open_tickets(data: dict[str, Any]):
    """Open tickets matching the inbox filters (kind, tool, agent, minimum age)."""
    # A child run's end answers a delegation ticket; the child's own tickets are listed.
    rows = Ticket.objects.filter(state="open").exclude(kind="delegation")
    if data.get("kind"):
        rows = rows.filter(kind=data["kind"])
    if data.get("tool"):
        rows = rows.filter(call__name=data["tool"])
    if data.get("agent"):
        rows = rows.filter(run__agent=data["agent"])
    if data.get("older_than"):
        rows = rows.filter(created_at__lte=timezone.now() - timedelta(minutes=data["older_than"]))
    return rows


def _context_lines(run_ids: list[str]) -> dict[str, dict[str, str]]:
    """Per run: the user's input (first line and whole) and the last assistant text."""
    found: dict[str, dict[str, str]] = {r: {"input": "", "said": ""} for r in run_ids}
    users = MessageRecord.objects.filter(run_id__in=run_ids, role="user").order_by("-seq", "-idx")
    for run_id, content in users.values_list("run_id", "content"):
        found[run_id]["input"] = content  # ordered newest first: the first user message wins
    said = (
        MessageRecord.objects.filter(run_id__in=run_ids, role="assistant")
        .exclude(content="")
        .order_by("seq", "idx")
    )
    for run_id, content in said.values_list("run_id", "content"):
        found[run_id]["said"] = content  # ordered oldest first: the last one wins
    return found


def _cards(tickets: list[Ticket]) -> list[TicketCard]:
    lines = _context_lines(sorted({t.run_id for t in tickets}))
    cards = [build_card(t) for t in tickets]
    for card in cards:
        card.context = lines.get(card.ticket.run_id, {})
    return cards


def _recent() -> list[Ticket]:
    rows = Ticket.objects.exclude(state="open").select_related("call", "run")
    return attach_notes(list(rows.defer("run__snapshot").order_by("-closed_at")[:15]))


@needs(READ)
def inbox(request: HtmxHttpRequest) -> HttpResponse:
    """Open tickets, oldest first, filtered and keyset-paged, answerable in place.

    The card list changes only when the operator asks (Refresh, a filter, a page): live
    commits refresh the counter bar and "recently closed", never the cards, so nothing moves
    under the pointer (issue 11, defect 1). ``part`` picks a fragment: ``bar`` or ``recent``.
    """
    form = InboxFilterForm(request.GET)
    form.is_valid()
    data = form.cleaned_data
    rows = _open_tickets(data)
    part = request.GET.get("part")
    params = request.GET.copy()
    for name in ("part", "after"):
        params.pop(name, None)
    context: dict[str, Any] = {"form": form, "filter_query": params.urlencode()}
    context["open_total"] = rows.count()
    if part == "bar":
        return render_page(request, "console/inbox.html", context, partial="bar")
    if part == "recent":
        context["recent"] = _recent()
        return render_page(request, "console/inbox.html", context, partial="recent")
    after = parse_cursor(data.get("after") or "")
    if after:
        rows = rows.filter(RowCompare(("created_at", "id"), ">", after))
    page = list(
        rows.select_related("call", "run")
        .defer("run__snapshot")
        .order_by("created_at", "id")[: INBOX_PAGE + 1]
    )
    more = len(page) > INBOX_PAGE
    page = page[:INBOX_PAGE]
    if more:
        params["after"] = _cursor(page[-1])
    context.update(
        cards=_cards(page),
        recent=_recent(),
        paged=after is not None,
        next_query=params.urlencode() if more else None,
        tools=choices(registered_tools(), (t.call.name for t in page), [data.get("tool")]),
        agents=sorted(registry()),
    )
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
        closed_notice(ticket, card)
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
        if next_url:
            return redirect(next_url)
        return redirect("console:ticket", ticket_id=card.ticket.id)
    return render_page(request, "console/ticket.html", {"card": card}, status=status)


def _safe_next(request: HtmxHttpRequest) -> str | None:
    next_url = request.POST.get("next") or None
    if next_url and not url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return None
    return next_url


@needs(RESUME, write=True)
def answer_ticket(request: HtmxHttpRequest, ticket_id: str) -> HttpResponse:
    """Approve, deny (with a reason) or give typed input; report refusals with their cause."""
    ticket = _ticket(ticket_id)
    card, status = answer(request, ticket, request.POST)
    return _respond(request, card, status, _safe_next(request))


def answer(request: HtmxHttpRequest, ticket: Ticket, post: Any) -> tuple[TicketCard, int]:
    """Answer one ticket from form data: ``decision``, ``key``, ``reason`` or ``note``, and
    the input fields. Returns the card to show and the HTTP status (200, 400, 409, 422)."""
    raw = post.get("decision", "")
    card = build_card(ticket, data=post if raw == Decision.INPUT else None)
    key = post.get("key", "")
    if KEY_PATTERN.match(key):
        card.key = key
    if ticket.state != "open":
        closed_notice(ticket, card)
        return card, 409
    try:
        check_operator_decision(TicketKind(ticket.kind), raw, ticket.request)
    except KindMismatch:
        card.error = f"This {ticket.kind} ticket is answered with: {', '.join(card.decisions)}."
        return card, 400
    except RuntimeFault as exc:  # TicketNotAnswerable: the runtime answers it; it says how
        card.error = exc.message
        return card, exc.status
    decision = Decision(raw)
    answer_value: Any = None
    edited: dict[str, Any] | None = None
    if decision is Decision.INPUT:
        assert card.answer_form is not None
        if not card.answer_form.is_valid():
            card.error = "Check the highlighted fields."
            return card, 422
        answer_value = card.answer_form.answer()
    try:
        if decision is Decision.RESPOND:
            answer_value = supplied_result(post.get("result", ""))
        if decision is Decision.APPROVE:
            edited = edited_arguments(post.get("arguments", ""), ticket.call.arguments)
    except ValueError as exc:
        card.error = str(exc)
        return card, 422
    # A deny's reason is shown to the model; an approval's or an answer's note is recorded
    # with the decision (both ride in CallResumed.reason).
    card.deny_form = DenyForm(
        {"reason": post.get("reason" if decision is Decision.DENY else "note", "")}
    )
    if not card.deny_form.is_valid():
        card.error = "The reason or note is too long."
        return card, 422
    reason = card.deny_form.cleaned_data["reason"]
    command = ResumeCommand(
        ticket_id=ticket.id,
        kind=TicketKind(ticket.kind),
        decision=decision,
        input=answer_value,
        reason=reason,
        call_id=ticket.call_id,
        arguments=edited,
    )
    try:
        operations.resume(
            ticket.run_id,
            command,
            actor=actor(request),
            idempotency_key=f"console:{actor(request)}:{card.key}" if key else None,
        )
    except CommittedUnread as done:  # it took effect; only the read after it failed
        card.done, card.answer_form = True, None
        card.notice = f"{PAST[decision.value].capitalize()} (commit #{done.seq})."
        return card, 200
    except CLOSED_FAULTS:
        closed_notice(ticket, card)
        card.answer_form = None
        return card, 409
    except RuntimeFault as exc:  # InvalidInput included: its message names the field
        card.error = exc.message
        return card, exc.status
    ticket.refresh_from_db()
    card.done = True
    card.answer_form = None
    who = ticket.closed_by or actor(request)
    how = " with edited arguments" if edited is not None else ""
    if decision is Decision.RESPOND:
        how = " for the tool with a supplied result (the tool does not run)"
    lead = f"{PAST[decision.value].capitalize()}{how} by {who}"
    if decision is Decision.DENY:
        lead = f"Denied by {who}: the tool does not run; the model is told"
        card.denied = True
    card.say(lead, ticket.closed_at, f" Note: {reason}" if reason else "")
    return card, 200


def supplied_result(text: str) -> Any:
    """The result an approver supplies instead of running the tool: JSON if it parses,
    else the text itself. Raises ValueError when it is empty."""
    if not text.strip():
        raise ValueError("Type the result the model should receive.")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def edited_arguments(text: str, original: Any) -> dict[str, Any] | None:
    """The operator's edit of the arguments as a JSON object, or None when the field is empty
    or unchanged. Raises ValueError when it is not a JSON object."""
    if not text.strip():
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"The edited arguments are not valid JSON: {exc.msg}.") from exc
    if not isinstance(value, dict):
        raise ValueError("The edited arguments must be a JSON object.")
    return None if value == original else value


BULK_MAX = 100


@needs(RESUME, write=True)
def bulk_answer(request: HtmxHttpRequest) -> HttpResponse:
    """Approve or deny the selected tickets after one confirmation naming count and tools.

    Without ``confirm`` nothing is written: the answer asks to confirm. With it, each ticket
    is answered on its own (one refusal does not stop the others) and every card is swapped
    in place (out of band) with its outcome.
    """
    decision = request.POST.get("decision", "")
    ids = request.POST.getlist("ticket")[:BULK_MAX]
    tickets = list(Ticket.objects.filter(id__in=ids).select_related("call", "run"))
    context: dict[str, Any] = {"decision": decision, "tickets": tickets}
    if decision not in ("approve", "deny") or not tickets:
        context["error"] = "Select tickets, then choose Approve or Deny."
        return render_page(request, "console/bulk.html", context, status=400)
    if request.POST.get("confirm") != "yes":
        counts: dict[str, int] = {}
        for t in tickets:
            counts[t.call.name] = counts.get(t.call.name, 0) + 1
        context["tools"] = sorted(counts.items())
        return render_page(request, "console/bulk.html", context)
    cards = []
    for t in tickets:
        post = {"decision": decision, "reason": request.POST.get("reason", "")}
        if t.kind != "approval" and decision == "approve":
            card = build_card(t)
            card.error = f"A {t.kind} ticket is not approved in bulk."
        else:
            card, _ = answer(request, t, post)
        cards.append(card)
    context.update(cards=cards, done=sum(c.done for c in cards))
    return render_page(request, "console/bulk.html", context)
