"""Retention: ``runtime_prune`` keeps exactly what an operator still needs, and
``runtime_export`` / ``runtime_import`` move a thread's log byte for byte.

The 10,000 ended runs are built by a fast path: a few template threads are written through
the coordinator, then their rows are copied with fresh ids (bulk_create). The copies are what
the coordinator would have written, so the log checker stays clean on them.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Model
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from runtime import db, fsck, operations, retention
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import ImportRefused
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
from tests.console.support import RunDriver
from tests.runtime.support import run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)

# Copied in dependency order; the auto-numbered primary keys are left to the database.
CLONED = (Thread, Run, ThreadCommit, MessageRecord, ToolCallRecord, Ticket, ReconciliationRecord)
AUTO_PK = {ThreadCommit, MessageRecord, ReconciliationRecord}


def _thread_rows(thread_id: str) -> dict[Any, list[dict[str, Any]]]:
    by_thread = {Thread: {"id": thread_id}, Run: {"thread_id": thread_id}}
    rows = {}
    for model in CLONED:
        where = by_thread.get(model)
        if where is None:
            field = "thread_id" if model in {ThreadCommit, MessageRecord} else "run__thread_id"
            where = {field: thread_id}
            if model is ReconciliationRecord:
                where = {"thread_id": thread_id}
        rows[model] = list(model.objects.filter(**where).values())
    return rows


def _ids(rows: dict[Any, list[dict[str, Any]]]) -> set[str]:
    """Every id the copies must not share with the template (primary keys, operation ids)."""
    ids = {r["id"] for r in rows[Thread] + rows[Run] + rows[ToolCallRecord] + rows[Ticket]}
    return ids | {r["operation_id"] for r in rows[ToolCallRecord]}


def clone_thread(thread_id: str, copies: int) -> list[str]:
    """Write ``copies`` copies of the thread with fresh ids; return the new thread ids."""
    rows = _thread_rows(thread_id)
    template = json.dumps({m.__name__: rows[m] for m in CLONED}, cls=DjangoJSONEncoder)
    ids = _ids(rows)
    made: dict[Any, list[Any]] = {m: [] for m in CLONED}
    new_threads = []
    for _ in range(copies):
        text = template
        renamed = {old: uuid.uuid4().hex for old in ids}
        for old, new in renamed.items():
            text = text.replace(old, new)
        copy = json.loads(text)
        new_threads.append(renamed[thread_id])
        for model in CLONED:
            for row in copy[model.__name__]:
                if model in AUTO_PK:
                    row.pop("id")
                made[model].append(model(**row))
    for model in CLONED:
        model.objects.bulk_create(made[model], batch_size=500)
    return new_threads


def ended_thread() -> str:
    run = RunDriver(operations.start_run(agent="demo", input="hello", actor="t"))
    run.text_step("hi", end=True)
    return run_row(run.run_id).thread_id


def unreconciled_thread(outcome: str | None = None) -> str:
    """A failed run whose ledger_once call was Executing: Indeterminate, effect may have
    started; reconciled with ``outcome`` when given."""
    run = RunDriver(operations.start_run(agent="demo", input="pay", actor="t"))
    (call,) = run.open_batch({"name": "ledger_once", "arguments": {"key": "p"}})
    run.execute(call)
    run.fail()
    if outcome:
        operations.reconcile(call.call_id, outcome=outcome, evidence="ledger", actor="op")
    return run_row(run.run_id).thread_id


def prune(*args: str) -> dict[str, Any]:
    out = StringIO()
    call_command("runtime_prune", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def test_prune_of_10000_ended_runs_keeps_exactly_the_100_unreconciled():
    natural = [ended_thread()]
    natural += clone_thread(natural[0], 9_899)
    unsettled = [unreconciled_thread()]
    unsettled += clone_thread(unsettled[0], 99)
    assert Run.objects.filter(state="ended").count() == 10_000
    for sample in (natural[0], natural[-1], unsettled[0], unsettled[-1]):
        assert fsck.check_thread(sample) == []

    dry = prune("--ended-before", "0", "--dry-run")
    assert dry["pruned"] == {"threads": 9_900, "runs": 9_900, "commits": 9_900 * 2}
    assert Run.objects.count() == 10_000

    report = prune("--ended-before", "0", "--batch-size", "1000")
    assert report["pruned"]["threads"] == 9_900
    kept = {k["thread_id"]: k["reasons"] for k in report["kept"]}
    assert kept == {tid: ["unreconciled_indeterminate"] for tid in unsettled}
    assert set(Thread.objects.values_list("id", flat=True)) == set(unsettled)
    assert Run.objects.count() == 100
    assert not MessageRecord.objects.exclude(thread_id__in=unsettled).exists()
    assert fsck.check() == []


def test_prune_says_what_it_kept_and_why(start):
    recent = ended_thread()
    settled = unreconciled_thread("applied")
    unknown = unreconciled_thread("unknown")
    parent = ended_thread()
    parent_run = Run.objects.get(thread_id=parent).id
    child = start(text_step(), parent_run_id=parent_run)  # Running: an open child
    assert prune("--ended-before", "1")["pruned"]["threads"] == 0  # all ended just now

    out = StringIO()
    call_command("runtime_prune", "--ended-before", "0", stdout=out)
    lines = out.getvalue().splitlines()
    assert f"kept thread={unknown} reason=unreconciled_indeterminate: " in "\n".join(lines)
    assert any(line.startswith(f"kept thread={parent} reason=open_child") for line in lines)
    assert lines[-1].startswith("pruned 2 thread(s), 2 run(s)")
    assert not Thread.objects.filter(id__in=[recent, settled]).exists()
    assert Run.objects.filter(id=child).exists()
    assert fsck.check() == []


def _rich_thread(work_inline: Any, start: Any) -> str:
    """A thread with two runs: tools, a retry, an approval, and a reconciliation note."""
    first = start(
        tool_step(("ledger_replay", {"key": "a"}), ("ledger_approval", {"key": "b"})),
        text_step("recorded"),
    )
    work_inline()
    ticket = Ticket.objects.get(run_id=first, state="open")
    approve = ResumeCommand(
        ticket_id=ticket.id, kind=TicketKind.APPROVAL, decision=Decision.APPROVE
    )
    operations.resume(first, approve, actor="op")
    work_inline()
    assert run_row(first).end_cause == "natural"
    thread_id = run_row(first).thread_id
    second = RunDriver(
        operations.start_run(agent="demo", input="more", thread_id=thread_id, actor="t")
    )
    (call,) = second.open_batch({"name": "ledger_once", "arguments": {"key": "c"}})
    second.execute(call)
    second.fail()
    operations.reconcile(call.call_id, outcome="not_applied", evidence="none", actor="op")
    return thread_id


def _operational_rows(thread_id: str) -> None:
    """Give the thread's runs the rows no fold writes: idempotency records, a stream
    checkpoint and late evidence, so that a prune has every kind of row to delete."""
    for run in Run.objects.filter(thread_id=thread_id):
        CommandRecord.objects.create(run=run, key="k", request_hash="h", response={})
        StartRecord.objects.create(run=run, actor="t", key=run.id, request_hash="h")
        StreamCheckpoint.objects.create(run=run, step=1, text="partial")
    for call in ToolCallRecord.objects.filter(run__thread_id=thread_id):
        LateEvidence.objects.create(call=call, result="late")


def _references() -> dict[type[Model], list[tuple[type[Model], str]]]:
    """``{model: [(referencing model, its foreign key column)]}`` over every installed model,
    for the models a prune deletes."""
    found: dict[type[Model], list[tuple[type[Model], str]]] = {m: [] for m in retention.PRUNED}
    for model in apps.get_models():
        for f in model._meta.get_fields():
            if f.concrete and f.is_relation and f.related_model in found:
                found[f.related_model].append((model, f.attname))
    return found


def _rows_of(thread_ids: list[str]) -> dict[str, int]:
    """How many rows of each table a prune deletes reference the threads (keys through
    their runs and calls too)."""
    runs = list(Run.objects.filter(thread_id__in=thread_ids).values_list("id", flat=True))
    ids: dict[type[Model], list[str]] = {
        Thread: thread_ids,
        Run: runs,
        ToolCallRecord: list(
            ToolCallRecord.objects.filter(run_id__in=runs).values_list("id", flat=True)
        ),
    }
    counts: dict[str, int] = {}
    for target, referencing in _references().items():
        for model, column in referencing:
            if target in ids:
                n = model._default_manager.filter(**{f"{column}__in": ids[target]}).count()
                counts[f"{model._meta.db_table}.{column}"] = n
    counts["runtime_thread"] = Thread.objects.filter(id__in=thread_ids).count()
    return counts


def test_every_relation_to_a_pruned_row_is_deleted_by_the_prune():
    """A model added later with a key to a thread, a run, a call or a ticket must be in
    retention.LEAVES (or the database refuses the prune's DELETE of its parent)."""
    for target, referencing in _references().items():
        for model, column in referencing:
            assert model in retention.PRUNED, f"{model.__name__}.{column} -> {target.__name__}"


def test_prune_deletes_every_row_of_a_pruned_thread_and_nothing_else(work_inline, start):
    doomed = [_rich_thread(work_inline, start), ended_thread()]
    kept = [unreconciled_thread(), _rich_thread(work_inline, start)]
    open_run = start(text_step())  # a thread whose run has not ended
    kept.append(run_row(open_run).thread_id)
    for thread_id in doomed + kept:
        _operational_rows(thread_id)
    # The second rich thread is recent: its runs ended after the cutoff.
    cutoff_days = 1
    Run.objects.exclude(thread_id=kept[1]).update(committed_at=timezone.now() - timedelta(days=2))
    before_doomed, before_kept = _rows_of(doomed), _rows_of(kept)
    for table in ("runtime_lateevidence", "runtime_commandrecord", "runtime_ticket"):
        assert before_doomed[f"{table}.{'call_id' if 'evidence' in table else 'run_id'}"] > 0
    total = {m: m._default_manager.count() for m in retention.PRUNED}

    dry = prune("--ended-before", str(cutoff_days), "--dry-run")
    assert {m: m._default_manager.count() for m in retention.PRUNED} == total
    report = prune("--ended-before", str(cutoff_days))
    commits = before_doomed["runtime_threadcommit.thread_id"]
    assert report["pruned"] == dry["pruned"] == {"threads": 2, "runs": 3, "commits": commits}
    reasons = [{"thread_id": kept[0], "reasons": ["unreconciled_indeterminate"]}]
    assert report["kept"] == dry["kept"] == reasons
    assert set(_rows_of(doomed).values()) == {0}
    assert _rows_of(kept) == before_kept
    assert fsck.check() == []


def test_prune_costs_the_same_statements_per_batch_whatever_its_threads(
    django_assert_num_queries,
):
    template = ended_thread()
    clone_thread(template, 59)
    with CaptureQueriesContext(db.connection) as small:
        retention.prune(timezone.now(), batch_size=100)
    assert not Thread.objects.exists()
    template = ended_thread()
    clone_thread(template, 9)
    with django_assert_num_queries(len(small)):  # 10 threads or 60: one batch, same queries
        retention.prune(timezone.now(), batch_size=100)


def test_export_then_import_round_trips_byte_for_byte(work_inline, start, command, tmp_path):
    thread_id = _rich_thread(work_inline, start)
    run_id = Run.objects.filter(thread_id=thread_id).order_by("created_at").first().id
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    done = command("runtime_export", run_id, "--output", str(first))
    assert done.returncode == 0, done.stderr
    before = {r["id"]: r for r in Run.objects.filter(thread_id=thread_id).values()}
    Thread.objects.filter(id=thread_id).delete()

    done = command("runtime_import", str(first))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"imported thread={thread_id} commits={_lines(first) - 1} runs=2"
    assert command("runtime_export", "--thread", thread_id, "-o", str(second)).returncode == 0
    assert second.read_bytes() == first.read_bytes()
    assert fsck.check() == []
    after = {r["id"]: r for r in Run.objects.filter(thread_id=thread_id).values()}
    for run_id, row in before.items():
        for name in ("state", "end_cause", "version", "snapshot", "metadata", "created_by"):
            assert after[run_id][name] == row[name], name
        # The times of the original commits come back (a run's own stamps differ by the
        # microseconds between its row and its commit row in one transaction).
        for name in ("created_at", "committed_at"):
            assert abs((after[run_id][name] - row[name]).total_seconds()) < 1, name

    again = command("runtime_import", str(first))
    assert again.returncode == 1
    assert f"thread {thread_id} exists already" in again.stderr


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def test_import_refuses_a_log_the_rules_refuse_and_writes_nothing(work_inline, start):
    thread_id = _rich_thread(work_inline, start)
    lines = list(retention.export_thread(thread_id))
    Thread.objects.filter(id=thread_id).delete()
    gap = lines[:2] + lines[3:]  # commit 2 missing
    with pytest.raises(ImportRefused, match="commit 2 is missing"):
        retention.import_thread(gap)
    # Commit 3 claims an Executing attempt for a call that no batch opened.
    forged = json.loads(lines[3])
    forged["events"] = [{"type": "CallExecuting", "call_id": "nope", "attempt": 1, "worker": "w"}]
    with pytest.raises(ImportRefused, match="refused by the rules"):
        retention.import_thread([*lines[:3], json.dumps(forged), *lines[4:]])
    with pytest.raises(ImportRefused, match="header"):
        retention.import_thread(lines[1:])
    assert not Thread.objects.filter(id=thread_id).exists()
    assert ThreadCommit.objects.count() == 0


def test_import_refuses_a_thread_whose_run_has_not_ended(start):
    run_id = start(text_step())
    lines = list(retention.export_thread(run_row(run_id).thread_id))
    Thread.objects.all().delete()
    with pytest.raises(ImportRefused, match=f"not ended: {run_id}"):
        retention.import_thread(lines)
    assert not Thread.objects.exists()
