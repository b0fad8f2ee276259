"""Fork a run from a step: a new run on a new thread whose committed history is the source's
up to the end of that step, with nothing executed again; the source is never changed.

The fork's thread starts with copies of the source thread's commits 1..S, where S is the
commit that ends Step ``at_step`` of the source run (its batch's publication, or its answer
when the step had no tool calls). Every copy is written through the coordinator's public
``commit`` and validated by the same rules as any commit; sequence numbers stay the same.
A copy differs from its original only in:

- ids: run ids, call ids, operation ids and ticket ids are new, derived from the fork's run
  id and the old id (``uuid5``), so the copy is reproducible (``expected_copy``) and no
  downstream system sees an operation id twice; an operation id inside a text (a sealed
  call's result, a tool's output) is replaced too, so the copy's history is consistent with
  itself; the model's tool-use ids and child runs' ids are kept;
- each copied call's ``source`` names the call it copies (``copied_from``: run, call and
  operation id): it never runs, and it is never handed to a person for reconciliation (its
  original is: ``inventory.unreconciled_calls``);
- activations: the source run's copy becomes the fork run, with ``metadata.forked_from``
  ({"run_id", "thread_id", "step", "seq"}); a copy of an earlier run of the thread gets
  ``metadata.copied_from``; neither is anyone's child (no delivery to a parent);
- the last copy, when the original ended the run, keeps the run Running.

Then one more commit, the fork point, carries ``RunForked`` and the optional new input (user
messages), and leaves the run Running for a worker to ask the model for Step ``at_step + 1``.
The source links to its forks by their ``metadata.forked_from.run_id``. Copied commits keep
their original times. ``runtime.fsck`` recomputes every copy from the source's log while the
source thread exists and reports any difference.
"""

from __future__ import annotations

import copy
import re
import uuid
from dataclasses import dataclass
from typing import Any

from runtime import codec, db, tracing
from runtime.coordinator import commit
from runtime.domain.commit import CommitDraft
from runtime.domain.events import RunForked
from runtime.domain.model import Disposition, Message
from runtime.errors import ForkRefused, InvalidCommit, NotFound
from runtime.models import Run, Thread, ThreadCommit, Ticket, new_id
from runtime.untrusted import UntrustedJSONError, check_storable, is_id

NAMESPACE = uuid.UUID("6f1c3a52-2f7e-4d0b-9c1f-0c2d0a7f6b11")  # ids of copies (uuid5)
REMAPPED_KEYS = frozenset({"run_id", "call_id", "operation_id", "ticket_id", "id"})


@dataclass(frozen=True, slots=True)
class Prefix:
    """What a fork copies: the source thread's commits 1..``seq`` (``rows``), which end Step
    ``step`` of ``run_id``."""

    run_id: str
    thread_id: str
    step: int
    seq: int
    rows: list[ThreadCommit]


def _ends_step(row: ThreadCommit, run_id: str, step: int) -> bool:
    """Whether ``row`` is the commit that ends Step ``step`` of ``run_id``."""
    if row.run_id != run_id:
        return False
    kinds = {(e.get("type"), e.get("step")) for e in row.events}
    if ("BatchFinalized", step) in kinds:
        return True
    return ("StepCommitted", step) in kinds and not any(
        e.get("type") == "BatchOpened" for e in row.events
    )


def prefix(run_id: str, at_step: int) -> Prefix:
    """The commits a fork of ``run_id`` at ``at_step`` copies.

    Raises NotFound for an unknown run, ForkRefused when the run has no such step, the
    step has not finished (its batch is still open), or the step ended with the run while
    it awaited a ticket (a cancel).
    """
    if not is_id(run_id):
        raise NotFound(f"run {run_id!r} does not exist")
    run = Run.objects.filter(id=run_id).values("thread_id", "step").first()
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    if not 1 <= at_step <= run["step"]:
        raise ForkRefused(
            f"run {run_id} has no step {at_step}: it has committed {run['step']} step(s)",
            at_step=at_step,
            steps=run["step"],
        )
    rows = list(ThreadCommit.objects.filter(thread_id=run["thread_id"]).order_by("seq"))
    end = next((r for r in rows if _ends_step(r, run_id, at_step)), None)
    if end is None:
        raise ForkRefused(
            f"step {at_step} of run {run_id} has not finished: its tool batch is still open",
            at_step=at_step,
        )
    kept = [r for r in rows if r.seq <= end.seq]
    _refuse_an_end_while_awaiting(kept, run_id, at_step)
    return Prefix(run_id, run["thread_id"], at_step, end.seq, kept)


def _refuse_an_end_while_awaiting(rows: list[ThreadCommit], run_id: str, at_step: int) -> None:
    """Raise ForkRefused when the commit that ends the step (``rows[-1]``) ended the run
    while it awaited a ticket (a cancel): its copy must keep the fork running, and a run
    leaves Awaiting only by a resume (domain.commit), so no fork goes on from there."""
    end = rows[-1]
    ended = end.disposition or {}
    before = next((r.disposition for r in reversed(rows[:-1]) if r.run_id == run_id), None)
    if ended.get("state") == "ended" and (before or {}).get("state") == "awaiting":
        raise ForkRefused(
            f"step {at_step} of run {run_id} ended when the run was "
            f"{ended.get('end_cause') or 'ended'} while it awaited a ticket; a fork goes on "
            "only after a step the run finished running: fork after an earlier step",
            at_step=at_step,
        )


def copied_id(fork_run_id: str, old: str) -> str:
    """The id a copy gives ``old`` in the fork ``fork_run_id`` (same shape: "op_" kept)."""
    fresh = uuid.uuid5(NAMESPACE, f"{fork_run_id}:{old}").hex
    return f"op_{fresh}" if old.startswith("op_") else fresh


def _ids(rows: list[ThreadCommit]) -> set[str]:
    """Every run, call, operation and ticket id the rows' events and dispositions name."""
    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in REMAPPED_KEYS and isinstance(item, str):
                    if item:  # "": no id (a pause ticket names no call)
                        found.add(item)
                else:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for row in rows:
        walk(row.events)
        walk(row.disposition)
        if row.run_id:
            found.add(row.run_id)
    return found


def _remap(value: Any, ids: dict[str, str]) -> Any:
    if isinstance(value, dict):
        return {
            k: ids.get(v, v) if k in REMAPPED_KEYS and isinstance(v, str) else _remap(v, ids)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_remap(v, ids) for v in value]
    return value


def _operation_ids(rows: list[ThreadCommit]) -> set[str]:
    return {
        c["operation_id"]
        for row in rows
        for e in row.events
        if e.get("type") == "BatchOpened"
        for c in e["calls"]
    }


def _retext(value: Any, pattern: re.Pattern[str] | None, ids: dict[str, str]) -> Any:
    """``value`` with every operation id inside its texts replaced by its copy's: a sealed
    call's published result names its operation id, and the fold writes the copy's."""
    if pattern is None:
        return value
    if isinstance(value, str):
        return pattern.sub(lambda m: ids[m.group(0)], value)
    if isinstance(value, dict):  # ``copied_from`` names the originals on purpose
        return {k: v if k == "copied_from" else _retext(v, pattern, ids) for k, v in value.items()}
    if isinstance(value, list):
        return [_retext(v, pattern, ids) for v in value]
    return value


def mapping(source: Prefix, fork_run_id: str) -> dict[str, str]:
    """Old id -> new id for every id the copied commits name (the source run -> the fork)."""
    ids = {old: copied_id(fork_run_id, old) for old in _ids(source.rows)}
    ids[source.run_id] = fork_run_id
    return ids


def expected_copy(
    source: Prefix,
    row: ThreadCommit,
    fork_run_id: str,
    actor: str,
    ids: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The fork's copy of the source commit ``row``: {"run_id", "disposition", "messages",
    "events", "actor"} as stored (JSON). ``actor`` is who forked (``forked_from.by``); ``ids``
    is ``mapping(source, fork_run_id)`` when the caller has it. One function builds the
    copies and checks them (runtime.fsck)."""
    ids = ids if ids is not None else mapping(source, fork_run_id)
    old_of = {new: old for old, new in ids.items()}
    operations = sorted(_operation_ids(source.rows), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, operations))) if operations else None
    events = []
    for event in _remap(copy.deepcopy(row.events), ids):
        kind = event.get("type")
        if kind == "RunActivated":
            old = old_of[event["run_id"]]
            metadata = dict(event.get("metadata") or {})
            if old == source.run_id:
                metadata["forked_from"] = {
                    "run_id": source.run_id,
                    "thread_id": source.thread_id,
                    "step": source.step,
                    "seq": source.seq,
                    "by": actor,
                }
            else:
                metadata["copied_from"] = {"run_id": old, "fork_run_id": fork_run_id}
            event.update(metadata=metadata, parent_run_id=None, parent_call_id=None, depth=0)
        elif kind == "BatchOpened":
            for call in event["calls"]:
                call["source"] = {
                    **(call.get("source") or {"kind": "python"}),
                    "copied_from": {
                        "run_id": row.run_id,
                        "call_id": old_of[call["call_id"]],
                        "operation_id": old_of[call["operation_id"]],
                    },
                }
        events.append(event)
    disposition = _remap(copy.deepcopy(row.disposition), ids)
    if row.seq == source.seq and disposition and disposition.get("state") == "ended":
        disposition = codec.dump_disposition(Disposition.running())
    return {
        "run_id": ids.get(row.run_id, row.run_id) if row.run_id else None,
        "disposition": disposition,
        "messages": _retext(copy.deepcopy(row.messages), pattern, ids),
        "events": _retext(events, pattern, ids),
        "actor": row.actor,
        "agent_version": row.agent_version,
    }


def _draft(thread_id: str, seq: int, stored: dict[str, Any]) -> CommitDraft:
    return CommitDraft(
        thread_id=thread_id,
        run_id=stored["run_id"],
        expected_version=seq - 1,
        disposition=codec.load_disposition(stored["disposition"]),
        messages=tuple(codec.load_message(m) for m in stored["messages"]),
        events=tuple(codec.load_event(e) for e in stored["events"]),
        actor=stored["actor"],
        agent_version=stored["agent_version"],
    )


def _inputs(input: str | list[dict[str, Any]] | None) -> tuple[Message, ...]:
    if input is None:
        return ()
    if isinstance(input, str):
        return (Message(role="user", content=input),) if input.strip() else ()
    messages = []
    for item in input:
        role, content = item.get("role", "user"), item.get("content")
        if role not in ("user", "system") or not isinstance(content, str):
            raise InvalidCommit("input messages are {role: user|system, content: text}")
        messages.append(Message(role=role, content=content))
    return tuple(messages)


def fork_run(
    run_id: str, *, at_step: int, input: str | list[dict[str, Any]] | None = None, actor: str = ""
) -> str:
    """Fork ``run_id`` after Step ``at_step``; return the new run's id (on a new thread).

    ``input`` (a text or a list of {"role": "user" | "system", "content"}) is added after the
    copied history, in the fork point's commit. All of it is one transaction: the fork exists
    whole or not at all. Raises NotFound, ForkRefused (no such step, it has not finished,
    or it ended with the run while it awaited) and InvalidCommit (input that no database
    stores, or malformed).
    """
    try:
        check_storable(input, "the input")
    except UntrustedJSONError as exc:
        raise InvalidCommit(str(exc)) from None
    messages = _inputs(input)
    fork_id = uuid.uuid4().hex
    thread_id = new_id()
    with db.atomic():
        source = prefix(run_id, at_step)  # read inside: the prefix cannot change under it
        times = {row.seq: row.created_at for row in source.rows}
        ids = mapping(source, fork_id)
        for row in source.rows:
            stored = expected_copy(source, row, fork_id, actor, ids)
            commit(_draft(thread_id, row.seq, stored), new_thread=row.seq == 1)
        commit(
            CommitDraft(
                thread_id=thread_id,
                run_id=fork_id,
                expected_version=source.seq,
                disposition=Disposition.running(),
                messages=messages,
                events=(
                    RunForked(
                        source_run_id=run_id,
                        source_thread_id=source.thread_id,
                        at_step=at_step,
                        source_seq=source.seq,
                    ),
                ),
                actor=actor,
            )
        )
        _keep_times(thread_id, source, times)
    tracing.request_linked("fork", fork_id, actor=actor)
    return fork_id


def _keep_times(thread_id: str, source: Prefix, times: dict[int, Any]) -> None:
    """Copied commits keep their original times (operational stamps: the coordinator wrote
    "now"); the fork run itself was created now, and copies of earlier runs when they were."""
    for row in ThreadCommit.objects.filter(thread_id=thread_id, seq__lte=source.seq):
        ThreadCommit.objects.filter(pk=row.pk).update(created_at=times[row.seq])
    for ticket in Ticket.objects.filter(run__thread_id=thread_id):
        Ticket.objects.filter(pk=ticket.pk).update(
            created_at=times[ticket.opened_seq],
            closed_at=times.get(ticket.closed_seq) if ticket.closed_seq else None,
        )
    Thread.objects.filter(id=thread_id).update(
        metadata={"forked_from": {"run_id": source.run_id, "thread_id": source.thread_id}}
    )
