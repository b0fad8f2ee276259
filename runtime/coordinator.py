"""The commit coordinator: the one write path of the log.

``commit`` validates a CommitDraft with the pure rule book (``domain.commit.apply_commit``):
identity (thread, run, the thread's active run), the expected version (the thread's last commit
sequence), the disposition's shape and every transition, all before anything is written. Then,
inside one ``transaction.atomic()``, it appends the ThreadCommit row and updates the
projections. A conflict means another writer committed first: nothing of the loser is written,
and it must reload the committed state and decide again, never overwrite. Listeners hear of a
commit only after its transaction has committed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from runtime import codec
from runtime.domain.commit import CommitDraft, apply_commit
from runtime.domain.events import (
    CallExecuting,
    CallResumed,
    ReconciliationRecorded,
)
from runtime.domain.model import RunState, RunView, ThreadHead, ToolCall
from runtime.errors import InvalidCommit, LeaseLost, NotFound, VersionConflict
from runtime.models import (
    MessageRecord,
    ReconciliationRecord,
    Run,
    Thread,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
)
from runtime.signals import CommitNotice, commit_announced

log = logging.getLogger("runtime.commit")

WAKE_CHANNEL = "runtime_runnable"


@dataclass(frozen=True, slots=True)
class Lease:
    """A worker's claim on a run: its id, the claim's epoch and how long a commit renews it."""

    worker_id: str
    epoch: int
    ttl: timedelta


@dataclass(frozen=True, slots=True)
class Committed:
    seq: int
    head: ThreadHead
    run: RunView | None


def read_head(thread_id: str, *, lock: bool = False) -> ThreadHead:
    """Return the thread's head; ``lock`` takes the row lock (PostgreSQL) for a commit."""
    rows = Thread.objects.filter(id=thread_id)
    if lock:
        rows = rows.select_for_update()
    row = rows.values("version", "active_run_id").first()
    if row is None:
        raise NotFound(f"thread {thread_id} does not exist")
    return ThreadHead(
        thread_id=thread_id, version=row["version"], active_run_id=row["active_run_id"]
    )


def read_run(run_id: str) -> RunView | None:
    """Return the committed RunView of ``run_id`` from its projection, or None."""
    snapshot = Run.objects.filter(id=run_id).values_list("snapshot", flat=True).first()
    return codec.load_run(snapshot) if snapshot else None


def commit(draft: CommitDraft, *, lease: Lease | None = None) -> Committed:
    """Validate and write one ThreadCommit; return its sequence and the new state.

    Raises VersionConflict when the thread's head is not ``draft.expected_version`` (or a
    racing writer wins the sequence), LeaseLost when ``lease`` no longer owns the run, and any
    refusal of ``apply_commit``. On any error nothing is written and nobody is told.
    """
    try:
        with transaction.atomic():
            return _commit(draft, lease)
    except IntegrityError as exc:
        # The unique (thread, seq) constraint is the safety net behind the version check;
        # any other unique index refusing a row means the draft reused an id.
        if any(name in str(exc) for name in ("commit_seq_unique_per_thread", "threadcommit.seq")):
            raise VersionConflict(expected=draft.expected_version, reason=str(exc)) from exc
        raise InvalidCommit("the database refused the commit", reason=str(exc)) from exc


def _target_run_id(draft: CommitDraft) -> str | None:
    if draft.run_id is not None:
        return draft.run_id
    return next((e.run_id for e in draft.events if isinstance(e, ReconciliationRecorded)), None)


def _move_head(draft: CommitDraft) -> ThreadHead:
    """Advance the thread's version from ``expected_version`` by one, taking its row lock.

    A conditional update that must change exactly one row: zero means another process got
    there first (or there is no such thread).
    """
    table = Thread._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET version = %s WHERE id = %s AND version = %s "
            "RETURNING active_run_id",
            [draft.expected_version + 1, draft.thread_id, draft.expected_version],
        )
        row = cursor.fetchone()
    if row is None:
        actual = read_head(draft.thread_id).version  # raises NotFound for no thread
        raise VersionConflict(expected=draft.expected_version, actual=actual)
    return ThreadHead(
        thread_id=draft.thread_id, version=draft.expected_version, active_run_id=row[0]
    )


def _commit(draft: CommitDraft, lease: Lease | None) -> Committed:
    head = _move_head(draft)
    target = _target_run_id(draft)
    before = read_run(target) if target else None
    new_head, run = apply_commit(head, before, draft)
    now = timezone.now()
    seq = new_head.version
    if new_head.active_run_id != head.active_run_id:
        Thread.objects.filter(id=draft.thread_id).update(active_run_id=new_head.active_run_id)
    if draft.run_id is not None and run is not None:
        _write_run(run, before, draft, seq, now, lease)
    ThreadCommit.objects.create(
        thread_id=draft.thread_id,
        seq=seq,
        run_id=draft.run_id,
        disposition=codec.dump_disposition(draft.disposition),
        messages=[codec.dump_message(m) for m in draft.messages],
        events=[codec.dump_event(e) for e in draft.events],
        actor=draft.actor,
    )
    if draft.messages:
        MessageRecord.objects.bulk_create(
            MessageRecord(
                thread_id=draft.thread_id,
                run_id=draft.run_id,
                seq=seq,
                idx=i,
                role=m.role,
                content=m.content,
                tool_calls=list(m.tool_calls),
                tool_call_id=m.tool_call_id,
                name=m.name,
                meta=m.meta,
            )
            for i, m in enumerate(draft.messages)
        )
    _write_reconciliations(draft, seq)
    runnable = (
        run is not None
        and run.state is RunState.RUNNING
        and (before is None or before.state is not RunState.RUNNING)
    )
    if runnable and connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # delivered by PostgreSQL only when we commit
            cursor.execute("SELECT pg_notify(%s, %s)", [WAKE_CHANNEL, run.run_id])
    notice = CommitNotice(
        thread_id=draft.thread_id,
        run_id=draft.run_id,
        seq=seq,
        state=run.state.value if run and draft.run_id else None,
        runnable=runnable,
    )
    transaction.on_commit(partial(_announce, notice))
    return Committed(seq=seq, head=new_head, run=run)


def _announce(notice: CommitNotice) -> None:
    log.info(
        "commit thread=%s seq=%s run=%s state=%s",
        notice.thread_id,
        notice.seq,
        notice.run_id,
        notice.state,
    )
    commit_announced.send_robust(sender=CommitNotice, notice=notice)


def _write_run(
    run: RunView,
    before: RunView | None,
    draft: CommitDraft,
    seq: int,
    now: datetime,
    lease: Lease | None,
) -> None:
    fields = {
        "state": run.state.value,
        "end_cause": run.end_cause.value if run.end_cause else None,
        "error": run.error,
        "version": seq,
        "step": run.step,
        "snapshot": codec.dump_run(run),
        "committed_at": now,
        "claims": 0,
    }
    if lease is not None:  # a commit is also a heartbeat; the owner releases when it is done
        fields["lease_expires_at"] = now + lease.ttl
    if before is None:
        activation = draft.events[0]
        Run.objects.create(
            id=run.run_id,
            thread_id=run.thread_id,
            agent=run.agent,
            metadata=getattr(activation, "metadata", None) or {},
            created_by=draft.actor,
            **fields,
        )
    else:
        rows = Run.objects.filter(id=run.run_id)
        if lease is not None:  # fence: only the lease holder of this epoch may write
            rows = rows.filter(lease_owner=lease.worker_id, lease_epoch=lease.epoch)
        if rows.update(**fields) != 1:
            raise LeaseLost(run_id=run.run_id, worker_id=lease.worker_id if lease else None)
    _write_calls(run, before, draft, seq, now)


def _call_fields(call: ToolCall, finalized: bool) -> dict:
    return {
        "phase": call.phase.value,
        "attempt": call.attempt,
        "approved": call.approved,
        "ticket_id": call.ticket_id,
        "result": call.result,
        "is_error": call.is_error,
        "effect_may_have_started": call.effect_may_have_started,
        "batch_finalized": finalized,
    }


def _write_calls(
    run: RunView, before: RunView | None, draft: CommitDraft, seq: int, now: datetime
) -> None:
    old_batches = before.batches if before else ()
    new_records = []
    for i, batch in enumerate(run.batches):
        old = old_batches[i] if i < len(old_batches) else None
        if old == batch:
            continue
        for call in batch.calls:
            previous = old.call(call.call_id) if old else None
            if previous is None:
                new_records.append(
                    ToolCallRecord(
                        id=call.call_id,
                        run_id=run.run_id,
                        step=batch.step,
                        index=call.index,
                        tool_call_id=call.tool_call_id,
                        name=call.name,
                        arguments=call.arguments,
                        arguments_text=call.arguments_text,
                        operation_id=call.operation_id,
                        policy=call.policy.value,
                        permission=call.permission.value,
                        max_attempts=call.max_attempts,
                        **_call_fields(call, batch.finalized),
                    )
                )
            elif previous != call or old.finalized != batch.finalized:
                ToolCallRecord.objects.filter(id=call.call_id).update(
                    updated_at=now, **_call_fields(call, batch.finalized)
                )
    if new_records:
        ToolCallRecord.objects.bulk_create(new_records)
    _write_tickets(run, before, draft, seq, now)


def _write_tickets(
    run: RunView, before: RunView | None, draft: CommitDraft, seq: int, now: datetime
) -> None:
    old_ticket = before.ticket if before else None
    if old_ticket is not None and run.ticket != old_ticket:
        resumed = next((e for e in draft.events if isinstance(e, CallResumed)), None)
        Ticket.objects.filter(id=old_ticket.id).update(
            state="consumed" if resumed else "void",
            decision=resumed.decision.value if resumed else "",
            closed_seq=seq,
            closed_at=now,
            closed_by=draft.actor,
        )
    ticket = run.ticket
    if ticket is not None and ticket != old_ticket:
        Ticket.objects.create(
            id=ticket.id,
            run_id=run.run_id,
            call_id=ticket.call_id,
            kind=ticket.kind.value,
            request=ticket.request,
            schema=ticket.schema,
            opened_seq=seq,
        )


def _write_reconciliations(draft: CommitDraft, seq: int) -> None:
    records = [
        ReconciliationRecord(
            thread_id=draft.thread_id,
            call_id=e.call_id,
            seq=seq,
            outcome=e.outcome,
            evidence=e.evidence,
            actor=draft.actor,
        )
        for e in draft.events
        if isinstance(e, ReconciliationRecorded)
    ]
    if records:
        ReconciliationRecord.objects.bulk_create(records)


def executing_attempts(run_id: str, call_id: str) -> list[dict]:
    """Every committed executor attempt of a call: [{"attempt", "worker", "seq", "at"}]."""
    attempts = []
    for seq, events, at in ThreadCommit.objects.filter(run_id=run_id).values_list(
        "seq", "events", "created_at"
    ):
        for data in events:
            event = codec.load_event(data) if data.get("type") == "CallExecuting" else None
            if isinstance(event, CallExecuting) and event.call_id == call_id:
                attempts.append(
                    {"attempt": event.attempt, "worker": event.worker, "seq": seq, "at": at}
                )
    return attempts
