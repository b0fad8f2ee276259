"""Retention: prune old ended threads, and move a thread's log elsewhere (export / import).

A thread's commit log is only meaningful whole (the fold starts at its first commit), so the
unit of pruning and of export is the thread:

- ``prune`` deletes, in batches, every thread whose runs have all ended and whose last run
  ended before a cutoff, with the log and every projection of it. It keeps (and says why) a
  thread with an unreconciled Indeterminate call (``inventory.unreconciled_calls``: an
  operator still has to check the downstream system) or with an open child (a run not ended
  whose ``metadata.parent_run_id`` names one of the thread's runs). A batch is one short
  transaction: it decides its threads again under their locks, then deletes their rows with
  one statement per table (``LEAVES``, then calls, runs, threads), so a pruned run costs the
  same whatever the size of the history.
- ``export_thread`` writes the log as JSON lines: one header line (the thread), then one line
  per ThreadCommit in sequence order. ``import_thread`` folds those lines with the pure rule
  book first (the same fold ``runtime_fsck`` uses), writes them through the coordinator
  (the one write path) in one transaction, restores the original commit times, and checks
  the result with ``fsck.check_thread``: any refusal or finding writes nothing.

Export, import, export gives the same bytes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.db import models
from django.utils.dateparse import parse_datetime

from runtime import codec, db, fsck, inventory
from runtime.commits import commit
from runtime.domain.commit import CommitDraft, fold
from runtime.domain.model import RunState
from runtime.errors import ImportRefused, InvalidCommit, NotFound, RuntimeFault
from runtime.keyset import RowCompare
from runtime.models import (
    CommandRecord,
    LateEvidence,
    MessageRecord,
    ReconciliationRecord,
    Run,
    StartRecord,
    StreamCheckpoint,
    Thread,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
)

FORMAT = "runtime-thread-log/1"
LIVE_STATES = tuple(state.value for state in RunState if state is not RunState.ENDED)
KeepReason = Literal["unreconciled_indeterminate", "open_child"]
REASONS: dict[KeepReason, str] = {
    "unreconciled_indeterminate": "an Indeterminate call whose effect may have started is "
    "not reconciled (applied / not applied)",
    "open_child": "a child run (metadata.parent_run_id) has not ended",
}
# Threads per transaction: short enough that a batch holds its locks for well under a second
# (docs/performance.md, "Retention").
BATCH_SIZE = 500


# -- prune ------------------------------------------------------------------------------------


@dataclass
class PruneReport:
    """What ``prune`` did (or would do, on a dry run).

    ``pruned``: counts of deleted rows by kind ("threads", "runs", "commits"); ``kept``:
    ``{thread id: [reasons]}`` of eligible threads left alone.
    """

    dry_run: bool
    cutoff: datetime
    pruned: Counter[str] = field(default_factory=Counter)
    kept: dict[str, list[KeepReason]] = field(default_factory=dict)


def _eligible(cutoff: datetime, batch: list[str], *, lock: bool) -> dict[str, list[str]]:
    """``{thread id: [run ids]}`` of the threads of ``batch`` that are eligible now: no active
    run, at least one run, every run ended, the latest commit of a run before ``cutoff``.

    Reads the batch's threads (locked first when ``lock``: PostgreSQL) and their runs, two
    indexed reads whatever the size of the history; the caller's transaction makes the
    decision and the delete one.
    """
    threads = Thread.objects.filter(id__in=batch)
    if lock:
        threads = threads.select_for_update()
    idle = [tid for tid, active in threads.values_list("id", "active_run_id") if active is None]
    runs: dict[str, list[str]] = {}
    last: dict[str, datetime] = {}
    refused: set[str] = set()
    for thread_id, run_id, state, at in Run.objects.filter(thread_id__in=idle).values_list(
        "thread_id", "id", "state", "committed_at"
    ):
        runs.setdefault(thread_id, []).append(run_id)
        if state != RunState.ENDED.value:
            refused.add(thread_id)
        elif at is not None:
            last[thread_id] = max(last.get(thread_id, at), at)
    return {
        tid: run_ids
        for tid, run_ids in sorted(runs.items())
        if tid not in refused and tid in last and last[tid] < cutoff
    }


def keep_reasons(runs_of: dict[str, list[str]]) -> dict[str, list[KeepReason]]:
    """``{thread id: [reasons]}`` for the threads of ``runs_of`` (``{thread id: [its run
    ids]}``) that must be kept.

    Reads the runs' unreconciled calls by run id (so the read follows the batch, not every
    Indeterminate call of the history), and the live runs for open children.
    """
    runs = {run_id: tid for tid, run_ids in runs_of.items() for run_id in run_ids}
    unsettled = {
        runs[run_id]
        for run_id in inventory.unreconciled_calls()
        .filter(run_id__in=list(runs))
        .order_by()  # DISTINCT over the run ids alone, not the calls' default ordering
        .values_list("run_id", flat=True)
        .distinct()
    }
    # The runs not ended are the live ones, read by state (run_state_recent): their number
    # follows the work in progress, not the history.
    parents = {
        str(parent)
        for parent in Run.objects.filter(state__in=LIVE_STATES)
        .filter(metadata__has_key="parent_run_id")
        .values_list("metadata__parent_run_id", flat=True)
    }
    open_child = {runs[parent] for parent in parents if parent in runs}
    reasons: dict[str, list[KeepReason]] = {}
    for thread_id in sorted(unsettled | open_child):
        if thread_id in unsettled:
            reasons.setdefault(thread_id, []).append("unreconciled_indeterminate")
        if thread_id in open_child:
            reasons.setdefault(thread_id, []).append("open_child")
    return reasons


def _batches(cutoff: datetime, size: int) -> Iterator[list[str]]:
    """Candidate thread ids, about ``size`` at a time.

    Walks the ended runs whose last commit is before ``cutoff``, oldest first, by keyset on
    (committed_at, id) (the partial index run_ended_order), so each batch reads ``size`` runs
    and the runs of their threads, whatever the size of the history (issue 28: grouping every
    thread per batch made prune quadratic over a backlog). A thread is a candidate in the
    batch that walks its latest run, so exactly once; ``prune`` decides it.
    """
    after: tuple[datetime, str] | None = None
    while True:
        walk = Run.objects.filter(state=RunState.ENDED.value, committed_at__lt=cutoff)
        if after is not None:
            walk = walk.filter(RowCompare(("committed_at", "id"), ">", after))
        runs = list(walk.order_by("committed_at", "id").values_list("committed_at", "id")[:size])
        if not runs:
            return
        last_at, last_id = runs[-1]
        assert last_at is not None  # the walk reads committed_at < cutoff
        last = (last_at, last_id)
        latest: dict[str, tuple[datetime, str]] = {}
        uncommitted: set[str] = set()  # a run without a commit: not prunable
        threads = Run.objects.filter(id__in=[run_id for _, run_id in runs]).values("thread_id")
        for thread_id, at, run_id in Run.objects.filter(thread_id__in=threads).values_list(
            "thread_id", "committed_at", "id"
        ):
            if at is None:
                uncommitted.add(thread_id)
            else:
                latest[thread_id] = max(latest.get(thread_id, (at, run_id)), (at, run_id))
        batch = sorted(
            thread_id
            for thread_id, key in latest.items()
            if thread_id not in uncommitted and (after is None or key > after) and key <= last
        )
        if batch:
            yield batch
        after = last


# Every row that references a pruned thread, children before parents, so that each table is
# one DELETE over the batch's thread ids (issue 28: Django's cascade loaded the runs, their
# calls and tickets, then deleted them a hundred ids per statement, model by model). These
# have no relation pointing at them: QuerySet.delete() deletes them in one statement.
LEAVES: tuple[tuple[type[models.Model], str], ...] = (
    (LateEvidence, "call__run__thread_id__in"),
    (Ticket, "run__thread_id__in"),
    (ReconciliationRecord, "thread_id__in"),
    (MessageRecord, "thread_id__in"),
    (CommandRecord, "run__thread_id__in"),
    (StartRecord, "run__thread_id__in"),
    (StreamCheckpoint, "run__thread_id__in"),
    (ThreadCommit, "thread_id__in"),
)
# Calls, runs and threads have relations pointing at them, so QuerySet.delete() would collect
# them row by row; their dependents are gone by now (LEAVES), so a plain DELETE each. The
# AFTER DELETE trigger on runtime_run keeps the run counts (migration 0018).
_CALLS, _RUNS, _THREADS = (m._meta.db_table for m in (ToolCallRecord, Run, Thread))
DELETE_CALLS = (
    f"DELETE FROM {_CALLS} WHERE run_id IN (SELECT id FROM {_RUNS} WHERE thread_id IN ({{ids}}))"
)
DELETE_RUNS = f"DELETE FROM {_RUNS} WHERE thread_id IN ({{ids}})"
DELETE_THREADS = f"DELETE FROM {_THREADS} WHERE id IN ({{ids}})"
# Models the delete covers: tests check that every relation to these is one of LEAVES'.
PRUNED: tuple[type[models.Model], ...] = (
    *(model for model, _ in LEAVES),
    ToolCallRecord,
    Run,
    Thread,
)


def _delete(thread_ids: list[str]) -> int:
    """Delete the threads and every row that references them; return the commits deleted.

    One statement per table, in the caller's transaction."""
    commits = 0
    for model, where in LEAVES:
        deleted, _ = model._default_manager.filter(**{where: thread_ids}).delete()
        if model is ThreadCommit:
            commits = deleted
    ids = ", ".join(["%s"] * len(thread_ids))
    with db.connection.cursor() as cursor:
        for statement in (DELETE_CALLS, DELETE_RUNS, DELETE_THREADS):
            cursor.execute(statement.format(ids=ids), thread_ids)
    return commits


def prune(cutoff: datetime, *, dry_run: bool = False, batch_size: int = BATCH_SIZE) -> PruneReport:
    """Delete eligible threads (see the module docstring) about ``batch_size`` threads per
    transaction; on a dry run delete nothing and report what would go.

    Each batch locks its threads (PostgreSQL), then decides again inside its transaction, so a
    run started or a reconciliation recorded meanwhile is respected; the delete is one
    statement per table (LEAVES, then calls, runs, threads).
    """
    report = PruneReport(dry_run=dry_run, cutoff=cutoff)
    lock = db.connection.vendor == "postgresql" and not dry_run
    for batch in _batches(cutoff, batch_size):
        with db.atomic():
            still = _eligible(cutoff, batch, lock=lock)
            kept = keep_reasons(still)
            report.kept.update(kept)
            doomed = [tid for tid in still if tid not in kept]
            if not doomed:
                continue
            report.pruned["threads"] += len(doomed)
            report.pruned["runs"] += sum(len(still[tid]) for tid in doomed)
            if dry_run:
                report.pruned["commits"] += ThreadCommit.objects.filter(
                    thread_id__in=doomed
                ).count()
            else:
                report.pruned["commits"] += _delete(doomed)
    return report


# -- export / import --------------------------------------------------------------------------


def _line(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


def export_thread(thread_id: str) -> Iterator[str]:
    """The thread's log as JSON lines (each ending in a newline).

    First ``{"format", "thread": {"id", "metadata", "created_at"}}``, then per commit, in
    sequence order, ``{"seq", "run_id", "disposition", "messages", "events", "actor",
    "created_at"}`` exactly as stored. Raises NotFound for an unknown thread.
    """
    thread = Thread.objects.filter(id=thread_id).values("id", "metadata", "created_at").first()
    if thread is None:
        raise NotFound(f"thread {thread_id} does not exist")
    header = {**thread, "created_at": thread["created_at"].isoformat()}
    yield _line({"format": FORMAT, "thread": header})
    rows = (
        ThreadCommit.objects.filter(thread_id=thread_id)
        .order_by("seq")
        .values("seq", "run_id", "disposition", "messages", "events", "actor", "created_at")
    )
    for row in rows.iterator():
        yield _line({**row, "created_at": row["created_at"].isoformat()})


def _parse(lines: Iterable[str]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    documents = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            documents.append(json.loads(text))
        except RecursionError as exc:  # deeper than any log the runtime writes
            raise ImportRefused(f"line {number} is not JSON we read: nested too deeply") from exc
        except ValueError as exc:  # JSONDecodeError, or an integer over Python's 4,300 digits
            raise ImportRefused(f"line {number} is not JSON: {exc}") from exc
    if not documents or documents[0].get("format") != FORMAT:
        raise ImportRefused(f"the first line must be a {FORMAT} header")
    header, commits = documents[0], documents[1:]
    if not isinstance(header.get("thread"), dict) or not header["thread"].get("id"):
        raise ImportRefused("the header names no thread")
    return header["thread"], commits


def _time(value: Any, what: str) -> datetime:
    parsed = parse_datetime(str(value)) if value else None
    if parsed is None:
        raise ImportRefused(f"{what} has no valid created_at: {value!r}")
    return parsed


def _drafts(thread_id: str, commits: list[dict[str, Any]]) -> list[tuple[int, CommitDraft]]:
    drafts = []
    for expected, row in enumerate(commits, 1):
        if row.get("seq") != expected:
            raise ImportRefused(f"commit {expected} is missing (found seq {row.get('seq')!r})")
        try:
            draft = CommitDraft(
                thread_id=thread_id,
                run_id=row.get("run_id"),
                expected_version=expected - 1,
                disposition=codec.load_disposition(row.get("disposition")),
                messages=tuple(codec.load_message(m) for m in row.get("messages", [])),
                events=tuple(codec.load_event(e) for e in row.get("events", [])),
                actor=str(row.get("actor", "")),
            )
        except Exception as exc:  # pydantic's ValidationError, an unknown event type, ...
            raise ImportRefused(f"commit {expected} does not decode: {exc}") from exc
        drafts.append((expected, draft))
    return drafts


def import_thread(lines: Iterable[str]) -> dict[str, Any]:
    """Load one exported thread log; return ``{"thread_id", "commits", "runs"}``.

    Raises ImportRefused (nothing written) when the lines are malformed, the thread exists
    already, a run in it has not ended, the fold refuses a commit (the rules of
    ``runtime_fsck``), or the imported projections disagree with the log.
    """
    thread, commits = _parse(lines)
    thread_id = str(thread["id"])
    drafts = _drafts(thread_id, commits)
    try:
        folded = fold(thread_id, drafts)
    except Exception as exc:  # the rule book's refusal, whatever its type
        raise ImportRefused(f"the log is refused by the rules: {exc}") from exc
    live = sorted(rid for rid, run in folded.runs.items() if run.state is not RunState.ENDED)
    if live:
        # This deployment's workers and operators would act on it a second time.
        raise ImportRefused(f"only ended runs are imported; not ended: {', '.join(live)}")
    times = {row["seq"]: _time(row.get("created_at"), f"commit {row['seq']}") for row in commits}
    with db.atomic():
        if Thread.objects.filter(id=thread_id).exists():
            raise ImportRefused(f"thread {thread_id} exists already")
        Thread.objects.create(id=thread_id, metadata=thread.get("metadata") or {})
        try:
            for _, draft in drafts:
                commit(draft)
        except (RuntimeFault, InvalidCommit) as exc:
            raise ImportRefused(f"the coordinator refused the log: {exc}") from exc
        _restore_times(thread_id, _time(thread.get("created_at"), "the thread"), times)
        violations = fsck.check_thread(thread_id)
        if violations:
            raise ImportRefused(f"the imported thread fails the checker: {violations[0]}")
    runs = Run.objects.filter(thread_id=thread_id).count()
    return {"thread_id": thread_id, "commits": len(drafts), "runs": runs}


def _restore_times(thread_id: str, created: datetime, times: dict[int, datetime]) -> None:
    """Give the imported rows the times of the original commits (operational timestamps:
    the coordinator stamped them "now")."""
    Thread.objects.filter(id=thread_id).update(created_at=created)
    rows = list(ThreadCommit.objects.filter(thread_id=thread_id))
    for row in rows:
        row.created_at = times[row.seq]
    ThreadCommit.objects.bulk_update(rows, ["created_at"])
    by_run: dict[str, list[int]] = {}
    for row in rows:
        if row.run_id:
            by_run.setdefault(row.run_id, []).append(row.seq)
    for run_id, seqs in by_run.items():
        Run.objects.filter(id=run_id).update(
            created_at=times[min(seqs)], committed_at=times[max(seqs)]
        )
    for ticket in Ticket.objects.filter(run__thread_id=thread_id):
        ticket.created_at = times[ticket.opened_seq]
        ticket.closed_at = times.get(ticket.closed_seq) if ticket.closed_seq else None
        ticket.save(update_fields=["created_at", "closed_at"])
    for record in ReconciliationRecord.objects.filter(thread_id=thread_id):
        ReconciliationRecord.objects.filter(pk=record.pk).update(created_at=times[record.seq])
