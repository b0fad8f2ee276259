"""Reconciliation: every Indeterminate call whose effect may have started, and the form that
records what the downstream system says (``runtime.operations.reconcile``).

Calls of tools without external effects never come here (their seal says "no external
effect; nothing to check"). The queue filters by tool, agent, run, age and seal reason, and
records "not applied" for many calls at once after a confirmation naming count and tools.

Nothing is reopened: the outcome is a committed, audited note on the thread, and a follow-up
run may start with it as its input.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.db.models import Prefetch, QuerySet
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.utils import timezone

from console.forms import ReconcileFilterForm, ReconcileForm
from console.models import OPERATE, READ
from console.views.common import (
    HtmxHttpRequest,
    actor,
    capped,
    choices,
    needs,
    parse_cursor,
    registered_tools,
    render_page,
)
from runtime import operations
from runtime.agents import registry
from runtime.coordinator import executing_attempts
from runtime.errors import ReconciliationContradicts, RunAlreadyActive, RuntimeFault
from runtime.inventory import SEAL_REASONS, seal_reason, unreconciled_calls, with_seal_reason
from runtime.keyset import RowCompare
from runtime.models import LateEvidence, ReconciliationRecord, ToolCallRecord
from runtime.untrusted import is_id


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
    def reason(self) -> str:
        """Why the call was sealed, in a few words (SEAL_REASONS), or ""."""
        key = seal_reason(self.call.result)
        return SEAL_REASONS[key][0] if key else ""

    @property
    def records(self) -> list[ReconciliationRecord]:
        return mark_corrections(list(self.call.reconciliations.all()))

    @property
    def evidence(self) -> list[LateEvidence]:
        return list(self.call.evidence.all())


def _started() -> QuerySet[ToolCallRecord]:
    """Indeterminate calls whose effect may have started; a fork's copies aside (their
    originals are checked, runtime.fork)."""
    return ToolCallRecord.objects.filter(
        phase="indeterminate", effect_may_have_started=True
    ).exclude(source__has_key="copied_from")


def _calls():
    return (
        _started()
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


def _queue(data: dict[str, Any]) -> QuerySet[ToolCallRecord]:
    """The queue's calls under the filters ``data`` (ReconcileFilterForm's cleaned data):
    unreconciled ones unless ``show`` is "all"; by tool, agent, run (id prefix), age (minutes
    since sealed) and seal reason (runtime.inventory.SEAL_REASONS)."""
    calls = _calls()
    if data.get("show") != "all":
        calls = calls.filter(id__in=unreconciled_calls().values("id"))
    if data.get("tool"):
        calls = calls.filter(name=data["tool"])
    if data.get("agent"):
        calls = calls.filter(run__agent=data["agent"])
    if data.get("run"):
        calls = calls.filter(run__id__startswith=data["run"])
    if data.get("older_than"):
        calls = calls.filter(updated_at__lt=timezone.now() - timedelta(minutes=data["older_than"]))
    if data.get("reason"):
        calls = with_seal_reason(calls, data["reason"])
    return calls


def _filters(form: ReconcileFilterForm) -> dict[str, Any]:
    """The active filters, as query parameters (the page's own ``after`` aside)."""
    data = form.cleaned_data if form.is_valid() else {}
    return {k: v for k, v in data.items() if k != "after" and v not in (None, "")}


@needs(READ)
def reconciliation(request: HtmxHttpRequest) -> HttpResponse:
    """Indeterminate calls to check downstream, newest first, under the queue's filters
    (tool, agent, run, age, seal reason); operators select calls for a bulk "not applied"."""
    form = ReconcileFilterForm(request.GET)
    filters = _filters(form)
    show = filters.get("show", "open")
    context: dict[str, Any] = {"show": show, **reconcile_counts()}
    if request.GET.get("part") == "counters":
        return render_page(request, "console/reconcile.html", context, partial="counters")
    data = form.cleaned_data if form.is_valid() else {}
    calls = _queue(filters).order_by("-updated_at", "-id")
    matching = capped(calls)
    after = parse_cursor(data.get("after") or "")
    if after:
        calls = calls.filter(RowCompare(("updated_at", "id"), "<", after))
    page = list(calls[: PAGE + 1])
    if len(page) > PAGE:
        page = page[:PAGE]
        params = request.GET.copy()
        params["after"] = f"{page[-1].updated_at.isoformat()}~{page[-1].id}"
        context["next_query"] = params.urlencode()
    context.update(
        form=form,
        filters=filters,
        filter_query=urlencode(filters),
        filtered=any(k != "show" for k in filters),
        matching=matching,
        tools=choices(registered_tools(), (c.name for c in page), [filters.get("tool")]),
        agents=choices(registry(), (c.run.agent for c in page), [filters.get("agent")]),
        paged=after is not None,
        cards=[_card(c) for c in page],
    )
    return render_page(request, "console/reconcile.html", context, partial="calls")


def reconcile_counts() -> dict[str, int | str]:
    """Indeterminate calls whose effect may have started: unreconciled and recorded, each
    ``capped`` ("1,000+"): both pile up with the history."""
    pending = unreconciled_calls()
    done = _started().exclude(id__in=pending.values("id"))
    return {"pending_count": capped(pending), "done_count": capped(done)}


BULK_MAX = 500  # calls recorded by one confirmation


@needs(OPERATE, write=True)
def bulk_not_applied(request: HtmxHttpRequest) -> HttpResponse:
    """Record "not applied" for the selected calls, or for every call matching the filters
    (``scope=matching``), after one confirmation naming the count and the tools.

    The first POST writes nothing and asks; the confirming one carries the count it was shown
    (``expected``) and is refused if the selection changed meanwhile. Each call is recorded
    on its own (operations.reconcile): one refusal (a contradiction of an earlier "applied")
    does not stop the others, and the answer says which were refused and why.
    """
    form = ReconcileFilterForm(request.POST)
    filters = _filters(form)
    if request.POST.get("scope") == "matching":
        calls = _queue(filters)
        chosen = "matching"
    else:
        ids = [i for i in request.POST.getlist("call")[:BULK_MAX] if is_id(i)]
        calls = _queue({"show": "all"}).filter(id__in=ids)
        chosen = "selected"
    calls = calls.order_by("-updated_at", "-id")
    rows = list(calls.values_list("id", "name")[:BULK_MAX])
    tools: dict[str, int] = {}
    for _, name in rows:
        tools[name] = tools.get(name, 0) + 1
    context: dict[str, Any] = {
        "count": len(rows),
        "total": calls.count(),
        "tools": sorted(tools.items()),
        "ids": [i for i, _ in rows],
        "scope": chosen,
        "filters": filters,
        "cap": BULK_MAX,
        "evidence": request.POST.get("evidence", "")[:5000],
    }
    if not rows:
        context["error"] = "Select calls first (or filter the queue and choose every match)."
        return render_page(request, "console/reconcile_bulk.html", context, status=400)
    expected = request.POST.get("expected", "")
    if request.POST.get("confirm") != "yes" or expected != str(len(rows)):
        context["changed"] = request.POST.get("confirm") == "yes"
        return render_page(request, "console/reconcile_bulk.html", context)
    recorded, refused = 0, []
    for call_id, name in rows:
        try:
            operations.reconcile(
                call_id, outcome="not_applied", evidence=context["evidence"], actor=actor(request)
            )
            recorded += 1
        except RuntimeFault as exc:
            refused.append({"id": call_id, "name": name, "why": exc.message})
    context.update(done=True, recorded=recorded, refused=refused)
    response = render_page(request, "console/reconcile_bulk.html", context)
    response["HX-Trigger"] = "rt:reconciled, rt:bulk-reconciled"  # counters and the list
    return response


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
