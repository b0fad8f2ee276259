"""The commit coordinator: the one write path of the log.

``commit`` validates a CommitDraft with the pure rule book (``domain.commit.apply_commit``):
identity (thread, run, the thread's active run), the expected version (the thread's last commit
sequence), the disposition's shape and every transition, all before anything is written. The
caller may hand in the committed head and run it already holds (a worker keeps what each of its
commits returned, so it reads nothing between its own commits); otherwise both are read in one
query. The write then checks, atomically, that the thread is still at the expected version and
the run at the version the decision was made on (and, for a worker, that its lease epoch still
owns the run), appends the ThreadCommit row and updates every projection.

On PostgreSQL the whole write is ONE statement (data-modifying CTEs), its own transaction when
no transaction is open: one round trip per commit. Every part hangs off the head move, so a
stale writer writes nothing; a run update refused after the head moved leaves the commit row
with a disposition but no run, which the ``commit_disposition_needs_run`` constraint rejects,
failing the whole statement. Elsewhere (SQLite) the same rows are written statement by statement
inside a transaction on the runtime's database (``runtime.db.atomic``). A conflict means
another writer committed first: nothing of the loser is written, and it must reload the
committed state and decide again, never overwrite.
Listeners hear of a commit only after its transaction has committed.

A commit that ends a child Run, or a Run with live children, owes other Runs follow-ups (the
delivery of the child's terminus to its parent, the cancellation of the children): ``prepare``
names them as values (``domain.delegation.follow_ups``) before anything is written, and the
layer above (``runtime.commits``) writes the commit and applies them in one transaction. This
module never calls up.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cache, partial
from typing import Any

from django.db import DataError, IntegrityError, OperationalError, models, transaction
from django.utils import timezone

from runtime import codec, conf, db, metrics
from runtime.domain import webhooks
from runtime.domain.commit import CommitDraft, apply_commit
from runtime.domain.delegation import FollowUp, follow_ups
from runtime.domain.events import (
    CallExecuting,
    CallResumed,
    ReconciliationRecorded,
    RunMoved,
    StepCommitted,
)
from runtime.domain.model import ResumeTicket, RunState, RunView, ThreadHead, ToolBatch, ToolCall
from runtime.errors import InvalidCommit, LeaseLost, NotFound, VersionConflict
from runtime.models import (
    MessageRecord,
    ReconciliationRecord,
    Run,
    StreamCheckpoint,
    Thread,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
    WebhookDelivery,
    WebhookEndpoint,
)
from runtime.signals import CommitNotice, commit_announced

log = logging.getLogger("runtime.commit")

WAKE_CHANNEL = "runtime_runnable"
# A notice's payload on WAKE_CHANNEL: the run id when the run became runnable, this prefix and
# the run id when it was paused (its worker lets it go at once, not at its next heartbeat).
PAUSED_PREFIX = "paused:"


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


# -- reads ---------------------------------------------------------------------------------------


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
    row = Run.objects.filter(id=run_id).values_list("snapshot", "agent_version").first()
    return _loaded(*row) if row else None


def _loaded(snapshot: dict[str, Any] | None, agent_version: str) -> RunView | None:
    """The RunView of a stored snapshot. A snapshot written before RunView held the agent's
    version lacks it: the run's row, stamped from its activation (issue 34), supplies it,
    so the next commit's snapshot agrees with a fold of the log."""
    if not snapshot:
        return None
    view = codec.load_run(snapshot)
    if "agent_version" not in snapshot and agent_version:
        view = replace(view, agent_version=agent_version)
    return view


def read_frontier(thread_id: str, run_id: str | None) -> tuple[ThreadHead, RunView | None]:
    """Return the thread's head and the committed run ``run_id`` (or None) in one query.

    Raises NotFound when the thread does not exist.
    """
    row = (
        Thread.objects.filter(id=thread_id)
        .values_list("version", "active_run_id")
        .annotate(
            snapshot=models.Subquery(Run.objects.filter(id=run_id).values("snapshot")[:1]),
            agent_version=models.Subquery(
                Run.objects.filter(id=run_id).values("agent_version")[:1]
            ),
        )
        .first()
    )
    if row is None:
        raise NotFound(f"thread {thread_id} does not exist")
    version, active, snapshot, agent_version = row
    head = ThreadHead(thread_id=thread_id, version=version, active_run_id=active)
    return head, _loaded(snapshot, agent_version or "")


# -- the commit ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Plan:
    """A validated commit, not yet written: its rows, the state it leaves, and what it owes
    other Runs (applied by ``runtime.commits`` in the same transaction)."""

    draft: CommitDraft
    writes: _Writes
    head: ThreadHead
    run: RunView | None
    follow_ups: tuple[FollowUp, ...]


def prepare(
    draft: CommitDraft,
    *,
    lease: Lease | None = None,
    head: ThreadHead | None = None,
    before: RunView | None = None,
    new_thread: bool = False,
) -> Plan:
    """Validate one ThreadCommit and plan its writes (nothing is written).

    ``head`` and ``before`` are the committed head and target run the caller decided on
    (both or neither; read here when not given). ``new_thread`` creates the thread
    ``draft.thread_id`` with this, its first commit (a run's activation), in the same write.
    Raises NotFound for an unknown thread and any refusal of ``apply_commit``.
    """
    target = draft.run_id or _reconciled_run_id(draft)
    if new_thread:
        head, before = ThreadHead(thread_id=draft.thread_id), None
    elif head is None:
        head, before = read_frontier(draft.thread_id, target)
    try:
        new_head, run = apply_commit(head, before, draft)
    except VersionConflict:
        metrics.version_conflict()
        raise
    writes = _plan(draft, head, new_head, before, run, lease)
    writes.create_thread = new_thread
    return Plan(draft, writes, new_head, run, follow_ups(before, run))


@metrics.observe_commit
def write(plan: Plan) -> Committed:
    """Write a planned commit; return its sequence and the new state.

    Raises VersionConflict when the thread is not at the expected version or the run moved
    since the plan's ``before``, LeaseLost when the plan's lease no longer owns the run, and
    InvalidCommit when the database refuses a value. On any error nothing is written and
    nobody is told. A plan that owes follow-ups is written inside the caller's transaction.
    """
    draft, writes, run = plan.draft, plan.writes, plan.run
    outermost = not db.connection.in_atomic_block
    try:
        moved = _write(writes)
    except OperationalError as exc:
        # Two threads' commits in one transaction (a child's end delivering to its parent, a
        # parent's end cancelling its children) may deadlock on PostgreSQL; the database
        # rolls one back whole, and for its writer that is a conflict like any other.
        if outermost and deadlocked(exc):
            raise VersionConflict(expected=draft.expected_version, reason=str(exc)) from exc
        raise
    except DataError as exc:  # a value the database cannot store (a NUL, a lone surrogate)
        raise InvalidCommit("the database refused a value of the commit", reason=str(exc)) from exc
    except IntegrityError as exc:
        if "commit_disposition_needs_run" in str(exc):
            raise _refusal(writes) from exc
        if any(name in str(exc) for name in ("commit_seq_unique_per_thread", "threadcommit.seq")):
            raise VersionConflict(expected=draft.expected_version, reason=str(exc)) from exc
        raise InvalidCommit("the database refused the commit", reason=str(exc)) from exc
    if not moved:
        raise _refusal(writes)
    notice = CommitNotice(
        thread_id=draft.thread_id,
        run_id=draft.run_id,
        seq=writes.seq,
        state=run.state.value if run and draft.run_id else None,
        runnable=writes.notify,
        paused=writes.paused,
    )
    transaction.on_commit(partial(_announce, notice), using=db.alias())
    return Committed(seq=writes.seq, head=plan.head, run=run)


def commit(
    draft: CommitDraft,
    *,
    lease: Lease | None = None,
    head: ThreadHead | None = None,
    before: RunView | None = None,
    new_thread: bool = False,
) -> Committed:
    """``prepare`` and ``write`` a commit that owes no other Run anything (an activation, a
    step, a resume, a note); raises what they raise. A commit that ends a child Run or a Run
    with live children goes through ``runtime.commits.commit`` instead: here it raises
    InvalidCommit rather than leave its follow-ups undone."""
    plan = prepare(draft, lease=lease, head=head, before=before, new_thread=new_thread)
    if plan.follow_ups:
        raise InvalidCommit(
            "this commit owes other runs follow-ups; commit it with runtime.commits.commit",
            reason=", ".join(type(f).__name__ for f in plan.follow_ups),
        )
    return write(plan)


def deadlocked(exc: OperationalError) -> bool:
    """Whether PostgreSQL rolled the transaction back to break a deadlock."""
    return getattr(exc.__cause__, "sqlstate", "") == "40P01"


def _write(writes: _Writes) -> bool:
    if db.connection.vendor != "postgresql":
        with db.atomic():
            return _write_each(writes)
    if db.connection.in_atomic_block:  # a savepoint keeps the caller's transaction usable
        with db.atomic():
            return _write_postgres(writes)
    return _write_postgres(writes)  # autocommit: the statement is its own transaction


def _reconciled_run_id(draft: CommitDraft) -> str | None:
    return next((e.run_id for e in draft.events if isinstance(e, ReconciliationRecorded)), None)


def _refusal(writes: _Writes) -> Exception:
    """Say why a write changed nothing: the thread moved, the run moved, or the lease is gone."""
    head = read_head(writes.thread_id)  # raises NotFound for no thread
    if head.version != writes.expected or writes.lease is None:
        return VersionConflict(expected=writes.expected, actual=head.version)
    owner = Run.objects.filter(id=writes.run_id).values("lease_owner", "lease_epoch").first()
    if owner != {"lease_owner": writes.lease.worker_id, "lease_epoch": writes.lease.epoch}:
        return LeaseLost(run_id=writes.run_id, worker_id=writes.lease.worker_id)
    return VersionConflict(expected=writes.expected, actual=head.version)


def _announce(notice: CommitNotice) -> None:
    log.debug(
        "commit thread=%s seq=%s run=%s state=%s",
        notice.thread_id,
        notice.seq,
        notice.run_id,
        notice.state,
        extra={"seq": notice.seq, "thread_id": notice.thread_id, "run_id": notice.run_id},
    )
    commit_announced.send_robust(sender=CommitNotice, notice=notice)


# -- what one commit writes -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Row:
    """One row to insert: its model and a value for every field an insert writes, by attname
    (plain values, not a model instance: building instances cost a tenth of a worker's time)."""

    model: type[models.Model]
    values: dict[str, Any]


def _row(model: type[models.Model], **values: Any) -> _Row:
    """A row of ``model`` from ``values`` (by attname); a field left out takes its default, as
    an unsaved instance's would (``auto_now`` and ``auto_now_add`` ones: now)."""
    for f in _fields(model):
        if f.attname not in values:
            auto = getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)
            values[f.attname] = timezone.now() if auto else f.get_default()
    return _Row(model, values)


@dataclass(slots=True)
class _Writes:
    """Every row one commit writes, as rows of values and column values."""

    thread_id: str
    expected: int
    seq: int
    active_run_id: str | None
    run_id: str | None
    lease: Lease | None
    log: _Row
    run_insert: _Row | None = None
    run_update: dict[str, Any] | None = None  # column values of an existing run
    run_version: int = 0  # the version the existing run must still have
    # A move to another version: written only while no worker holds the run's lease, judged
    # in the write itself, so that no claim slips in between the check and the commit.
    unleased: bool = False
    messages: list[_Row] = field(default_factory=list)
    calls: list[_Row] = field(default_factory=list)  # inserted or updated
    ticket_closes: list[dict[str, Any]] = field(default_factory=list)
    ticket_opens: list[_Row] = field(default_factory=list)
    reconciliations: list[_Row] = field(default_factory=list)
    # Webhook events, one row each with no endpoint: the write fans each out to every enabled
    # endpoint subscribed to its kind (the outbox, runtime.webhooks).
    outbox: list[_Row] = field(default_factory=list)
    clear_checkpoint: bool = False
    notify: bool = False
    paused: bool = False  # the commit paused the run: its worker is told (PAUSED_PREFIX)
    create_thread: bool = False


def _plan(
    draft: CommitDraft,
    head: ThreadHead,
    new_head: ThreadHead,
    before: RunView | None,
    run: RunView | None,
    lease: Lease | None,
) -> _Writes:
    now = timezone.now()
    seq = new_head.version
    writes = _Writes(
        thread_id=draft.thread_id,
        expected=head.version,
        seq=seq,
        active_run_id=new_head.active_run_id,
        run_id=draft.run_id,
        lease=lease,
        log=_row(
            ThreadCommit,
            thread_id=draft.thread_id,
            seq=seq,
            run_id=draft.run_id,
            disposition=codec.dump_disposition(draft.disposition),
            messages=[codec.dump_message(m) for m in draft.messages],
            events=[codec.dump_event(e) for e in draft.events],
            actor=draft.actor,
            agent_version=draft.agent_version,
            created_at=now,
        ),
        messages=_message_records(draft, seq),
        reconciliations=[
            _row(
                ReconciliationRecord,
                thread_id=draft.thread_id,
                call_id=e.call_id,
                seq=seq,
                outcome=e.outcome,
                evidence=e.evidence,
                actor=draft.actor,
                created_at=now,
            )
            for e in draft.events
            if isinstance(e, ReconciliationRecorded)
        ],
    )
    if draft.run_id is not None and run is not None:
        _plan_run(writes, draft, before, run, now)
    writes.outbox = _outbox(draft, before, run, seq, now)
    return writes


def _outbox(
    draft: CommitDraft, before: RunView | None, run: RunView | None, seq: int, now: datetime
) -> list[_Row]:
    """The webhook events this commit owes (``domain.webhooks.notifications``), as outbox rows
    written by the same write as the commit: an event exists if and only if its commit does."""
    found = webhooks.notifications(draft, before, run) if draft.run_id else ()
    if not found:
        return []
    at = now.isoformat()
    url = conf.run_url(draft.run_id) if draft.run_id else None
    rows = []
    for idx, notification in enumerate(found):
        message = webhooks.message_id(draft.thread_id, seq, idx)
        payload = webhooks.body(
            notification,
            message=message,
            run=run,
            thread_id=draft.thread_id,
            seq=seq,
            actor=draft.actor,
            at=at,
            url=url,
        )
        rows.append(
            _row(
                WebhookDelivery,
                endpoint_id=None,
                message_id=message,
                kind=notification.kind.value,
                run_id=draft.run_id,
                thread_id=draft.thread_id,
                seq=seq,
                idx=idx,
                payload=payload,
                next_attempt_at=now,
                created_at=now,
            )
        )
    return rows


def _fan_out(outbox: list[_Row]) -> list[_Row]:
    """Each outbox row once per enabled endpoint subscribed to its kind (SQLite's writer; the
    PostgreSQL statement joins the endpoints itself)."""
    endpoints = list(WebhookEndpoint.objects.filter(enabled=True).values_list("id", "events"))
    return [
        _Row(WebhookDelivery, {**row.values, "endpoint_id": endpoint_id})
        for row in outbox
        for endpoint_id, events in endpoints
        if row.values["kind"] in (events or ())
    ]


def _message_records(draft: CommitDraft, seq: int) -> list[_Row]:
    if not draft.messages:
        return []
    assert draft.run_id is not None  # apply_commit refuses a thread note with messages
    return [
        _row(
            MessageRecord,
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
    ]


def _plan_run(
    writes: _Writes, draft: CommitDraft, before: RunView | None, run: RunView, now: datetime
) -> None:
    fields = {
        "state": run.state.value,
        "end_cause": run.end_cause.value if run.end_cause else None,
        "error": run.error,
        "version": writes.seq,
        "step": run.step,
        "snapshot": codec.dump_run(run),
        "committed_at": now,
        "claims": 0,
        "failures": 0,
        "plugin_state": run.plugin_state,
        "paused": run.pause is not None,
    }
    if run.state is not RunState.RUNNING:  # nothing for a worker to do: the lease ends here
        fields.update(lease_owner=None, lease_expires_at=None)
    if any(isinstance(e, RunMoved) for e in draft.events):  # the workers that may claim it
        fields["agent_version"] = run.agent_version
        writes.unleased = True
    if before is None:
        activation = draft.events[0]
        metadata = getattr(activation, "metadata", None) or {}
        writes.run_insert = _row(
            Run,
            id=run.run_id,
            thread_id=run.thread_id,
            agent=run.agent,
            parent_run_id=run.parent_run_id,
            parent_call_id=run.parent_call_id,
            depth=run.depth,
            metadata=metadata,
            agent_version=getattr(activation, "agent_version", ""),
            forked_from=_forked_from(metadata),
            created_by=draft.actor,
            created_at=now,
            **fields,
        )
    else:
        writes.run_update = fields
        writes.run_version = before.version
    writes.calls = _changed_calls(run, before, now)
    _plan_tickets(writes, draft, before, run, now)
    writes.clear_checkpoint = any(isinstance(e, StepCommitted) for e in draft.events)
    writes.notify = runnable(run) and (before is None or not runnable(before))
    writes.paused = run.pause is not None and (before is None or before.pause is None)


def _forked_from(metadata: dict[str, Any]) -> str | None:
    """The run a fork's activation names (runtime.fork writes ``metadata.forked_from``), or
    None: projected into ``Run.forked_from`` so a run's forks are an index lookup."""
    source = metadata.get("forked_from")
    run_id = source.get("run_id") if isinstance(source, dict) else None
    return run_id if isinstance(run_id, str) else None


def runnable(run: RunView) -> bool:
    """Whether a worker has something to do for ``run``: Running and not paused."""
    return run.state is RunState.RUNNING and run.pause is None


def _changed_calls(run: RunView, before: RunView | None, now: datetime) -> list[_Row]:
    old_batches = before.batches if before else ()
    rows = []
    for i, batch in enumerate(run.batches):
        old = old_batches[i] if i < len(old_batches) else None
        if old == batch:
            continue
        for call in batch.calls:
            previous = old.call(call.call_id) if old else None
            if previous != call or old is None or old.finalized != batch.finalized:
                rows.append(_call_record(run.run_id, batch, call, now))
    return rows


def _call_record(run_id: str, batch: ToolBatch, call: ToolCall, now: datetime) -> _Row:
    return _row(
        ToolCallRecord,
        id=call.call_id,
        run_id=run_id,
        step=batch.step,
        index=call.index,
        tool_call_id=call.tool_call_id,
        name=call.name,
        arguments=call.arguments,
        arguments_text=call.arguments_text,
        model_arguments=call.model_arguments,
        operation_id=call.operation_id,
        policy=call.policy.value,
        permission=call.permission.value,
        max_attempts=call.max_attempts,
        source=call.source,
        effects=call.effects.value,
        phase=call.phase.value,
        attempt=call.attempt,
        approved=call.approved,
        ticket_id=call.ticket_id,
        result=call.result,
        is_error=call.is_error,
        effect_may_have_started=call.effect_may_have_started,
        batch_finalized=batch.finalized,
        updated_at=now,
    )


# The columns a call's commit may change; the rest are fixed when its batch opens. The
# arguments change once, when an operator approves an edit of them.
CALL_PROGRESS = (
    "arguments",
    "arguments_text",
    "model_arguments",
    "phase",
    "attempt",
    "approved",
    "ticket_id",
    "result",
    "is_error",
    "effect_may_have_started",
    "batch_finalized",
    "updated_at",
)


def open_tickets(run: RunView | None) -> dict[str, ResumeTicket]:
    """Every open ticket of a run by id: the one it waits on and its delegation tickets."""
    if run is None:
        return {}
    return {t.id: t for t in ((run.ticket,) if run.ticket else ()) + run.waits}


def ticket_due_at(ticket: ResumeTicket) -> datetime | None:
    """A timer ticket's due time (``request["due_at"]``, ISO 8601 UTC) as a datetime."""
    due = ticket.request.get("due_at") if isinstance(ticket.request, dict) else None
    return datetime.fromisoformat(due) if due else None


def _plan_tickets(
    writes: _Writes, draft: CommitDraft, before: RunView | None, run: RunView, now: datetime
) -> None:
    old, new = open_tickets(before), open_tickets(run)
    resumed = {e.ticket_id: e for e in draft.events if isinstance(e, CallResumed)}
    for ticket_id in sorted(old.keys() - new.keys()):
        event = resumed.get(ticket_id)
        writes.ticket_closes.append(
            {
                "id": ticket_id,
                "state": "consumed" if event else "void",
                "decision": event.decision.value if event else "",
                "closed_seq": writes.seq,
                "closed_at": now,
                "closed_by": draft.actor,
            }
        )
    writes.ticket_opens = [
        _row(
            Ticket,
            id=ticket.id,
            run_id=run.run_id,
            call_id=ticket.call_id,
            kind=ticket.kind.value,
            request=ticket.request,
            schema=ticket.schema,
            opened_seq=writes.seq,
            created_at=now,
            due_at=ticket_due_at(ticket),
        )
        for ticket_id, ticket in sorted(new.items())
        if ticket_id not in old
    ]


# -- the statement-by-statement writer (SQLite) ----------------------------------------------------


def _write_each(w: _Writes) -> bool:
    """Write ``w`` statement by statement (plain SQL with the fields' own value adaptation)
    inside the caller's transaction; False when the thread or the run moved (or the lease is
    gone) and nothing was written."""
    with db.connection.cursor() as cursor:
        if w.create_thread:
            _insert_each(
                cursor, [_row(Thread, id=w.thread_id, version=w.seq, active_run_id=w.active_run_id)]
            )
        else:
            cursor.execute(
                f"UPDATE {_table(Thread)} SET version = %s, active_run_id = %s "
                "WHERE id = %s AND version = %s",
                [w.seq, w.active_run_id, w.thread_id, w.expected],
            )
            if cursor.rowcount != 1:
                return False
        if w.run_insert is not None:
            _insert_each(cursor, [w.run_insert])
        elif w.run_update is not None and not _update_run_each(cursor, w):
            transaction.set_rollback(True, using=db.alias())
            return False
        _insert_each(cursor, [w.log, *w.messages, *w.reconciliations])
        _insert_each(cursor, w.calls, upsert=CALL_PROGRESS)
        for close in w.ticket_closes:
            values = dict(close)
            _update_each(cursor, Ticket, values, "id = %s", [values.pop("id")])
        _insert_each(cursor, w.ticket_opens)
        if w.outbox:
            _insert_each(cursor, _fan_out(w.outbox))
        if w.clear_checkpoint:
            cursor.execute(f"DELETE FROM {_table(StreamCheckpoint)} WHERE run_id = %s", [w.run_id])
    return True


def _update_run_each(cursor: Any, w: _Writes) -> bool:
    assert w.run_update is not None
    fields = dict(w.run_update)
    where = "id = %s AND version = %s"
    params: list[Any] = [w.run_id, w.run_version]
    if w.lease is not None:  # fence: only the lease holder of this epoch may write
        where += " AND lease_owner = %s AND lease_epoch = %s"
        params += [w.lease.worker_id, w.lease.epoch]
        fields.setdefault("lease_expires_at", timezone.now() + w.lease.ttl)  # and a heartbeat
    if w.unleased:
        where += " AND (lease_expires_at IS NULL OR lease_expires_at <= %s)"
        expires = _fields_by_name(Run)["lease_expires_at"]
        params.append(expires.get_db_prep_value(timezone.now(), db.wrapper()))
    return _update_each(cursor, Run, fields, where, params) == 1


def _update_each(
    cursor: Any, model: type[models.Model], values: dict[str, Any], where: str, params: list
) -> int:
    fields = _fields_by_name(model)
    sets = ", ".join(f"{db.connection.ops.quote_name(_column(fields[n]))} = %s" for n in values)
    prepared = [fields[n].get_db_prep_save(v, db.wrapper()) for n, v in values.items()]
    cursor.execute(f"UPDATE {_table(model)} SET {sets} WHERE {where}", prepared + params)
    return cursor.rowcount


def _insert_each(cursor: Any, rows: Sequence[_Row], *, upsert: tuple[str, ...] = ()) -> None:
    """Insert ``rows``, each model's in one ``executemany``; ``upsert`` names the columns an
    existing row (same id) takes from the new one."""
    by_model: dict[type[models.Model], list[_Row]] = {}
    for row in rows:
        by_model.setdefault(row.model, []).append(row)
    for model, same in by_model.items():
        fields = _fields(model)
        sql = (
            f"INSERT INTO {_table(model)} ({_names(_columns(model))}) "
            f"VALUES ({', '.join(['%s'] * len(fields))})"
        )
        if upsert:
            sql += f" {_upsert_sql(model, upsert)}"
        cursor.executemany(
            sql,
            [
                [f.get_db_prep_save(row.values[f.attname], db.wrapper()) for f in fields]
                for row in same
            ],
        )


# -- the PostgreSQL writer: one statement ---------------------------------------------------


def _write_postgres(w: _Writes) -> bool:
    """Write ``w`` in one statement; False when the thread moved (nothing was written).

    Raises IntegrityError (``commit_disposition_needs_run``) when the head moved but the run
    did not match (moved, or fenced): the statement, and so every part of it, is undone.
    """
    parts, params = _statement(w)
    with db.connection.cursor() as cursor:
        cursor.execute(parts, params)
        moved = cursor.fetchone()[0]
    return bool(moved)


def _statement(w: _Writes) -> tuple[str, dict[str, Any]]:
    thread, run, commit_t = (_table(m) for m in (Thread, Run, ThreadCommit))
    params: dict[str, Any] = {
        "thread": w.thread_id,
        "expected": w.expected,
        "seq": w.seq,
        "active": w.active_run_id,
        "run_id": w.run_id,
        "log": json.dumps(_rows([w.log])[0]),
    }
    if w.lease is not None:
        params.update(owner=w.lease.worker_id, epoch=w.lease.epoch, ttl=w.lease.ttl.total_seconds())
    if w.create_thread:
        params["now"] = w.log.values["created_at"]
        head = (
            f"INSERT INTO {thread} (id, version, active_run_id, metadata, created_at) "
            "VALUES (%(thread)s, %(seq)s, %(active)s, '{}'::jsonb, %(now)s) RETURNING id"
        )
    else:
        head = (
            f"UPDATE {thread} SET version = %(seq)s, active_run_id = %(active)s "
            "WHERE id = %(thread)s AND version = %(expected)s RETURNING id"
        )
    ctes = [f"head AS ({head})"]
    if w.run_insert is not None:
        params["run"] = json.dumps(_rows([w.run_insert])[0])
        ctes.append(f"run_row AS ({_insert_sql(Run, 'run', source='head')} RETURNING id)")
    elif w.run_update is not None:
        params["run"] = json.dumps(_column_values(Run, w.run_update))
        params["run_version"] = w.run_version
        ctes.append(f"run_row AS ({_update_run_sql(w)})")
    else:
        ctes.append("run_row AS (SELECT NULL::varchar AS id WHERE false)")
    log_columns = tuple(c for c in _columns(ThreadCommit) if c != "run_id")
    ctes.append(
        f"log AS (INSERT INTO {commit_t} ({_names(log_columns)}, run_id) "
        f"SELECT {_names(log_columns, 'x')}, (SELECT id FROM run_row) "
        f"FROM head, jsonb_populate_record(NULL::{commit_t}, %(log)s::jsonb) AS x)"
    )
    for name, model, rows, extra in (
        ("messages", MessageRecord, w.messages, ""),
        ("calls", ToolCallRecord, w.calls, _upsert_sql(ToolCallRecord, CALL_PROGRESS)),
        ("recs", ReconciliationRecord, w.reconciliations, ""),
        ("ticket_open", Ticket, w.ticket_opens, ""),
    ):
        if rows:
            params[name] = json.dumps(_rows(rows))
            ctes.append(f"{name} AS ({_insert_sql(model, name, many=True)} {extra})")
    if w.ticket_closes:
        params["ticket_close"] = json.dumps(
            [{"id": c["id"], **_column_values(Ticket, c)} for c in w.ticket_closes]
        )
        ctes.append(f"ticket_close AS ({_close_ticket_sql()})")
    if w.outbox:
        params["outbox"] = json.dumps(_rows(w.outbox))
        ctes.append(f"outbox AS ({_outbox_sql()})")
    if w.clear_checkpoint:
        ctes.append(
            f"checkpoint AS (DELETE FROM {_table(StreamCheckpoint)} USING head "
            "WHERE run_id = %(run_id)s)"
        )
    final = "SELECT (SELECT count(*) FROM head)"
    if w.notify or w.paused:  # delivered by PostgreSQL only when the transaction commits
        params["channel"] = WAKE_CHANNEL
        params["wake"] = (PAUSED_PREFIX if w.paused else "") + str(w.run_id)
        ctes.append("wake AS (SELECT pg_notify(%(channel)s, %(wake)s) FROM head)")
        final += ", (SELECT count(*) FROM wake)"  # a plain CTE runs only when it is read
    return "WITH " + ",\n".join(ctes) + "\n" + final, params


def _update_run_sql(w: _Writes) -> str:
    assert w.run_update is not None
    columns = tuple(_column_values(Run, w.run_update))
    return _run_update_sql(columns, w.lease is not None, w.unleased)


@cache
def _run_update_sql(columns: tuple[str, ...], fenced: bool, unleased: bool) -> str:
    run = _table(Run)
    fence = renew = ""
    if fenced:
        fence = " AND r.lease_owner = %(owner)s AND r.lease_epoch = %(epoch)s"
        if "lease_expires_at" not in columns:  # a commit is also a heartbeat, on the db clock
            renew = ", lease_expires_at = now() + make_interval(secs => %(ttl)s)"
    if unleased:
        fence += " AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= now())"
    return (
        f"UPDATE {run} AS r SET ({_names(columns)}) = "
        f"(SELECT {_names(columns, 'x')} FROM jsonb_populate_record(NULL::{run}, %(run)s::jsonb)"
        f" AS x){renew} FROM head WHERE r.id = %(run_id)s AND r.version = %(run_version)s{fence}"
        " RETURNING r.id"
    )


@cache
def _outbox_sql() -> str:
    """Insert the outbox rows of ``%(outbox)s`` once per enabled endpoint subscribed to their
    kind, after the head moved (a data-modifying CTE runs whether or not it is read)."""
    table, endpoint = _table(WebhookDelivery), _table(WebhookEndpoint)
    columns = _columns(WebhookDelivery)
    values = ", ".join(
        "e.id" if c == "endpoint_id" else f"x.{db.connection.ops.quote_name(c)}" for c in columns
    )
    return (
        f"INSERT INTO {table} ({_names(columns)}) SELECT {values} "
        f"FROM head, jsonb_populate_recordset(NULL::{table}, %(outbox)s::jsonb) AS x "
        f"JOIN {endpoint} AS e ON e.enabled AND e.events @> jsonb_build_array(x.kind)"
    )


@cache
def _close_ticket_sql() -> str:
    ticket = _table(Ticket)
    columns = ("state", "decision", "closed_seq", "closed_at", "closed_by")
    return (
        f"UPDATE {ticket} AS t SET ({_names(columns)}) = ({_names(columns, 'x')}) "
        f"FROM head, jsonb_populate_recordset(NULL::{ticket}, %(ticket_close)s::jsonb) AS x "
        "WHERE t.id = x.id"
    )


def _column(field: models.Field[Any, Any]) -> str:
    assert field.column is not None  # a concrete field has a column
    return field.column


@cache
def _table(model: type[models.Model]) -> str:
    return db.connection.ops.quote_name(model._meta.db_table)


@cache
def _names(columns: tuple[str, ...], alias: str | None = None) -> str:
    quote = db.connection.ops.quote_name
    return ", ".join(f"{alias}.{quote(c)}" if alias else quote(c) for c in columns)


@cache
def _fields(model: type[models.Model]) -> tuple[models.Field, ...]:
    """The fields an insert writes: every concrete field but an auto-incremented key."""
    return tuple(f for f in model._meta.concrete_fields if not isinstance(f, models.AutoField))


@cache
def _columns(model: type[models.Model]) -> tuple[str, ...]:
    return tuple(_column(f) for f in _fields(model))


@cache
def _fields_by_name(model: type[models.Model]) -> dict[str, models.Field]:
    return {f.name: f for f in model._meta.concrete_fields}


@cache
def _insert_sql(model: type[models.Model], param: str, *, source: str = "", many: bool = False):
    """``INSERT ... SELECT`` of the rows in the jsonb parameter ``param``, typed by the table's
    own row type, after the head moved."""
    table = _table(model)
    columns = _columns(model)
    rows = (
        f"jsonb_populate_recordset(NULL::{table}, %({param})s::jsonb)"
        if many
        else f"jsonb_populate_record(NULL::{table}, %({param})s::jsonb)"
    )
    return (
        f"INSERT INTO {table} ({_names(columns)}) SELECT {_names(columns, 'x')} "
        f"FROM head, {rows} AS x"
    )


@cache
def _upsert_sql(model: type[models.Model], update: tuple[str, ...]) -> str:
    quote = db.connection.ops.quote_name
    sets = ", ".join(f"{quote(c)} = EXCLUDED.{quote(c)}" for c in update)
    return f"ON CONFLICT (id) DO UPDATE SET {sets}"


@cache
def _converters(model: type[models.Model]) -> tuple[tuple[str, str, Callable[[Any], Any]], ...]:
    """(attname, column, to a database value) of every field an insert writes."""
    return tuple((f.attname, _column(f), f.get_prep_value) for f in _fields(model))


def _rows(rows: Sequence[_Row]) -> list[dict[str, Any]]:
    """Column values of ``rows``, as JSON the table's row type reads back."""
    return [
        {column: _json_value(prep(row.values[attname])) for attname, column, prep in converters}
        for row in rows
        for converters in (_converters(row.model),)
    ]


def _column_values(model: type[models.Model], values: dict[str, Any]) -> dict[str, Any]:
    fields = _fields_by_name(model)
    return {
        _column(fields[name]): _json_value(fields[name].get_prep_value(value))
        for name, value in values.items()
        if name != "id"
    }


def _json_value(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


# -- reads for surfaces ----------------------------------------------------------------------------


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
