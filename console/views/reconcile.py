"""Reconciliation: every Indeterminate call whose effect may have started, and the form that
records what the downstream system says (``runtime.operations.reconcile``).

Nothing is reopened: the outcome is a committed, audited note on the thread, and a follow-up
run may start with it as its input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.contrib import messages
from django.db.models import Prefetch, Q
from django.http import Http404, HttpResponse
from django.shortcuts import redirect

from console.forms import ReconcileForm
from console.models import OPERATE, READ
from console.views.common import HtmxHttpRequest, actor, needs, parse_cursor, render_page
from runtime import operations
from runtime.coordinator import executing_attempts
from runtime.errors import ReconciliationContradicts, RunAlreadyActive, RuntimeFault
from runtime.inventory import unreconciled_calls
from runtime.models import LateEvidence, ReconciliationRecord, ToolCallRecord


def mark_corrections(records: list[ReconciliationRecord]) -> list[ReconciliationRecord]:
    """Set ``corrects`` on each record that contradicts an earlier one of the same call.

    ``records`` are ordered by seq. A record corrects the latest earlier record of its call
    when that one said "applied" or "not_applied" and this one says something else; "unknown"
    contradicts nothing (it is what the operator did not know yet).
    """
    last: dict[str, ReconciliationRecord] = {}
    for r in records:
        before = last.get(r.call_id)
        r.corrects = (
            before
            if before is not None
            and before.outcome in ("applied", "not_applied")
            and r.outcome != before.outcome
            else None
        )
        last[r.call_id] = r
    return records


PAGE = 20  # cards per page: each card reads its call's attempts from the log


@dataclass
class CallCard:
    call: ToolCallRecord
    attempts: list[dict[str, Any]]
    form: ReconcileForm = field(default_factory=ReconcileForm)
    error: str = ""
    notice: str = ""
    follow_up_run_id: str | None = None

    @property
    def records(self) -> list[ReconciliationRecord]:
        return mark_corrections(list(self.call.reconciliations.all()))

    @property
    def evidence(self) -> list[LateEvidence]:
        return list(self.call.evidence.all())


def _calls():
    return (
        ToolCallRecord.objects.filter(phase="indeterminate", effect_may_have_started=True)
        .select_related("run")
        .prefetch_related(
            Prefetch("reconciliations", ReconciliationRecord.objects.order_by("seq")),
            Prefetch("evidence", LateEvidence.objects.order_by("created_at")),
        )
    )


def _card(call: ToolCallRecord, form: ReconcileForm | None = None) -> CallCard:
    return CallCard(
        call=call,
        attempts=executing_attempts(call.run_id, call.id),
        form=form or ReconcileForm(prefix=call.id),
    )


@needs(READ)
def reconciliation(request: HtmxHttpRequest) -> HttpResponse:
    """Indeterminate calls to check downstream: unreconciled first, newest first."""
    show = request.GET.get("show", "open")
    context: dict[str, Any] = {"show": show, **reconcile_counts()}
    if request.GET.get("part") == "counters":
        return render_page(request, "console/reconcile.html", context, partial="counters")
    calls = _calls().order_by("-updated_at", "-id")
    if show == "open":
        calls = calls.filter(id__in=unreconciled_calls().values("id"))
    after = parse_cursor(request.GET.get("after", ""))
    if after:
        calls = calls.filter(Q(updated_at__lt=after[0]) | Q(updated_at=after[0], id__lt=after[1]))
    page = list(calls[: PAGE + 1])
    if len(page) > PAGE:
        page = page[:PAGE]
        params = request.GET.copy()
        params["after"] = f"{page[-1].updated_at.isoformat()}~{page[-1].id}"
        context["next_query"] = params.urlencode()
    context["paged"] = after is not None
    context["cards"] = [_card(c) for c in page]
    return render_page(request, "console/reconcile.html", context, partial="calls")


def reconcile_counts() -> dict[str, int]:
    """Indeterminate calls whose effect may have started: unreconciled and reconciled."""
    calls = ToolCallRecord.objects.filter(phase="indeterminate", effect_may_have_started=True)
    total = calls.count()
    pending = unreconciled_calls().count()
    return {"pending_count": pending, "done_count": total - pending}


@needs(OPERATE, write=True)
def reconcile_call(request: HtmxHttpRequest, call_id: str) -> HttpResponse:
    """Record a downstream outcome; optionally start a follow-up run on the thread."""
    call = _calls().filter(id=call_id).first()
    if call is None:
        raise Http404(f"no Indeterminate call {call_id} whose effect may have started")
    form = ReconcileForm(request.POST, prefix=call.id)
    card = _card(call, form)
    status = 200
    if not form.is_valid():
        card.error = "Check the form."
        status = 400
    else:
        data = form.cleaned_data
        try:
            result = operations.reconcile(
                call.id,
                outcome=data["outcome"],
                evidence=data["evidence"],
                actor=actor(request),
                follow_up_agent=data["follow_up_agent"] or None,
                correction=bool(data.get("correction")),
            )
        except RunAlreadyActive:
            # The note and the follow-up land together or not at all (operations.reconcile).
            card.error = (
                "Not recorded: the thread has an active run, so no follow-up can start. "
                "Record the outcome without a follow-up, or wait for that run to end."
            )
            status = 409
        except ReconciliationContradicts as exc:
            card.error = (
                f"This contradicts commit #{exc.detail['earlier_seq']} "
                f'({exc.detail["earlier_outcome"].replace("_", " ")}). Tick "This corrects the '
                'earlier record" to record it as a correction.'
            )
            status = exc.status
        except RuntimeFault as exc:
            card.error = exc.message
            status = exc.status
        else:
            card.follow_up_run_id = result["follow_up_run_id"]
            card.notice = f"Outcome recorded as commit #{result['seq']}" + (
                ", follow-up run started." if card.follow_up_run_id else "."
            )
            card.form = ReconcileForm(prefix=call.id)
        card.call = _calls().get(id=call.id)
    if request.htmx:
        response = render_page(
            request, "console/reconcile.html", {"card": card}, partial="card", status=status
        )
        if status < 300:
            response["HX-Trigger"] = "rt:reconciled"  # the tab counters refresh
        return response
    if status < 300:
        messages.success(request, card.notice)
        return redirect("console:reconcile")
    context = {"cards": [card], "show": "one", "pending_count": None, "done_count": None}
    return render_page(request, "console/reconcile.html", context, status=status)
