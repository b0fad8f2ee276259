"""The runs list, the run page, starting, pausing, resuming and cancelling runs.

Everything shown is committed state (projections and the commit log); the live panel beside
the run page is fed by ``console.consumers`` and is marked unconfirmed.
"""

from __future__ import annotations

import json
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.core.exceptions import BadRequest
from django.db.models import Q
from django.http import Http404, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from console.forms import SCRIPT_EXAMPLES, CancelForm, PauseForm, RunFilterForm, StartRunForm
from console.models import OPERATE, READ
from console.views.common import (
    HtmxHttpRequest,
    actor,
    capped,
    form_problem,
    needs,
    parse_cursor,
    render_page,
    whole_number,
)
from console.views.reconcile import mark_corrections
from console.views.tickets import _context_lines, attach_notes, build_card
from runtime import inventory, limits, operations, search, stuck
from runtime.agents import registry
from runtime.documents import RUN_SUMMARY_FIELDS, consistent, input_lines, run_document
from runtime.domain.commit import PAUSE_REASON_MAX
from runtime.errors import CommittedUnread, NotFound, RuntimeFault
from runtime.inventory import unreconciled_calls
from runtime.keyset import RowCompare
from runtime.models import (
    MessageRecord,
    ReconciliationRecord,
    Run,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
)

PAGE_SIZE = 50
OVER_CAP = "over cap"  # _matched's answer when more than COUNT_CAP runs match the text
type Matched = list[str] | str | None
# Who holds a Running run, and whether it is paused (runtime.stuck).
LEASE_FIELDS = ("lease_owner", "lease_expires_at", "paused")
# The columns a row of the runs page reads: the summary, the holder, a child's parent.
ROW_FIELDS = (*RUN_SUMMARY_FIELDS, *LEASE_FIELDS, "parent_run_id")
STATES = ("running", "awaiting", "ended")
CAUSES = ("natural", "step_limit", "cancelled", "stopped", "failed", "indeterminate")


def _cursor(run: Run) -> str:
    return f"{run.created_at.isoformat()}~{run.id}"


def _counts(data: dict[str, Any] | None = None, ids: Matched = None) -> dict[str, Any]:
    """The chips' counts: runs per state and per end cause, paused and needing
    reconciliation. Unfiltered or filtered by agent only: exact, from the counts the
    database keeps (``_kept_counts``). Under other filters: each a capped count
    (``capped``) answered from an index on the chip's columns (run_state_cause,
    run_agent_state_cause, run_paused_recent), never a count of every run.

    ``data`` (the list's filters) narrows every count but by state and end cause, which the
    chips themselves choose: the chips count what clicking them would list (issue 22, 8).
    ``ids`` is the text search's matched set, computed once by the caller and counted in one
    pass (``_counted``); ``OVER_CAP`` when more runs than runtime.search.SEARCH_CAP match:
    then only the total is known ("10,000+") and the other chips are None (shown as "–"),
    so that the text is not matched again for each chip."""
    data = {k: v for k, v in (data or {}).items() if k not in ("state", "cause", "after", "top")}
    if ids == OVER_CAP:
        return {
            "total": f"{search.SEARCH_CAP:,}+",
            "states": [(s, None) for s in STATES],
            "causes": [(c, None) for c in CAUSES],
            "unreconciled": None,
            "paused": None,
        }
    if isinstance(ids, list):
        return _counted(_filtered(data, ids))
    if not any(v for k, v in data.items() if k != "agent"):
        return _kept_counts(data.get("agent") or None)
    base = _filtered(data)
    return {
        "total": capped(base),
        "states": [(s, capped(base.filter(state=s))) for s in STATES],
        # A cause is an ended run's: the state in the filter lets the (state, end_cause)
        # and (agent, state, end_cause) indexes answer.
        "causes": [(c, capped(base.filter(state="ended", end_cause=c))) for c in CAUSES],
        "unreconciled": capped(base.filter(id__in=unreconciled_calls().values("run_id"))),
        "paused": capped(base.filter(paused=True)),
    }


def _kept_counts(agent: str | None) -> dict[str, Any]:
    """The chips' exact counts of every run, or of ``agent``'s, per state and end cause from
    the counts the database keeps (runtime.inventory.runs_by_state); paused and needing
    reconciliation capped (``capped``): runs left paused or unreconciled pile up with the
    history (200,000 at a million runs of bench/history.py)."""
    states: dict[str, int] = {}
    causes: dict[str, int] = {}
    for (state, cause), n in inventory.runs_by_state(agent).items():
        states[state] = states.get(state, 0) + n
        if state == "ended":
            causes[cause] = causes.get(cause, 0) + n
    paused = Run.objects.filter(paused=True)
    flagged = unreconciled_calls()
    if agent is not None:
        paused = paused.filter(agent=agent)
        flagged = flagged.filter(run__agent=agent)
    return {
        "total": sum(states.values()),
        "states": [(s, states.get(s, 0)) for s in STATES],
        "causes": [(c, causes.get(c, 0)) for c in CAUSES],
        "unreconciled": capped(Run.objects.filter(id__in=flagged.values("run_id"))),
        "paused": capped(paused),
    }


def _counted(rows) -> dict[str, Any]:
    """The chips' exact counts over ``rows``, runs among a text search's matched ids (at most
    runtime.search.SEARCH_CAP): their states read in one query and counted here, and one
    query for the flagged ones, instead of a count per chip."""
    found = list(rows.order_by().values_list("id", "state", "end_cause", "paused"))
    states: dict[str, int] = {}
    causes: dict[str, int] = {}
    for _, state, cause, _ in found:
        states[state] = states.get(state, 0) + 1
        if state == "ended":
            causes[cause] = causes.get(cause, 0) + 1
    flagged = unreconciled_calls().filter(run_id__in=[run_id for run_id, *_ in found])
    return {
        "total": len(found),
        "states": [(s, states.get(s, 0)) for s in STATES],
        "causes": [(c, causes.get(c, 0)) for c in CAUSES],
        "unreconciled": flagged.values("run_id").distinct().count(),
        "paused": sum(1 for *_, paused in found if paused),
    }


def _row_context(page: list[Run]) -> None:
    """Set ``input_line``, ``waits_for``, ``needs_reconciliation`` and ``holder`` (who holds a
    Running run: runtime.stuck.Holder) on each run: five queries for the whole page, none
    per row."""
    ids = [r.id for r in page]
    inputs = input_lines(ids)
    waits = {
        run_id: f"{kind}: #{index} {name}"
        for run_id, kind, index, name in Ticket.objects.filter(
            run_id__in=[r.id for r in page if r.state == "awaiting"], state="open"
        ).values_list("run_id", "kind", "call__index", "call__name")
    }
    flagged = set(unreconciled_calls().filter(run_id__in=ids).values_list("run_id", flat=True))
    held = stuck.holders(page)
    for r in page:
        r.input_line = inputs.get(r.id, "")
        r.waits_for = waits.get(r.id, "")
        r.needs_reconciliation = r.id in flagged
        r.holder = held.get(r.id)


def _matched(data: dict[str, Any]) -> Matched:
    """The text search's matched run ids (runtime.search.matched_ids, capped at SEARCH_CAP),
    computed once per request; ``OVER_CAP`` when more match, None when there is no text."""
    text = (data.get("q") or "").strip()
    if not text:
        return None
    ids = search.matched_ids(text, search.SEARCH_CAP)
    return OVER_CAP if ids is None else ids


def _filtered(data: dict[str, Any], ids: Matched = None):
    """Runs matching the list's filters: state, cause, agent, the reconciliation flag and
    the search fields (runtime.search: free text or an id prefix in ``q``, a time range, a
    called tool, a metadata key and value, a parent run). ``ids``: ``_matched(data)``, so
    that the text is not matched again (``OVER_CAP``: matched by the query itself)."""
    rows = Run.objects.all()
    if data.get("state"):
        rows = rows.filter(state=data["state"])
    if data.get("cause"):
        rows = rows.filter(end_cause=data["cause"])
    if data.get("agent"):
        rows = rows.filter(agent=data["agent"])
    if data.get("unreconciled"):
        rows = rows.filter(id__in=unreconciled_calls().values("run_id"))
    if data.get("paused"):
        rows = rows.filter(paused=True)
    key = data.get("meta_key") or ""
    return search.narrow(
        rows,
        search.RunSearch(
            text=data.get("q") or "",
            since=data.get("since"),
            until=data.get("until"),
            tool=data.get("tool") or "",
            meta_key=key,
            meta_value=(data.get("meta_value") or "") if key else "",
            parent=data.get("parent") or "",
        ),
        ids=ids if isinstance(ids, list) else None,
    )


def _older_or_same(rows, cursor: tuple[datetime, str], *, inclusive: bool):
    # One row comparison: an index condition on run_recent (console.api.pagination).
    return rows.filter(RowCompare(("created_at", "id"), "<=" if inclusive else "<", cursor))


@needs(READ)
def runs(request: HtmxHttpRequest) -> HttpResponse:
    """The runs list: counts, filters, search, keyset pages (newest first).

    ``top`` pins the first page to the runs it showed when loaded: a live refresh updates
    those rows in place and only counts newer runs ("3 new runs: show them"), so rows never
    move under the pointer while runs are created (issue 11, defect 9).
    """
    form = RunFilterForm(request.GET)
    form.is_valid()
    data = form.cleaned_data
    matched = _matched(data)
    rows = _filtered(data, matched)
    cursor = parse_cursor(data.get("after") or "")
    top = parse_cursor(data.get("top") or "")
    newer: int | str = 0
    if cursor:
        rows = _older_or_same(rows, cursor, inclusive=False)
    elif top:
        # The runs after the pinned top, by the run_recent index: a few, not the history.
        stamp, run_id = top
        newer = capped(rows.filter(Q(created_at__gt=stamp) | Q(created_at=stamp, id__gt=run_id)))
        rows = _older_or_same(rows, top, inclusive=True)
    page = list(rows.order_by("-created_at", "-id").only(*ROW_FIELDS)[: PAGE_SIZE + 1])
    more = len(page) > PAGE_SIZE
    page = page[:PAGE_SIZE]
    _row_context(page)
    params = request.GET.copy()
    params.pop("after", None)
    params.pop("top", None)
    next_params = params.copy()
    if more:
        next_params["after"] = _cursor(page[-1])
    self_params = request.GET.copy()
    if not cursor and page and not top:
        self_params["top"] = _cursor(page[0])
    filters = {
        k: v.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S") if isinstance(v, datetime) else v
        for k, v in data.items()
        if k not in ("after", "top") and v
    }
    chips = {k: v for k, v in filters.items() if k not in ("state", "cause")}
    context = {
        "chip_query": urlencode({k: "on" if v is True else v for k, v in chips.items()}),
        "form": form,
        "runs": page,
        "counts": _counts(data, matched),
        "agents": sorted(registry()),
        "tools": sorted({t.name for a in registry().values() for t in a.tools}),
        "filters": filters,
        "filtered": bool(filters),
        "paged": cursor is not None,
        "newer": newer,
        "first_query": params.urlencode(),
        "next_query": next_params.urlencode() if more else None,
        "self_query": self_params.urlencode(),
    }
    return render_page(request, "console/runs.html", context, partial="listing")


def _event_run_id(event: dict[str, Any]) -> str | None:
    return event.get("run_id")


LOG_SHOWN = 200  # commits listed on a run page; older ones are paged (or read from the API)
MESSAGES_SHOWN = 6  # the latest messages shown open; earlier ones fold away


def _operator_act(event: dict[str, Any]) -> bool:
    """An answer that changed what the call does: edited arguments, or a supplied result."""
    if event.get("type") != "CallResumed":
        return False
    return event.get("decision") == "respond" or (
        event.get("decision") == "approve" and event.get("arguments") is not None
    )


def _log_page(
    log: list[ThreadCommit], kind: str, before: int | None
) -> tuple[list[ThreadCommit], int | None]:
    """The commits to list: of one event kind if asked, the LOG_SHOWN latest before ``before``
    (a seq); returns them and the seq to page further back from (None: nothing older)."""
    if kind:
        log = [c for c in log if any(e.get("type") == kind for e in c.events)]
    if before is not None:
        log = [c for c in log if c.seq < before]
    shown = log[-LOG_SHOWN:]
    return shown, (shown[0].seq if len(log) > len(shown) else None)


@consistent
def run_context(
    run_id: str, *, log_kind: str = "", log_before: int | None = None
) -> dict[str, Any]:
    """Everything the run page shows, from committed state only; ``log_kind`` and
    ``log_before`` pick the commit log's page (an event type, a seq to list back from)."""
    try:
        doc = run_document(run_id)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    commits = list(
        ThreadCommit.objects.filter(
            Q(run_id=run_id) | Q(thread_id=doc["thread_id"], run__isnull=True)
        ).order_by("seq")
    )
    log = [
        c
        for c in commits
        if c.run_id == run_id or any(_event_run_id(e) == run_id for e in c.events)
    ]
    attempts: dict[str, list[dict[str, Any]]] = {}
    acts: dict[str, dict[str, Any]] = {}  # operator acts on a call: edited args, a result
    for c in log:
        for e in c.events:
            if _operator_act(e):
                acts[e["call_id"]] = {**e, "actor": c.actor, "seq": c.seq}
            if e.get("type") == "CallExecuting":
                attempts.setdefault(e["call_id"], []).append(
                    {
                        "attempt": e["attempt"],
                        "worker": e.get("worker", ""),
                        "seq": c.seq,
                        "at": c.created_at,
                    }
                )
    own = [c for c in log if c.run_id == run_id]
    steps = stuck.timeline(own, run_id)
    spans = {span.call_id: span for step in steps for span in step.calls}
    for batch in doc["batches"]:
        for call in batch["calls"]:
            call["attempts"] = attempts.get(call["call_id"], [])
            call["operator_act"] = acts.get(call["call_id"])
            span = spans.get(call["call_id"])
            # Run-wide number (call 57 of a long run, not "step 3, #8") and how it ended: a
            # denial is Completed with an error, never shown as a success (issue 22, 6).
            call["number"] = span.number if span else None
            call["outcome"] = _call_outcome(call, span.outcome if span else "")
    latest = next((c for c in reversed(log) if c.run_id == run_id), None)
    tickets = list(
        Ticket.objects.filter(run_id=run_id)
        .select_related("call", "run")  # the open ticket's card shows its run's agent
        .defer("run__snapshot")  # the folded RunView grows with the run; not shown here
        .order_by("opened_seq")
    )
    waited = (doc["ticket"] or {}).get("id")  # children's tickets are open but not waited on
    open_ticket = next((t for t in tickets if t.id == waited), None)
    reconciliations = mark_corrections(
        list(
            ReconciliationRecord.objects.filter(call__run_id=run_id)
            .select_related("call")
            .order_by("seq")
        )
    )
    calls = {c["call_id"]: f"#{c['index']} {c['name']}" for b in doc["batches"] for c in b["calls"]}
    row = Run.objects.only("id", "state", *LEASE_FIELDS).get(id=run_id)
    shown, older = _log_page(log, log_kind, log_before)  # the page stays fast however long
    messages = doc["messages"]
    return {
        "run": doc,
        "created_at": datetime.fromisoformat(doc["created_at"]),
        "latest_commit": latest,
        "log": shown,
        "log_total": len(log),
        "log_kinds": sorted({e.get("type", "?") for c in log for e in c.events}),
        "log_kind": log_kind,
        "log_paged": bool(log_kind) or log_before is not None,
        "log_older": older,
        "earlier_messages": messages[:-MESSAGES_SHOWN],
        "latest_messages": messages[-MESSAGES_SHOWN:],
        "tickets": attach_notes(tickets),
        "open_ticket": open_ticket,
        "calls": calls,
        "reconciliations": reconciliations,
        # Children change state without a commit of this run: the page polls while any lives.
        "live_children": any(child["state"] != "ended" for child in doc["children"]),
        "holder": stuck.holders([row]).get(run_id),
        "waiting": stuck.waiting(doc, own),
        "timeline": steps,
        # Steps a fork may start after: those whose answer (and batch) are committed whole.
        "finished_steps": fork_statements(
            doc, [s.step for s in steps if not s.calls or s.finalized_at is not None]
        ),
        "forks": _forks(run_id),
        "deployed_version": _deployed_version(doc["agent"]),
        "child_lines": _context_lines([c["id"] for c in doc["children"]])
        if doc["children"]
        else {},
    }


def _call_outcome(call: dict[str, Any], outcome: str) -> str:
    """What a call's badge says: its phase, but "denied" for a denied approval or input,
    "error" for a completed call whose result is an error (never the green "completed")."""
    if call["phase"] != "completed":
        return call["phase"]
    if outcome == "denied":
        return "denied"
    return "error" if call["is_error"] else "completed"


def _forks(run_id: str) -> list[Any]:
    """Runs forked from ``run_id`` (``Run.forked_from``: their activation's
    ``metadata.forked_from.run_id``, an index lookup)."""
    return list(
        Run.objects.filter(forked_from=run_id)
        .order_by("created_at", "id")
        .values(
            "id", "state", "end_cause", "metadata__forked_from__step", "metadata__forked_from__by"
        )
    )


def run_page_context(
    run_id: str, cancel_form: CancelForm | None = None, query: Any = None
) -> dict[str, Any]:
    query = query or {}
    before = str(query.get("log_before", ""))
    log_before = whole_number(before) if before else None
    if before and log_before is None:
        raise BadRequest("log_before is a commit's seq: a whole number")
    context = run_context(
        run_id, log_kind=str(query.get("log_kind", ""))[:40], log_before=log_before
    )
    if context["open_ticket"] is not None:
        context["card"] = build_card(context["open_ticket"])
    context["cancel_form"] = cancel_form or CancelForm()
    context["pause_reason_max"] = PAUSE_REASON_MAX
    return context


@needs(READ)
def run_detail(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """The run page: committed state, batch, ticket form, log; htmx asks for ``committed``,
    or ``part=holder`` for who holds the run (polled while it runs: a dead worker commits
    nothing that would refresh it)."""
    if request.GET.get("part") == "holder":
        row = Run.objects.filter(id=run_id).first()
        if row is None:
            raise Http404(f"run {run_id} does not exist")
        holder = stuck.holders([row]).get(run_id)
        waiting = limits.why_waiting(row) or None
        context = {"run": {"id": row.id, "state": row.state, "waiting": waiting}, "holder": holder}
        return render_page(request, "console/run.html", context, partial="holder")
    context = run_page_context(run_id, query=request.GET)
    return render_page(request, "console/run.html", context, partial="committed")


@needs(OPERATE, write=True)
def cancel_run(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Cancel a run (confirmed in the form); an ended run keeps its terminus."""
    form = CancelForm(request.POST)
    if not form.is_valid():
        context = run_page_context(run_id, form)
        context.update(cancel_open=True)
        return render_page(request, "console/run.html", context, status=400)
    try:
        before = Run.objects.filter(id=run_id).values_list("state", flat=True).first()
        doc = operations.cancel(run_id, actor=actor(request), reason=form.cleaned_data["reason"])
    except CommittedUnread as done:  # it took effect; only the read after it failed
        messages.success(request, f"Run cancelled (commit #{done.seq}).")
        return redirect("console:run", run_id=run_id)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    except RuntimeFault as exc:
        context = run_page_context(run_id, form)
        context.update(cancel_open=True, cancel_error=exc.message)
        return render_page(request, "console/run.html", context, status=exc.status)
    if before == "ended":
        messages.info(request, f"The run had already ended ({doc['end_cause']}); nothing changed.")
    else:
        messages.success(request, "Run cancelled. Open calls were sealed as Indeterminate.")
    return redirect("console:run", run_id=run_id)


@needs(OPERATE, write=True)
def pause_run(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Pause a run (``operations.pause``): it stops at its next boundary; a refusal (an ended
    run, a run already paused) is shown on the run page with its status and writes nothing."""
    return _pause_or_resume(
        request, run_id, operations.pause, "Run paused: it stops at its next boundary."
    )


@needs(OPERATE, write=True)
def resume_paused(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Resume a paused run (``operations.resume_run``): any worker continues it."""
    return _pause_or_resume(request, run_id, operations.resume_run, "Run resumed.")


def _pause_or_resume(request: HtmxHttpRequest, run_id: str, act: Any, done: str) -> HttpResponse:
    form = PauseForm(request.POST)
    if not form.is_valid():  # refused, nothing written: the form says why
        context = run_page_context(run_id)
        context.update(pause_error=form_problem(form))
        return render_page(request, "console/run.html", context, status=400)
    try:
        act(run_id, actor=actor(request), reason=form.cleaned_data["reason"])
    except CommittedUnread as committed:  # it took effect; only the read after it failed
        messages.success(request, f"{done} (commit #{committed.seq})")
        return redirect("console:run", run_id=run_id)
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    except RuntimeFault as exc:
        context = run_page_context(run_id)
        context.update(pause_error=f"{exc.message} ({exc.code})")
        return render_page(request, "console/run.html", context, status=exc.status)
    messages.success(request, done)
    return redirect("console:run", run_id=run_id)


@needs(OPERATE)
def start_run(request: HtmxHttpRequest) -> HttpResponse:
    """Start a run: an agent, the input, and a script for scripted agents."""
    status = 200
    error = None
    if request.method == "POST":
        form = StartRunForm(request.POST)
        if form.is_valid():
            data = form.cleaned_data
            metadata = {"script": data["script"]} if data["script"] is not None else None
            try:
                run_id = operations.start_run(
                    agent=data["agent"],
                    input=data["input"],
                    metadata=metadata,
                    thread_id=data["thread_id"],
                    actor=actor(request),
                )
            except RuntimeFault as exc:
                error, status = exc.message, exc.status
            else:
                messages.success(request, "Run started.")
                return redirect("console:run", run_id=run_id)
        else:
            status = 400
    else:
        example = request.GET.get("example", "approval")
        script = SCRIPT_EXAMPLES.get(example)
        initial = {
            "agent": "demo" if "demo" in registry() else None,
            "input": "Record invoice-42 in the ledger.",
            "script": _pretty(script) if script else "",
            "thread_id": request.GET.get("thread", ""),
        }
        form = StartRunForm(initial=initial)
    agents = registry()
    context = {
        "form": form,
        "error": error,
        "examples": list(SCRIPT_EXAMPLES),
        "agents": [
            {
                "name": a.name,
                "description": a.description,
                "provider": a.provider.kind,
                "tools": [t.name for t in a.tools],
                "step_limit": a.step_limit,
            }
            for a in sorted(agents.values(), key=lambda a: a.name)
        ],
    }
    return render_page(request, "console/start.html", context, status=status)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2)


BULK_CANCEL_MAX = 500  # runs cancelled by one confirmation; the rest need another


@needs(OPERATE, write=True)
def bulk_cancel(request: HtmxHttpRequest) -> HttpResponse:
    """Cancel every run that matches the runs list's filters and has not ended.

    The first POST writes nothing and asks to confirm, naming the count; the confirming POST
    carries that count back (``expected``) and is refused if the match changed meanwhile, so
    an operator never cancels runs they were not told about.
    """
    form = RunFilterForm(request.POST)
    form.is_valid()
    data = {k: v for k, v in form.cleaned_data.items() if k not in ("after", "top")}
    rows = _filtered(data).exclude(state="ended")
    count = rows.count()
    query = {k: v for k, v in request.POST.items() if k in RunFilterForm.base_fields and v}
    context = {"count": count, "filters": query, "cap": BULK_CANCEL_MAX, "changed": False}
    expected = request.POST.get("expected", "")
    if request.POST.get("confirm") != "yes" or expected != str(count):
        context["changed"] = request.POST.get("confirm") == "yes"
        context["reason"] = request.POST.get("reason", "")
        return render_page(request, "console/bulk_cancel.html", context)
    reason = request.POST.get("reason", "")[:500]
    cancelled = 0
    for run_id in rows.order_by("created_at").values_list("id", flat=True)[:BULK_CANCEL_MAX]:
        with suppress(CommittedUnread):  # cancelled; only the read after it failed
            operations.cancel(run_id, actor=actor(request), reason=reason)
        cancelled += 1
    messages.success(request, f"Cancelled {cancelled} run{'s' if cancelled != 1 else ''}.")
    return redirect(f"{reverse('console:runs')}?{urlencode(query)}")


@needs(OPERATE, write=True)
def bulk_pause(request: HtmxHttpRequest) -> HttpResponse:
    """Pause (``action=pause``) every matching run that has not ended and is not paused, or
    resume (``action=resume``) every matching paused run; confirmed like ``bulk_cancel``."""
    action = "resume" if request.POST.get("action") == "resume" else "pause"
    form = RunFilterForm(request.POST)
    form.is_valid()
    data = {k: v for k, v in form.cleaned_data.items() if k not in ("after", "top")}
    rows = _filtered(data).exclude(state="ended").filter(paused=action == "resume")
    count = rows.count()
    query = {k: v for k, v in request.POST.items() if k in RunFilterForm.base_fields and v}
    context = {
        "count": count,
        "filters": query,
        "cap": BULK_CANCEL_MAX,
        "changed": False,
        "action": action,
        "reason_max": PAUSE_REASON_MAX,
    }
    if request.POST.get("confirm") != "yes" or request.POST.get("expected", "") != str(count):
        context["changed"] = request.POST.get("confirm") == "yes"
        context["reason"] = request.POST.get("reason", "")
        return render_page(request, "console/bulk_pause.html", context)
    reason_form = PauseForm(request.POST)
    if not reason_form.is_valid():  # refused before any run is touched: the page says why
        context.update(reason=request.POST.get("reason", ""), error=form_problem(reason_form))
        return render_page(request, "console/bulk_pause.html", context, status=400)
    reason = reason_form.cleaned_data["reason"]
    act = operations.resume_run if action == "resume" else operations.pause
    changed = 0
    for run_id in rows.order_by("created_at").values_list("id", flat=True)[:BULK_CANCEL_MAX]:
        try:
            act(run_id, actor=actor(request), reason=reason)
        except CommittedUnread:  # done; only the read after it failed
            pass
        except RuntimeFault:  # it ended or changed meanwhile: refused, left as it is
            continue
        changed += 1
    verb = "Resumed" if action == "resume" else "Paused"
    messages.success(request, f"{verb} {changed} run{'s' if changed != 1 else ''}.")
    return redirect(f"{reverse('console:runs')}?{urlencode(query)}")


def _deployed_version(agent: str) -> str:
    """The version of ``agent`` this process has deployed now ("" when it has none): beside
    the run's own, it shows that a deploy changed the agent since the run started."""
    definition = registry().get(agent)
    return definition.deployed_version if definition is not None else ""


def fork_statements(doc: dict[str, Any], finished: list[int]) -> list[tuple[int, str]]:
    """``[(step, what a fork after it runs again)]`` for the fork form, said before the click
    (issue 32): the later steps are not copied, the model is asked for the next one at once,
    and the tools those steps called (with their approvals and effects) may be called again,
    as new operations."""
    last = doc["step"]
    statements = []
    for n in finished:
        if n >= last:
            statements.append(
                (n, f"Nothing of this run is repeated: the fork asks the model for step {n + 1}.")
            )
            continue
        later = [c for b in doc["batches"] if b["step"] > n for c in b["calls"]]
        steps, are = (f"step {n + 1}", "is") if n + 1 == last else (f"steps {n + 1}–{last}", "are")
        text = f"This run's {steps} {are} not copied: the fork asks the model for step {n + 1} now"
        if later:
            tools = dict.fromkeys(_tool_words(c) for c in later)
            text += (
                f", and may call again what {steps} called: {', '.join(tools)} (as new operations)."
            )
        else:
            text += f"; {steps} called no tools."
        statements.append((n, text))
    return statements


def _tool_words(call: dict[str, Any]) -> str:
    """A tool as the fork statement names it: "refund (asks approval, effect once)"."""
    notes = ["asks approval"] if call.get("permission") == "ask" else []
    if call.get("effects") in ("once", "idempotent"):
        notes.append(f"effect {call['effects']}")
    return f"{call['name']} ({', '.join(notes)})" if notes else call["name"]


def rerun_cost(run_id: str) -> dict[str, Any]:
    """What running ``run_id`` again would call again, and what its calls already did.

    ``tools``: [{"name", "effects", "calls"}] of the tools with external effects its calls
    used (the new run gets the same input, metadata and script, so it calls them again, each
    under a new operation id: downstream sees new operations); ``applied``: its calls of such
    tools that took effect (completed without error, or reconciled "applied");
    ``indeterminate``: its calls whose effect may have started, with their latest
    reconciliation outcome ("" when none). Each call is {"call_id", "number", "index", "name",
    "step", "operation_id", "outcome"}.
    """
    rows = list(
        ToolCallRecord.objects.filter(run_id=run_id)
        .order_by("step", "index")
        .values(
            "id",
            "step",
            "index",
            "name",
            "effects",
            "phase",
            "is_error",
            "operation_id",
            "effect_may_have_started",
        )
    )
    latest: dict[str, str] = {}
    for call_id, outcome in (
        ReconciliationRecord.objects.filter(call__run_id=run_id)
        .order_by("seq")
        .values_list("call_id", "outcome")
    ):
        latest[call_id] = outcome
    tools: dict[str, dict[str, Any]] = {}
    applied: list[dict[str, Any]] = []
    indeterminate: list[dict[str, Any]] = []
    for number, row in enumerate(rows, 1):
        if row["effects"] == "none":
            continue
        entry = tools.setdefault(
            row["name"], {"name": row["name"], "effects": row["effects"], "calls": 0}
        )
        entry["calls"] += 1
        call = {
            "call_id": row["id"],
            "number": number,
            "index": row["index"],
            "name": row["name"],
            "step": row["step"],
            "operation_id": row["operation_id"],
            "outcome": latest.get(row["id"], ""),
        }
        if row["phase"] == "completed" and not row["is_error"]:
            applied.append(call)
        elif row["phase"] == "indeterminate" and row["effect_may_have_started"]:
            (applied if call["outcome"] == "applied" else indeterminate).append(call)
    return {"tools": list(tools.values()), "applied": applied, "indeterminate": indeterminate}


@needs(OPERATE)
def run_again(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Start a new run on the ended run's thread, with the same agent, input and metadata,
    after a confirmation naming what it costs (issue 22, defect 1).

    GET, or a POST without ``confirm=yes``, writes nothing and answers the confirmation: the
    tools with external effects the new run calls again and the original's calls that took
    effect or may have (``rerun_cost``). The confirming POST starts it.
    """
    run = Run.objects.filter(id=run_id).first()
    if run is None:
        raise Http404(f"run {run_id} does not exist")
    if run.state != "ended":
        messages.error(request, "Only an ended run can run again.")
        return redirect("console:run", run_id=run_id)
    if request.method != "POST" or request.POST.get("confirm") != "yes":
        context = {"run": run, "cost": rerun_cost(run_id)}
        return render_page(request, "console/again.html", context)
    inputs = [
        {"role": role, "content": content}
        for role, content in MessageRecord.objects.filter(
            run_id=run_id, role__in=("user", "system")
        )
        .order_by("seq", "idx")
        .values_list("role", "content")
    ]
    try:
        new_id = operations.start_run(
            agent=run.agent,
            input=inputs,
            metadata=run.metadata,
            thread_id=run.thread_id,
            actor=actor(request),
        )
    except RuntimeFault as exc:
        messages.error(request, f"Not started: {exc.message}")
        return redirect("console:run", run_id=run_id)
    messages.success(request, f"Started again as run {new_id[:8]} on the same thread.")
    return redirect("console:run", run_id=new_id)


@needs(OPERATE, write=True)
def fork_run(request: HtmxHttpRequest, run_id: str) -> HttpResponse:
    """Fork the run after the step the form names (``at_step``), with an optional new input;
    on success go to the new run, else back to this one saying why (runtime.fork)."""
    at_step = whole_number(request.POST.get("at_step", ""))
    if at_step is None:
        messages.error(request, "Not forked: choose the step to fork after.")
        return redirect("console:run", run_id=run_id)
    text = request.POST.get("input", "")[:100_000]
    try:
        new_id = operations.fork_run(
            run_id, at_step=at_step, input=text or None, actor=actor(request)
        )
    except NotFound as exc:
        raise Http404(str(exc)) from exc
    except RuntimeFault as exc:
        messages.error(request, f"Not forked: {exc.message}")
        return redirect("console:run", run_id=run_id)
    messages.success(
        request,
        f"Forked after step {at_step} as run {new_id[:8]} on a new thread; nothing ran again.",
    )
    return redirect("console:run", run_id=new_id)
