"""Moving runs to the deployed version of their agent (issue 34, item 3): the versions runs
are on, the dry run of moving one agent's runs, then the move of exactly the runs it listed,
as ``runtime_move`` and ``POST /api/v1/runs/move`` do."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpResponse
from django.shortcuts import redirect
from django.urls import reverse

from console.forms import MoveForm
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
    ``reason``; a run that changed meanwhile is left as it is and counted as not moved. A
    form the page cannot use (a NUL, a version too long) is a 400 that writes nothing."""
    if request.method == "POST":
        return _move(request)
    if "agent" not in request.GET:
        return render_page(request, "console/move.html", _context("", ""))
    form = MoveForm(request.GET)
    if not form.is_valid():
        return _refused(request, form_problem(form))
    agent, from_version = form.cleaned_data["agent"], form.cleaned_data["from_version"]
    context = _context(agent, from_version)
    try:
        to_version, found, more = moves.plan(agent, from_version=from_version or None)
    except UnknownAgent as exc:
        context["error"] = exc.message
        return render_page(request, "console/move.html", context, status=404)
    context.update(to_version=to_version, found=found, more=more)
    context["movable"] = [m.run_id for m in found if not m.refused]
    return render_page(request, "console/move.html", context)


def _context(agent: str, from_version: str) -> dict:
    groups = versions.versions_in_flight()
    return {
        "agent": agent,
        "from_version": from_version,
        "groups": groups,
        "more_versions": len(groups) >= versions.VERSIONS_MAX,
        "deployed": versions.carried(),
        "cap": versions.COUNT_CAP,
        "reason_max": PAUSE_REASON_MAX,
    }


def _refused(request: HtmxHttpRequest, problem: str) -> HttpResponse:
    """The page again, saying why nothing was done (400)."""
    context = {**_context("", ""), "error": problem}
    return render_page(request, "console/move.html", context, status=400)


def _move(request: HtmxHttpRequest) -> HttpResponse:
    form = MoveForm(request.POST)
    run_ids = [r for r in request.POST.getlist("run") if is_id(r)][: moves.PAGE_MAX]
    if not form.is_valid():
        return _refused(request, form_problem(form))
    if not run_ids:
        return _refused(request, "No run to move: run the dry run again.")
    agent, from_version = form.cleaned_data["agent"], form.cleaned_data["from_version"]
    try:
        to_version, _, moved, _ = moves.move(
            agent,
            from_version=from_version or None,
            run_ids=run_ids,
            limit=len(run_ids),
            actor=actor(request),
            reason=form.cleaned_data["reason"],
        )
    except (UnknownAgent, InvalidCommit) as exc:  # refused before any run is touched
        return _refused(request, exc.message)
    left = len(run_ids) - len(moved)
    note = f"; {left} not moved (moved by someone else, ended or driven now: see below)"
    messages.success(
        request, f"Moved {len(moved)} run(s) of {agent} to {to_version}{note if left else ''}."
    )
    query = {"agent": agent, **({"from_version": from_version} if from_version else {})}
    return redirect(f"{reverse('console:move')}?{urlencode(query)}")
