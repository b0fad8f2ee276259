"""Moving runs to the deployed version of their agent (issue 34, item 3): the versions runs
are on, the dry run of moving one agent's runs, then the move of exactly the runs it listed,
as ``runtime_move`` and ``POST /api/v1/runs/move`` do."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from console.forms import PauseForm
from console.models import OPERATE
from console.views.common import HtmxHttpRequest, actor, form_problem, needs, render_page
from runtime import moves, versions
from runtime.domain.commit import PAUSE_REASON_MAX
from runtime.errors import InvalidCommit, UnknownAgent
from runtime.untrusted import is_id


@needs(OPERATE)
def move_runs(request: HtmxHttpRequest) -> HttpResponse:
    """GET: the versions of each agent that runs not ended are on, and with ``agent`` (and
    ``from_version``) the dry run of moving those runs to the version this server carries;
    nothing is written. POST: move the runs the dry run listed (``run``, repeated) with a
    ``reason``; a run that changed meanwhile is left as it is and counted as not moved."""
    if request.method == "POST":
        return _move(request)
    agent = request.GET.get("agent", "")
    from_version = request.GET.get("from_version", "")
    context = _context(agent, from_version)
    if not agent:
        return render_page(request, "console/move.html", context)
    try:
        to_version, found, more = moves.plan(agent, from_version=from_version or None)
    except UnknownAgent as exc:
        context["error"] = exc.message
        return render_page(request, "console/move.html", context, status=404)
    context.update(to_version=to_version, found=found, more=more)
    context["movable"] = [m.run_id for m in found if not m.refused]
    return render_page(request, "console/move.html", context)


def _context(agent: str, from_version: str) -> dict:
    return {
        "agent": agent,
        "from_version": from_version,
        "groups": versions.versions_in_flight(),
        "deployed": versions.carried(),
        "cap": versions.COUNT_CAP,
        "reason_max": PAUSE_REASON_MAX,
    }


def _move(request: HtmxHttpRequest) -> HttpResponse:
    agent = request.POST.get("agent", "")
    from_version = request.POST.get("from_version", "")
    run_ids = [r for r in request.POST.getlist("run") if is_id(r)][: moves.PAGE_MAX]
    form = PauseForm(request.POST)
    problem = "" if form.is_valid() else form_problem(form)
    if not run_ids:
        problem = problem or "No run to move: run the dry run again."
    if not problem:
        try:
            to_version, found, moved, _ = moves.move(
                agent,
                from_version=from_version or None,
                run_ids=run_ids,
                limit=len(run_ids),
                actor=actor(request),
                reason=form.cleaned_data["reason"],
            )
        except (UnknownAgent, InvalidCommit) as exc:
            problem = exc.message
    if problem:  # refused before any run is touched: the page says why
        context = {**_context(agent, from_version), "error": problem}
        return render_page(request, "console/move.html", context, status=400)
    left = len(run_ids) - len(moved)
    note = f"; {left} not moved (they changed meanwhile: see below)" if left else ""
    messages.success(request, f"Moved {len(moved)} run(s) of {agent} to {to_version}{note}.")
    query = {"agent": agent, **({"from_version": from_version} if from_version else {})}
    return redirect(f"{reverse('console:move')}?{urlencode(query)}")
