"""Read-only counts of the log's state for operators: metrics, the Workers page, retention.

Every function is one aggregate query on an index (or a handful of rows), cheap enough to run
on every Prometheus scrape. Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from django.db.models import Count, Exists, Min, OuterRef, QuerySet, Sum
from django.utils import timezone

from runtime import conf
from runtime.models import (
    ReconciliationRecord,
    Run,
    RunCount,
    Ticket,
    ToolCallRecord,
    WorkerProcess,
)

WorkerStatus = Literal["live", "stale", "stopped"]
# A reconciliation that settles a call: the downstream system said whether it applied.
DECISIVE_OUTCOMES = ("applied", "not_applied")


def runs_by_state(agent: str | None = None) -> dict[tuple[str, str], int]:
    """``{(state, end_cause or ""): count}`` over every run, or every run of ``agent``: read
    from the counts the database's triggers keep (RunCount, migration 0018), a few rows
    however many runs there are."""
    rows = RunCount.objects.filter(n__gt=0)
    if agent is not None:
        rows = rows.filter(agent=agent)
    totals = rows.order_by().values_list("state", "end_cause").annotate(total=Sum("n"))
    return {(state, cause): total for state, cause, total in totals}


def open_tickets(now: datetime | None = None) -> dict[str, tuple[int, float]]:
    """``{kind: (open count, age of the oldest in seconds)}`` (index ticket_open_oldest)."""
    now = now or timezone.now()
    rows = (
        Ticket.objects.filter(state="open")
        .order_by()
        .values_list("kind")
        .annotate(n=Count("id"), oldest=Min("created_at"))
    )
    return {kind: (n, max(0.0, (now - oldest).total_seconds())) for kind, n, oldest in rows}


def unreconciled_calls() -> QuerySet[ToolCallRecord]:
    """Indeterminate calls whose effect may have started and that no decisive reconciliation
    (applied / not applied) settles; a "still unknown" record leaves a call unreconciled.

    DESIGN.md "Decisions": only sealed-from-Executing calls need reconciliation. A fork's copy
    of a call (``source.copied_from``, runtime.fork) never ran: its original is the one to
    check, so the copy is not listed.
    """
    settled = ReconciliationRecord.objects.filter(
        call_id=OuterRef("pk"), outcome__in=DECISIVE_OUTCOMES
    )
    return (
        ToolCallRecord.objects.filter(phase="indeterminate", effect_may_have_started=True)
        .exclude(Exists(settled))
        .exclude(source__has_key="copied_from")
    )


# Why an Indeterminate call was sealed, by the words its sealing wrote into the published result
# (domain.commit.end_cause_reason, domain.recovery.executing_decision, loop.execute): key ->
# (label for a person, the phrase that identifies it). Order matters: the first match wins.
SEAL_REASONS: dict[str, tuple[str, str]] = {
    "cancelled": ("run cancelled", "the run was cancelled"),
    "stopped": ("run stopped", "the run was stopped"),
    "failed": ("run failed", "the run failed"),
    "step_limit": ("step limit reached", "the run reached its step limit"),
    "run_indeterminate": ("run ended indeterminate", "the run ended with an indeterminate"),
    "tool_failed": ("tool failed, unclassified", "the tool failed:"),
    "lookup_failed": ("lookup could not answer", "the lookup by operation id could not answer"),
    "worker_lost": ("worker lost mid-call", "the worker stopped after the call started"),
    "budget_spent": ("attempts spent", "no result after"),
}


def seal_reason(result: str | None) -> str:
    """The SEAL_REASONS key of an Indeterminate call's published result ("" when none fits)."""
    text = result or ""
    return next((key for key, (_, phrase) in SEAL_REASONS.items() if phrase in text), "")


def with_seal_reason(calls: QuerySet[ToolCallRecord], reason: str) -> QuerySet[ToolCallRecord]:
    """``calls`` whose seal says ``reason`` (a SEAL_REASONS key; an unknown key matches none).

    A "tool failed" seal also names the recovery's decision after it ("...; no result after
    3 attempts"), so a call goes to the first key whose phrase it holds, as ``seal_reason``.
    """
    if reason not in SEAL_REASONS:
        return calls.none()
    keys = list(SEAL_REASONS)
    matched = calls.filter(result__contains=SEAL_REASONS[reason][1])
    for earlier in keys[: keys.index(reason)]:
        matched = matched.exclude(result__contains=SEAL_REASONS[earlier][1])
    return matched


def paused_runs() -> int:
    """How many runs hold an open pause ticket (on the partial index of paused runs)."""
    return Run.objects.filter(paused=True).count()


def timers_due(now: datetime | None = None) -> int:
    """Open timer tickets whose due time has come."""
    return Ticket.objects.filter(
        state="open", kind="timer", due_at__lte=now or timezone.now()
    ).count()


def stale_after() -> timedelta:
    """A worker without a heartbeat for longer than two lease periods is stale."""
    return 2 * conf.lease_ttl()


def worker_status(worker: WorkerProcess, now: datetime | None = None) -> WorkerStatus:
    """ "stopped" (it said so), "stale" (silent for more than ``stale_after()``) or "live"."""
    if worker.stopped_at is not None:
        return "stopped"
    now = now or timezone.now()
    return "stale" if now - worker.heartbeat_at > stale_after() else "live"


def workers_by_status() -> dict[WorkerStatus, int]:
    """``{status: count}`` of the registered workers (every row; there are few)."""
    now = timezone.now()
    counts: dict[WorkerStatus, int] = {"live": 0, "stale": 0, "stopped": 0}
    for worker in WorkerProcess.objects.all():
        counts[worker_status(worker, now)] += 1
    return counts


def held_runs(worker_ids: list[str]) -> dict[str, list[str]]:
    """``{worker id: [run ids whose lease names it, oldest commit first]}``."""
    held: dict[str, list[str]] = {wid: [] for wid in worker_ids}
    rows = (
        # Only a running run holds a lease (a commit that ends it clears it): the partial
        # index run_held reads just those.
        Run.objects.filter(state="running", lease_owner__in=worker_ids)
        .order_by("committed_at")
        .values_list("lease_owner", "id")
    )
    for owner, run_id in rows:
        if owner is not None:  # the filter guarantees it; the column is nullable
            held[owner].append(run_id)
    return held


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """A registered worker with its status and the ids of the runs it holds."""

    worker: WorkerProcess
    status: WorkerStatus
    runs: list[str]


def worker_rows(now: datetime | None = None) -> list[WorkerRow]:
    """Every registered worker, most recent heartbeat first, with status and held runs."""
    now = now or timezone.now()
    workers = list(WorkerProcess.objects.order_by("-heartbeat_at", "id"))
    held = held_runs([w.id for w in workers])
    return [WorkerRow(w, worker_status(w, now), held[w.id]) for w in workers]
