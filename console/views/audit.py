"""The audit page: every operator decision (approve, deny, input, cancel, reconcile, pause,
resume, move to another version, webhook changes), newest first, filterable by actor,
decision, agent, run and time, with the notes each carried. The runtime's own answers (timer
fires, child runs' ends, a parent's cancel of its children) are left out unless ``runtime``
asks for them.

Decisions come from the committed projections, never from a separate audit table: answered
tickets (``Ticket``, their notes from the closing commit), reconciliations
(``ReconciliationRecord``), cancellations (the ``ThreadCommit`` that ended a run
``cancelled``), pauses, resumes and moves (the ``ThreadCommit`` whose first event is a
``RunPaused``, a ``RunResumed`` or a ``RunMoved``, by the partial index
``commit_operator_recent``); webhook endpoint changes are
operational configuration, not thread truth, and come from ``WebhookChange``. Each source is
queried with the filters and cut to one page, then merged. A decision the form does not know is
refused (400, no entries), never read as "any decision".
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.db.models import F, QuerySet
from django.http import HttpResponse
from django.utils import timezone

from console.models import READ
from console.views.common import HtmxHttpRequest, needs, render_page
from console.views.tickets import attach_notes
from runtime.agents import registry
from runtime.models import (
    OPERATOR_EVENTS,
    ReconciliationRecord,
    ThreadCommit,
    Ticket,
    WebhookChange,
)

PAGE = 100
DECISIONS = (
    "approve",
    "deny",
    "input",
    "respond",
    "cancel",
    "reconcile",
    "pause",
    "resume",
    "move",
    "webhook",
)


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, max_length=200)
    decision = forms.ChoiceField(
        required=False, choices=[("", "any decision")] + [(d, d) for d in DECISIONS]
    )
    agent = forms.CharField(required=False, max_length=100)
    run = forms.CharField(required=False, max_length=32)
    within = forms.TypedChoiceField(
        required=False,
        label="Time",
        coerce=int,
        empty_value=None,
        choices=[
            ("", "any time"),
            ("60", "last hour"),
            ("1440", "last day"),
            ("10080", "last week"),
        ],
    )
    runtime = forms.BooleanField(
        required=False, label="Include the runtime's own answers (timers, child runs)"
    )
    before = forms.DateTimeField(required=False, widget=forms.HiddenInput)


# Actors of the answers the runtime gives itself: a due timer's fire, a child's end delivered
# to its parent, a parent's end cancelling its children. They are not operator decisions, so
# the page leaves them out unless asked (issue 22, 8: timer fires filled the page).
RUNTIME_ACTORS = ("timer",)
RUNTIME_ACTOR_PREFIXES = ("child:", "parent:")


def _people(rows: QuerySet[Any], field: str, data: dict[str, Any]) -> QuerySet[Any]:
    if data.get("runtime"):
        return rows
    rows = rows.exclude(**{f"{field}__in": RUNTIME_ACTORS})
    for prefix in RUNTIME_ACTOR_PREFIXES:
        rows = rows.exclude(**{f"{field}__startswith": prefix})
    return rows


@dataclass
class Entry:
    """One decision: when, who, what, on which run and call, with its note."""

    at: datetime
    actor: str
    decision: str
    run_id: str  # "" for a webhook change
    agent: str
    what: str
    note: str
    seq: int | None
    endpoint_id: str = ""  # a webhook change's endpoint (it may be deleted since)


def _narrowed(
    rows: QuerySet[Any], data: dict[str, Any], *, actor: str = "actor", run: str = "run"
) -> QuerySet[Any]:
    """``rows`` of the filter's actor, agent and run: ``actor`` names the rows' actor field,
    ``run`` the path to their run (``call__run`` for a reconciliation)."""
    if data.get("actor"):
        rows = rows.filter(**{actor: data["actor"]})
    if data.get("agent"):
        rows = rows.filter(**{f"{run}__agent": data["agent"]})
    if data.get("run"):
        rows = rows.filter(**{f"{run}_id": data["run"]})
    return rows


def _window(rows: QuerySet[Any], field: str, data: dict[str, Any]) -> QuerySet[Any]:
    if data.get("within"):
        rows = rows.filter(**{f"{field}__gte": timezone.now() - timedelta(minutes=data["within"])})
    if data.get("before"):
        rows = rows.filter(**{f"{field}__lt": data["before"]})
    return rows


def _answers(data: dict[str, Any]) -> list[Entry]:
    rows = Ticket.objects.filter(state="consumed").select_related("call", "run")
    if data.get("decision") in ("approve", "deny", "input", "respond"):
        rows = rows.filter(decision=data["decision"])
    elif data.get("decision"):
        return []
    rows = _people(_narrowed(rows, data, actor="closed_by"), "closed_by", data)
    page = attach_notes(
        list(_window(rows, "closed_at", data).defer("run__snapshot").order_by("-closed_at")[:PAGE])
    )
    entries = []
    for t in page:
        assert t.closed_at is not None  # a consumed ticket was closed
        entries.append(
            Entry(
                t.closed_at,
                t.closed_by,
                t.decision,
                t.run_id,
                t.run.agent,
                f"#{t.call.index} {t.call.name} ({t.kind} ticket)",
                t.note,
                t.closed_seq,
            )
        )
    return entries


def _reconciliations(data: dict[str, Any]) -> list[Entry]:
    if data.get("decision") not in ("", None, "reconcile"):
        return []
    rows = ReconciliationRecord.objects.select_related("call", "call__run")
    rows = _narrowed(rows, data, run="call__run")
    page = _window(rows, "created_at", data).defer("call__run__snapshot").order_by("-created_at")
    return [
        Entry(
            r.created_at,
            r.actor,
            "reconcile",
            r.call.run_id,
            r.call.run.agent,
            f"#{r.call.index} {r.call.name}: {r.outcome.replace('_', ' ')}",
            r.evidence,
            r.seq,
        )
        for r in page[:PAGE]
    ]


def _cancels(data: dict[str, Any]) -> list[Entry]:
    if data.get("decision") not in ("", None, "cancel"):
        return []
    # The commit that ended the run is its last one (seq == the run's version), so its time
    # is the run's committed_at: ordering and windowing on that reads the partial index
    # run_cancelled_recent instead of every commit.
    rows = ThreadCommit.objects.filter(run__end_cause="cancelled", seq=F("run__version"))
    rows = _people(_narrowed(rows, data), "actor", data)
    page = _window(rows, "run__committed_at", data).select_related("run").defer("run__snapshot")
    return [
        Entry(
            c.created_at,
            c.actor,
            "cancel",
            c.run_id,
            c.run.agent,
            "run cancelled",
            str(((c.disposition or {}).get("error") or {}).get("reason", "")),
            c.seq,
        )
        for c in page.order_by("-run__committed_at")[:PAGE]
    ]


# An operator's commit of its own, by its event: the decision and what it did.
OPERATOR_DECISIONS = {
    "RunPaused": ("pause", "run paused"),
    "RunResumed": ("resume", "run resumed"),
    "RunMoved": ("move", "run moved to another version"),
}


def _operator_commits(data: dict[str, Any]) -> list[Entry]:
    """Pauses, resumes and moves: the commits whose first event is one of OPERATOR_EVENTS."""
    decision = data.get("decision")
    types = [t for t, (d, _what) in OPERATOR_DECISIONS.items() if decision in ("", None, d)]
    if not types:
        return []
    rows = ThreadCommit.objects.filter(events__0__type__in=OPERATOR_EVENTS)
    if decision:
        rows = rows.filter(events__0__type__in=types)
    rows = _narrowed(rows, data)
    page = _window(rows, "created_at", data).select_related("run").defer("run__snapshot")
    entries = []
    for c in page.order_by("-created_at")[:PAGE]:
        event = c.events[0]
        kind, what = OPERATOR_DECISIONS[event["type"]]
        note = str(event.get("reason") or "")
        if kind == "pause":
            note = str(((event.get("ticket") or {}).get("request") or {}).get("reason") or "")
        if kind == "move":
            before = event["from_version"] or "(none)"
            what = f"run moved from version {before} to {event['to_version']}"
        run_agent = c.run.agent if c.run else ""
        entries.append(
            Entry(c.created_at, c.actor, kind, c.run_id or "", run_agent, what, note, c.seq)
        )
    return entries


WEBHOOK_ACTIONS = {
    "create": "endpoint created",
    "enable": "endpoint enabled",
    "disable": "endpoint disabled",
    "rotate": "secret rotated",
    "update": "endpoint changed",
    "delete": "endpoint deleted",
}


def _webhook_changes(data: dict[str, Any]) -> list[Entry]:
    if data.get("decision") not in ("", None, "webhook") or data.get("agent") or data.get("run"):
        return []
    rows = WebhookChange.objects.all()
    if data.get("actor"):
        rows = rows.filter(actor=data["actor"])
    entries = []
    for w in _window(rows, "created_at", data).order_by("-created_at")[:PAGE]:
        what = (
            f"webhook {w.endpoint_name or w.endpoint_id}: {WEBHOOK_ACTIONS.get(w.action, w.action)}"
        )
        if w.action == "delete":
            pending = (w.detail or {}).get("pending", 0)
            what += f" with {pending} pending deliver{'y' if pending == 1 else 'ies'}"
        entries.append(
            Entry(w.created_at, w.actor, "webhook", "", "", what, w.url, None, w.endpoint_id)
        )
    return entries


@needs(READ)
def audit(request: HtmxHttpRequest) -> HttpResponse:
    """Every decision, newest first, a page of 100; ``before`` pages to older ones. Filters
    the form refuses (an unknown ``decision``, a malformed ``before``) answer 400 with the
    form's errors and no entries."""
    form = AuditFilterForm(request.GET)
    if not form.is_valid():  # e.g. ?decision=<unknown>: refused, never read as "any"
        context = {"form": form, "entries": [], "agents": sorted(registry()), "filtered": True}
        return render_page(request, "console/audit.html", context, status=400)
    data = form.cleaned_data
    entries = sorted(
        _answers(data)
        + _reconciliations(data)
        + _cancels(data)
        + _operator_commits(data)
        + _webhook_changes(data),
        key=lambda e: e.at,
        reverse=True,
    )[:PAGE]
    params = request.GET.copy()
    params.pop("before", None)
    older = None
    if len(entries) == PAGE:
        older = params.copy()
        older["before"] = entries[-1].at.isoformat()
    context = {
        "form": form,
        "entries": entries,
        "agents": sorted(registry()),
        "older_query": older.urlencode() if older else None,
        "filtered": any(v for k, v in data.items() if k != "before"),
    }
    return render_page(request, "console/audit.html", context)
