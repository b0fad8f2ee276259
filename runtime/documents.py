"""The run document: the one JSON shape the CLI (``runtime_show --json``) and the API share.

Built from the projections only (committed facts), in a fixed number of queries, all inside
one ``snapshot()``: every row it shows comes from the same moment of the log, so the document
is exactly the fold of its run's log up to its ``version`` (issue 12: without it, a commit
landing between two of the reads made states no commit produced).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import wraps
from typing import Any

from django.db.models.functions import Substr
from django.utils import timezone

from runtime import db
from runtime.errors import NotFound
from runtime.limits import why_waiting
from runtime.models import LateEvidence, MessageRecord, Run, Ticket, ToolCallRecord
from runtime.untrusted import is_id

# The columns a list of runs reads (the API's run summaries, the console's runs page).
RUN_SUMMARY_FIELDS = (
    "id",
    "thread_id",
    "agent",
    "agent_version",
    "state",
    "end_cause",
    "version",
    "step",
    "created_by",
    "created_at",
    "committed_at",
    "paused",
    "wait_until",
    "waiting",
)

# How much of a run's input a list shows: its first line, cut here (with "…").
INPUT_LINE_CHARS = 400


def input_lines(run_ids: list[str]) -> dict[str, str]:
    """``{run_id: the first line of its first user message}``, cut to INPUT_LINE_CHARS
    with "…", for a page of runs: one query over those runs' user messages, each read as a
    prefix, never the history."""
    prefixes = (
        MessageRecord.objects.filter(run_id__in=run_ids, role="user")
        .order_by("-seq", "-idx")
        .annotate(start=Substr("content", 1, INPUT_LINE_CHARS + 100))
        .values_list("run_id", "start")
    )
    lines: dict[str, str] = {}
    for run_id, start in prefixes:  # newest first: the first user message wins
        line = (start.strip().splitlines() or [""])[0]
        cut = len(line) > INPUT_LINE_CHARS
        lines[run_id] = line[:INPUT_LINE_CHARS].rstrip() + "…" if cut else line
    return lines


def held_back(run: Run) -> str | None:
    """Why a Running run that no worker holds was released to wait (a model's budget, a
    model outage) until its ``wait_until``, from its own row; None otherwise. The run
    document's ``waiting`` also says when a limit's slots are all held (``why_waiting``)."""
    if run.state != "running" or not run.waiting or run.wait_until is None:
        return None
    return run.waiting if run.wait_until > timezone.now() else None


@contextmanager
def snapshot() -> Iterator[None]:
    """Make every read inside the block see one consistent state of the committed log.

    PostgreSQL: one read-only transaction at REPEATABLE READ (its snapshot is taken by the
    first query). SQLite: one DEFERRED transaction, which under WAL keeps the database as of
    its first read without taking the write lock (the project's IMMEDIATE mode would hold
    every writer off while a page renders). Inside a caller's transaction the block adds
    nothing: reads there already see that transaction's state, and after a commit the caller
    holds the thread's row, so no other commit of the thread lands between the reads.
    Only reads belong in the block.
    """
    connection = db.wrapper()
    if connection.in_atomic_block:
        yield
        return
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        mode = connection.transaction_mode
        connection.transaction_mode = "DEFERRED"
        try:
            with db.atomic():
                connection.transaction_mode = mode
                yield
        finally:
            connection.transaction_mode = mode
        return
    with db.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def consistent[**P, R](read: Callable[P, R]) -> Callable[P, R]:
    """Decorate a function whose reads must all come from one ``snapshot()``."""

    @wraps(read)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        with snapshot():
            return read(*args, **kwargs)

    return wrapped


def late_documents(call: ToolCallRecord, late: list[LateEvidence]) -> dict[str, Any]:
    """The results a call's superseded or sealed attempts reported after the fact.

    ``late_results``: [{"attempt", "result", "is_error", "worker", "at"}], never published
    to the model. ``possible_duplicate`` flags a call whose policy does not allow a repeat
    (reconnect, indeterminate) when an attempt other than its committed one reported a
    result: its effect may have happened twice, so it needs reconciliation downstream.
    """
    return {
        "late_results": [
            {
                "attempt": e.attempt,
                "result": e.result,
                "is_error": e.is_error,
                "worker": e.worker,
                "at": e.created_at.isoformat(),
            }
            for e in late
        ],
        "possible_duplicate": call.policy != "replay"
        and any(e.attempt != call.attempt for e in late),
    }


def call_document(call: ToolCallRecord, late: list[LateEvidence] | None = None) -> dict[str, Any]:
    return {
        "index": call.index,
        "call_id": call.id,
        "tool_call_id": call.tool_call_id,
        "name": call.name,
        "arguments": call.arguments,
        "arguments_text": call.arguments_text,
        "model_arguments": call.model_arguments,
        "phase": call.phase,
        "attempt": call.attempt,
        "max_attempts": call.max_attempts,
        "operation_id": call.operation_id,
        "policy": call.policy,
        "permission": call.permission,
        "effects": call.effects,
        "source": call.source,
        "approved": call.approved,
        "result": call.result,
        "is_error": call.is_error,
        "effect_may_have_started": call.effect_may_have_started,
        "updated_at": call.updated_at.isoformat() if call.updated_at else None,
        **late_documents(call, late or []),
    }


def mcp_servers(sources: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct MCP servers among pinned call sources, in first-use order:
    ``[{"server", "transport", "target", "server_info", "tools": [tool name, ...]}]``."""
    seen: dict[str, dict[str, Any]] = {}
    for source in sources:
        if source.get("kind") != "mcp":
            continue
        entry = seen.setdefault(
            source["server"],
            {key: source.get(key) for key in ("server", "transport", "target", "server_info")}
            | {"tools": []},
        )
        if source["tool"] not in entry["tools"]:
            entry["tools"].append(source["tool"])
    return list(seen.values())


def ticket_document(ticket: Ticket) -> dict[str, Any]:
    return {
        "id": ticket.id,
        "kind": ticket.kind,
        "call_id": ticket.call_id,
        "request": ticket.request,
        "schema": ticket.schema,
        "state": ticket.state,
        "created_at": ticket.created_at.isoformat(),
        "closed_at": ticket.closed_at.isoformat() if ticket.closed_at else None,
        "closed_by": ticket.closed_by,
        "decision": ticket.decision,
        "due_at": ticket.due_at.isoformat() if ticket.due_at else None,
    }


def waited_ticket(state: str, open_tickets: list[Ticket]) -> Ticket | None:
    """The ticket an Awaiting run waits on, among its open tickets (oldest first).

    Its own ticket (approval, input, timer) when it holds one; otherwise the oldest open
    delegation ticket, which is the one the run parks on (``recovery.Park``; a delivery to a
    younger one leaves it in place). A Running run waits on none, even with children out.
    """
    if state != "awaiting":
        return None
    own = [t for t in open_tickets if t.kind != "delegation"]
    candidates = own or open_tickets
    return candidates[0] if candidates else None


def family(run: Run) -> dict[str, Any]:
    """``parent`` ({"run", "call"} or None) and ``children`` of a run, oldest child first."""
    children = Run.objects.filter(parent_run_id=run.id).order_by("created_at", "id")
    return {
        "parent": {"run": run.parent_run_id, "call": run.parent_call_id}
        if run.parent_run_id
        else None,
        "depth": run.depth,
        "children": [
            {
                "id": child["id"],
                "agent": child["agent"],
                "state": child["state"],
                "end_cause": child["end_cause"],
                "call_id": child["parent_call_id"],
            }
            for child in children.values("id", "agent", "state", "end_cause", "parent_call_id")
        ],
    }


def pause_document(run_id: str) -> dict[str, Any] | None:
    """The run's open pause (README, "Pause"): ``{"ticket_id", "paused_by", "paused_at",
    "reason", "line"}`` from its pause ticket in the committed snapshot, or None."""
    ticket = Run.objects.filter(id=run_id).values_list("snapshot__pause", flat=True).first()
    if not isinstance(ticket, dict):
        return None
    request = ticket.get("request") or {}
    pause = {
        "ticket_id": ticket.get("id"),
        "paused_by": request.get("paused_by", ""),
        "paused_at": request.get("paused_at"),
        "reason": request.get("reason", ""),
    }
    return {**pause, "line": paused_line(pause)}


def paused_line(pause: dict[str, Any] | None) -> str:
    """``paused by X at T: reason`` for a run's pause (empty when it is not paused)."""
    if not pause:
        return ""
    line = f"paused by {pause.get('paused_by') or 'an unnamed actor'} at {pause.get('paused_at')}"
    return line + (f": {pause['reason']}" if pause.get("reason") else "")


@consistent
def run_document(run_id: str) -> dict[str, Any]:
    """Return the committed state of a run as the contract's run document.

    Keys: id, thread_id, agent, agent_version (the deployed version of its agent it started
    with, or an operator moved it to, issue 34; "" for a run started before versions were
    recorded), state, end_cause,
    error, version, step, ticket (the ticket
    the run waits on, or None; a timer's carries ``due_at``), tickets (every open ticket,
    delegation tickets of children included), parent ({"run", "call"} or None), depth,
    children ([{"id", "agent", "state", "end_cause", "call_id"}]), pause (None, or who paused
    the run, when and why: ``pause_document``), batches (with every call,
    each with its pinned ``source``), mcp_servers (the MCP servers the run's calls used),
    messages (this run's committed messages), plugin_state (committed staged state by plugin
    key), waiting (why a Running run no worker holds is held back by a limit, or None),
    created_at, committed_at; all read in one snapshot, so ``version`` is the commit it
    shows. Raises NotFound for an unknown id.
    """
    run = (
        Run.objects.defer("snapshot").filter(id=run_id).first() if is_id(run_id) else None
    )  # deferred: the document lists calls from their rows
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    calls = list(ToolCallRecord.objects.filter(run_id=run_id).order_by("step", "index"))
    late: dict[str, list[LateEvidence]] = {}
    for evidence in LateEvidence.objects.filter(call__run_id=run_id).order_by("created_at"):
        late.setdefault(evidence.call_id, []).append(evidence)
    open_tickets = list(
        Ticket.objects.filter(run_id=run_id, state="open").order_by("opened_seq", "id")
    )
    ticket = waited_ticket(run.state, open_tickets)
    messages = MessageRecord.objects.filter(run_id=run_id).order_by("seq", "idx")
    batches: dict[int, dict[str, Any]] = {}
    for call in calls:
        batch = batches.setdefault(
            call.step, {"step": call.step, "finalized": call.batch_finalized, "calls": []}
        )
        batch["calls"].append(call_document(call, late.get(call.id)))
    return {
        "id": run.id,
        "thread_id": run.thread_id,
        "agent": run.agent,
        "agent_version": run.agent_version,
        "state": run.state,
        "end_cause": run.end_cause,
        "error": run.error,
        "version": run.version,
        "step": run.step,
        "ticket": ticket_document(ticket) if ticket else None,
        "tickets": [ticket_document(t) for t in open_tickets],
        "pause": pause_document(run_id) if run.paused else None,
        **family(run),
        "plugin_state": run.plugin_state,
        "batches": list(batches.values()),
        "mcp_servers": mcp_servers(call.source for call in calls),
        "messages": [
            {
                "role": m.role,
                "content": m.content,
                "tool_call_id": m.tool_call_id,
                "tool_calls": m.tool_calls,
                "name": m.name,
                "seq": m.seq,
            }
            for m in messages
        ],
        "metadata": run.metadata,
        "waiting": why_waiting(run) or None,
        "created_by": run.created_by,
        "trace_id": run.trace_id or None,
        "created_at": run.created_at.isoformat(),
        "committed_at": run.committed_at.isoformat() if run.committed_at else None,
    }
