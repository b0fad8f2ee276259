"""The log checker: fold each thread's commit log and compare it with the projections.

The log is the authority (DESIGN.md, "The commit log"): folding a thread's ThreadCommit rows
from the start with ``domain.commit.fold`` must reproduce its Thread, Run, ToolCallRecord,
Ticket, MessageRecord and ReconciliationRecord rows exactly. ``check`` returns every difference
as a Violation; an empty list means the projections say what the log says. The log's own
invariants (legal transitions of both machines, no Executing -> Requested, nothing after Ended,
one non-Ended run per thread, finalization only when every call is terminal, results published
in call order) are the fold's refusals, reported at the sequence that breaks them; the checker
then stops reading that thread, since nothing after an illegal commit has a defined meaning.
Operational rows (leases, checkpoints, idempotency records, late evidence) are never checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict

from runtime import codec, coordinator, staging
from runtime.agents import get_agent
from runtime.domain.commit import CommitDraft, FoldedThread, fold
from runtime.domain.events import CallResumed, ChildStarted, RunActivated, RunForked
from runtime.domain.model import RunState, RunView, ToolBatch, ToolCall
from runtime.errors import InvalidCommit, NotFound, RuntimeFault, UnknownAgent
from runtime.models import (
    MessageRecord,
    ReconciliationRecord,
    Run,
    Thread,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
)


class ViolationDict(TypedDict):
    thread_id: str
    seq: int
    what: str


@dataclass(frozen=True, slots=True)
class Violation:
    """One difference between the log and the projections, or one illegal commit.

    ``seq`` is the commit that breaks the log, or the commit whose outcome the projection
    should show (a run's or a thread's last commit when no single commit is to blame).
    """

    thread_id: str
    seq: int
    what: str

    def __str__(self) -> str:
        return f"thread={self.thread_id} seq={self.seq} {self.what}"

    def as_dict(self) -> ViolationDict:
        return {"thread_id": self.thread_id, "seq": self.seq, "what": self.what}


def check(thread_id: str | None = None) -> list[Violation]:
    """Check one thread (``thread_id``) or every thread, in id order.

    Returns every Violation found (empty when the log and the projections agree). Raises
    NotFound when ``thread_id`` names no thread.
    """
    if thread_id is not None:
        return check_thread(thread_id)
    return check_each(Thread.objects.order_by("id").values_list("id", flat=True).iterator())


def check_each(thread_ids: Iterable[str]) -> list[Violation]:
    """Check each thread of ``thread_ids`` in turn; return every Violation found.

    A thread deleted since its id was read (a prune, an operator) is skipped: there is
    nothing left to disagree."""
    violations: list[Violation] = []
    for tid in thread_ids:
        try:
            violations.extend(check_thread(tid))
        except NotFound:
            continue
    return violations


def recent_threads(since: datetime) -> list[str]:
    """Ids of the threads with a commit at or after ``since``, in id order.

    Read by the ``commit_created`` index: the cost follows the commits since then, not the
    history (``runtime_fsck --since``)."""
    return list(
        ThreadCommit.objects.filter(created_at__gte=since)
        .order_by("thread_id")
        .values_list("thread_id", flat=True)
        .distinct()
    )


def check_thread(thread_id: str) -> list[Violation]:
    """Fold one thread's log and compare it with the thread's projections."""
    row = Thread.objects.filter(id=thread_id).values("version", "active_run_id").first()
    if row is None:
        raise NotFound(f"thread {thread_id} does not exist")
    log = _Log(thread_id)
    try:
        folded = fold(thread_id, log.drafts())
    except Exception as exc:  # any refusal is the finding; the checker itself keeps going
        return [Violation(thread_id, log.seq, f"log refused: {_describe(exc)}")]
    found = _Findings(thread_id)
    _compare_thread(found, row, folded)
    _compare_runs(found, folded, log)
    _compare_calls(found, folded)
    _compare_tickets(found, folded, log)
    _compare_messages(found, folded)
    _compare_reconciliations(found, folded)
    _compare_forks(found, log)
    return found.violations


def read_log(thread_id: str) -> list[tuple[int, CommitDraft]]:
    """The thread's log as ``(sequence, CommitDraft)`` pairs, oldest first, ready for
    ``fold``. Raises InvalidCommit for a row that does not decode."""
    return list(_Log(thread_id).drafts())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RuntimeFault):
        return f"{exc.code}: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


class _Log:
    """The thread's ThreadCommit rows decoded into CommitDrafts, oldest first.

    While it is read it remembers what the fold does not keep: each run's activation
    (metadata, actor) and the life of every ticket, derived from the commits exactly as the
    coordinator writes them (opened by an Awaiting disposition; consumed by a resume or
    voided by the end of its run).
    """

    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self.seq = 0  # the commit being read; the fold's refusal is about this one
        self.activations: dict[str, tuple[Any, str]] = {}
        self.forks: list[tuple[int, str, RunForked, str]] = []  # (seq, run id, event, actor)
        self.tickets: dict[str, dict[str, Any]] = {}
        self._open: dict[str, set[str]] = {}  # run id -> its open ticket ids

    def drafts(self) -> Iterator[tuple[int, CommitDraft]]:
        rows = (
            ThreadCommit.objects.filter(thread_id=self.thread_id)
            .order_by("seq")
            .values_list("seq", "run_id", "disposition", "messages", "events", "actor")
        )
        for seq, run_id, disposition, messages, events, actor in rows.iterator():
            self.seq = seq
            draft = self._decode(seq, run_id, disposition, messages, events, actor)
            self._remember(seq, draft)
            yield seq, draft

    def _decode(
        self,
        seq: int,
        run_id: str | None,
        disposition: Any,
        messages: Any,
        events: Any,
        actor: str,
    ) -> CommitDraft:
        try:
            return CommitDraft(
                thread_id=self.thread_id,
                run_id=run_id,
                expected_version=seq - 1,
                disposition=codec.load_disposition(disposition),
                messages=tuple(codec.load_message(m) for m in messages),
                events=tuple(codec.load_event(e) for e in events),
                actor=actor,
            )
        except Exception as exc:  # pydantic's ValidationError, an unknown event type, ...
            raise InvalidCommit(
                f"the commit row does not decode ({type(exc).__name__}: {exc})"
            ) from exc

    def _remember(self, seq: int, draft: CommitDraft) -> None:
        run_id = draft.run_id
        if run_id is None:
            return
        for event in draft.events:
            if isinstance(event, RunActivated):
                self.activations[run_id] = (event.metadata, draft.actor)
            if isinstance(event, RunForked):
                self.forks.append((seq, run_id, event, draft.actor))
        disposition = draft.disposition
        open_ids = self._open.setdefault(run_id, set())
        ended = disposition is not None and disposition.state is RunState.ENDED
        for event in draft.events:
            if isinstance(event, CallResumed) and event.ticket_id in open_ids:
                self._close(event.ticket_id, seq, draft, event)
            if isinstance(event, ChildStarted):
                self._open_ticket(event.ticket, seq)
        if ended:
            for ticket_id in sorted(open_ids):
                self._close(ticket_id, seq, draft, None)
        ticket = disposition.ticket if disposition is not None else None
        if ticket is not None and ticket.id not in open_ids:  # or waits on a child's ticket
            self._open_ticket(ticket, seq)

    def _close(
        self, ticket_id: str, seq: int, draft: CommitDraft, resumed: CallResumed | None
    ) -> None:
        self.tickets[ticket_id].update(
            state="consumed" if resumed else "void",
            decision=resumed.decision.value if resumed else "",
            closed_seq=seq,
            closed_by=draft.actor,
        )
        self._open[self.tickets[ticket_id]["run_id"]].discard(ticket_id)

    def _open_ticket(self, ticket: Any, seq: int) -> None:
        self.tickets[ticket.id] = {
            "run_id": ticket.run_id,
            "call_id": ticket.call_id,
            "kind": ticket.kind.value,
            "request": ticket.request,
            "schema": ticket.schema,
            "state": "open",
            "opened_seq": seq,
            "closed_seq": None,
            "decision": "",
            "closed_by": "",
            "due_at": coordinator.ticket_due_at(ticket),
        }
        self._open.setdefault(ticket.run_id, set()).add(ticket.id)


class _Findings:
    def __init__(self, thread_id: str) -> None:
        self.thread_id = thread_id
        self.violations: list[Violation] = []

    def add(self, seq: int, what: str) -> None:
        self.violations.append(Violation(self.thread_id, seq, what))

    def differ(
        self, seq: int, subject: str, actual: Mapping[str, object], expected: dict[str, Any]
    ) -> None:
        """Report each field of ``actual`` that is not what the log says."""
        for name, want in expected.items():
            have = actual.get(name)
            if have != want:
                self.add(seq, f"{subject}: {name} is {have!r}, the log says {want!r}")


def _compare_thread(found: _Findings, row: Mapping[str, Any], folded: FoldedThread) -> None:
    head = folded.head
    found.differ(
        head.version,
        "thread",
        {"version": row["version"], "active_run": row["active_run_id"]},
        {"version": head.version, "active_run": head.active_run_id},
    )


def _compare_runs(found: _Findings, folded: FoldedThread, log: _Log) -> None:
    rows = {
        r["id"]: r
        for r in Run.objects.filter(thread_id=found.thread_id).values(
            "id",
            "agent",
            "state",
            "end_cause",
            "error",
            "version",
            "step",
            "snapshot",
            "metadata",
            "created_by",
            "parent_run_id",
            "parent_call_id",
            "depth",
            "plugin_state",
            "paused",
            "agent_version",
        )
    }
    for run_id, view in folded.runs.items():
        row = rows.pop(run_id, None)
        if row is None:
            found.add(view.version, f"run {run_id}: no Run row for a run the log activates")
            continue
        metadata, actor = log.activations.get(run_id, (None, ""))
        expected = {
            "agent": view.agent,
            "state": view.state.value,
            "end_cause": view.end_cause.value if view.end_cause else None,
            "error": view.error,
            "version": view.version,
            "step": view.step,
            "metadata": metadata or {},
            "created_by": actor,
            "parent_run_id": view.parent_run_id,
            "parent_call_id": view.parent_call_id,
            "depth": view.depth,
            "plugin_state": view.plugin_state,
            "paused": view.pause is not None,
            "agent_version": view.agent_version,
        }
        found.differ(view.version, f"run {run_id}", row, expected)
        snapshot, stored = codec.dump_run(view), row["snapshot"] or {}
        # A key a snapshot written before it existed lacks reads as null (RunView.pause); the
        # agent's version is read from the run's row instead until the next commit writes it
        # (coordinator.read_run), so a snapshot that lacks it is not wrong for that.
        keys = sorted(
            k
            for k in set(snapshot) | set(stored)
            if stored.get(k) != snapshot.get(k) and not (k == "agent_version" and k not in stored)
        )
        if keys:
            found.add(view.version, f"run {run_id}: snapshot differs from the fold at {keys}")
        for problem in _plugin_state_problems(view):
            found.add(view.version, f"run {run_id}: {problem}")
    for run_id in rows:
        found.add(folded.head.version, f"run {run_id}: Run row with no activation in the log")
    live = sorted(
        r.id for r in Run.objects.filter(thread_id=found.thread_id).exclude(state="ended")
    )
    if len(live) > 1:
        found.add(folded.head.version, f"{len(live)} runs are not Ended: {live}")


def _plugin_state_problems(view: RunView) -> list[str]:
    """Committed plugin state must validate against the models its agent's plugins declare."""
    if not view.plugin_state:
        return []
    try:
        plugins = get_agent(view.agent).plugins
    except UnknownAgent:
        return []  # the deployment no longer has the agent: nothing to validate against
    return staging.problems(plugins, view)


def _call_fields(run: RunView, batch: ToolBatch, call: ToolCall) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "step": batch.step,
        "index": call.index,
        "tool_call_id": call.tool_call_id,
        "name": call.name,
        "arguments": call.arguments,
        "arguments_text": call.arguments_text,
        "model_arguments": call.model_arguments,
        "operation_id": call.operation_id,
        "policy": call.policy.value,
        "permission": call.permission.value,
        "max_attempts": call.max_attempts,
        "source": call.source,
        "effects": call.effects.value,
        "phase": call.phase.value,
        "attempt": call.attempt,
        "approved": call.approved,
        "ticket_id": call.ticket_id,
        "result": call.result,
        "is_error": call.is_error,
        "effect_may_have_started": call.effect_may_have_started,
        "batch_finalized": batch.finalized,
    }


CALL_FIELDS = (
    "id",
    "run_id",
    "step",
    "index",
    "tool_call_id",
    "name",
    "arguments",
    "arguments_text",
    "model_arguments",
    "operation_id",
    "policy",
    "permission",
    "max_attempts",
    "source",
    "effects",
    "phase",
    "attempt",
    "approved",
    "ticket_id",
    "result",
    "is_error",
    "effect_may_have_started",
    "batch_finalized",
)


def _compare_calls(found: _Findings, folded: FoldedThread) -> None:
    rows = {
        r["id"]: r
        for r in ToolCallRecord.objects.filter(run__thread_id=found.thread_id).values(*CALL_FIELDS)
    }
    terminal = ("completed", "indeterminate")
    for row in rows.values():
        if row["batch_finalized"] and row["phase"] not in terminal:
            found.add(
                folded.head.version,
                f"call {row['id']}: its batch is finalized but it is {row['phase']}",
            )
    for run in folded.runs.values():
        for batch in run.batches:
            for call in batch.calls:
                row = rows.pop(call.call_id, None)
                if row is None:
                    found.add(run.version, f"call {call.call_id}: no ToolCallRecord row")
                    continue
                found.differ(
                    run.version, f"call {call.call_id}", row, _call_fields(run, batch, call)
                )
    for call_id in rows:
        found.add(folded.head.version, f"call {call_id}: ToolCallRecord row not in the log")


def _compare_tickets(found: _Findings, folded: FoldedThread, log: _Log) -> None:
    rows = {
        r["id"]: r
        for r in Ticket.objects.filter(run__thread_id=found.thread_id).values(
            "id",
            "run_id",
            "call_id",
            "kind",
            "request",
            "schema",
            "state",
            "opened_seq",
            "closed_seq",
            "decision",
            "closed_by",
            "due_at",
        )
    }
    current = {t for run in folded.runs.values() for t in coordinator.open_tickets(run)}
    for ticket_id, expected in log.tickets.items():
        row = rows.pop(ticket_id, None)
        seq = expected["closed_seq"] or expected["opened_seq"]
        if row is None:
            found.add(seq, f"ticket {ticket_id}: no Ticket row")
            continue
        if (row["state"] == "open") != (ticket_id in current):
            run = folded.runs.get(expected["run_id"])
            now = run.ticket.id if run and run.ticket else None
            found.add(
                seq,
                f"ticket {ticket_id}: state is {row['state']!r} but the run's current ticket "
                f"is {now!r}",
            )
            expected = {k: v for k, v in expected.items() if k != "state"}
        found.differ(seq, f"ticket {ticket_id}", row, expected)
    for ticket_id in rows:
        found.add(folded.head.version, f"ticket {ticket_id}: Ticket row not in the log")


def _message_fields(run_id: str | None, message: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "role": message.role,
        "content": message.content,
        "tool_calls": list(message.tool_calls),
        "tool_call_id": message.tool_call_id,
        "name": message.name,
        "meta": message.meta,
    }


def _compare_messages(found: _Findings, folded: FoldedThread) -> None:
    rows = {
        (r["seq"], r["idx"]): r
        for r in MessageRecord.objects.filter(thread_id=found.thread_id).values(
            "seq",
            "idx",
            "run_id",
            "role",
            "content",
            "tool_calls",
            "tool_call_id",
            "name",
            "meta",
        )
    }
    idx: dict[int, int] = {}
    for seq, run_id, message in folded.messages:
        i = idx[seq] = idx.get(seq, -1) + 1
        row = rows.pop((seq, i), None)
        if row is None:
            found.add(seq, f"message {i}: no MessageRecord row")
            continue
        found.differ(seq, f"message {i}", row, _message_fields(run_id, message))
    for seq, i in sorted(rows):
        found.add(seq, f"message {i}: MessageRecord row not in the log")


def _compare_reconciliations(found: _Findings, folded: FoldedThread) -> None:
    def key(seq: int, call_id: str, outcome: str, evidence: str, actor: str) -> tuple:
        return (seq, call_id, outcome, evidence, actor)

    rows = _multiset(
        key(*r)
        for r in ReconciliationRecord.objects.filter(thread_id=found.thread_id).values_list(
            "seq", "call_id", "outcome", "evidence", "actor"
        )
    )
    expected = _multiset(
        key(seq, r.call_id, r.outcome, r.evidence, r.actor) for seq, r in folded.reconciliations
    )
    for item, count in sorted(expected.items()):
        if rows.get(item, 0) < count:
            found.add(item[0], f"reconciliation of call {item[1]} ({item[2]}): no row")
    for item, count in sorted(rows.items()):
        if expected.get(item, 0) < count:
            found.add(item[0], f"reconciliation of call {item[1]} ({item[2]}): row not in the log")


def _compare_forks(found: _Findings, log: _Log) -> None:
    """A fork's copied prefix must be exactly what ``runtime.fork`` makes of its source's
    commits 1..``source_seq`` (recomputed here). A source that no longer exists (pruned) or
    whose thread no longer holds that prefix leaves nothing to compare but is said when the
    fork point disagrees with what is left of it."""
    from runtime import fork

    for seq, run_id, event, actor in log.forks:
        if seq != event.source_seq + 1:
            found.add(
                seq, f"fork point at commit {seq} follows {seq - 1} copies, not {event.source_seq}"
            )
            continue
        try:
            source = fork.prefix(event.source_run_id, event.at_step)
        except (NotFound, RuntimeFault):
            if Run.objects.filter(id=event.source_run_id).exists():
                found.add(
                    seq,
                    f"fork point: step {event.at_step} of run "
                    f"{event.source_run_id} does not end at a commit",
                )
            continue  # the source was pruned: its copy is all that is left
        if (source.thread_id, source.seq) != (event.source_thread_id, event.source_seq):
            found.add(
                seq,
                f"fork point names commits 1..{event.source_seq} of thread "
                f"{event.source_thread_id}, but step {event.at_step} of run "
                f"{event.source_run_id} ends at commit {source.seq} of {source.thread_id}",
            )
            continue
        ids = fork.mapping(source, run_id)
        copies: dict[int, dict[str, Any]] = {
            row["seq"]: dict(row)
            for row in ThreadCommit.objects.filter(
                thread_id=found.thread_id, seq__lte=source.seq
            ).values("seq", "run_id", "disposition", "messages", "events", "actor", "agent_version")
        }
        for row in source.rows:
            expected = fork.expected_copy(source, row, run_id, actor, ids)
            copied = copies.get(row.seq, {})
            differ = sorted(k for k in expected if copied.get(k) != expected[k])
            if differ:
                found.add(
                    row.seq,
                    f"commit {row.seq} is not the copy of commit {row.seq} of thread "
                    f"{source.thread_id} (run {source.run_id}): differs at {differ}",
                )


def _multiset(items: Iterable[tuple]) -> dict[tuple, int]:
    counts: dict[tuple, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts
