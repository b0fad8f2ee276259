"""The Python API every surface calls to change a run: start, resume, pause, cancel, reconcile.

The console, the JSON API and the management commands call these and nothing else, so each
rule lives once. Every write goes through the commit coordinator. A refused command raises a
typed RuntimeFault and writes nothing. Repeats with the same idempotency key get the first
answer and write nothing (DESIGN.md, "Repeats are answered, not re-applied").
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from django.db import IntegrityError
from django.utils import timezone

from runtime import codec, conf, db, tracing
from runtime.agents import get_agent
from runtime.commits import commit
from runtime.coordinator import Committed, read_frontier, read_head, read_run
from runtime.crash import crash_point
from runtime.delegation import child_run_id
from runtime.documents import run_document
from runtime.domain.commit import (
    PAUSE_REASON_MAX,
    CommitDraft,
    check_operator_resume,
    end_cause_reason,
    ending,
    stage,
)
from runtime.domain.delegation import ChildLink, settle
from runtime.domain.events import (
    CallResumed,
    ChildStarted,
    Event,
    ReconciliationRecorded,
    RunActivated,
    RunMoved,
    RunPaused,
    RunResumed,
)
from runtime.domain.model import (
    Decision,
    Disposition,
    EndCause,
    Message,
    ResumeCommand,
    ResumeTicket,
    RunState,
    RunView,
    TicketKind,
    ToolCall,
)
from runtime.errors import (
    AlreadyPaused,
    CommittedUnread,
    IdempotencyKeyReused,
    InvalidCommit,
    InvalidInput,
    MoveRefused,
    NotFound,
    NotPaused,
    ReconciliationContradicts,
    RunEnded,
    RuntimeFault,
    ScriptRefused,
    TicketConsumed,
    VersionConflict,
)
from runtime.hooks import has_hook
from runtime.models import (
    CommandRecord,
    ReconciliationRecord,
    Run,
    StartRecord,
    Thread,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
    new_id,
)
from runtime.providers.scripted import parse_script
from runtime.tools import Tool, ToolArgumentsError
from runtime.untrusted import UntrustedJSONError, answer_problem, check_storable, is_id

CONFLICT_RETRIES = 5  # a command re-reads and re-decides when a worker commits first
VERSION_MAX = 100  # the length of Run.agent_version and ThreadCommit.agent_version

log = logging.getLogger("runtime.operations")


def _storable(value: Any, what: str) -> None:
    """Refuse what no database stores (NUL, lone surrogates, NaN, nesting over 32 levels)
    before anything is written: InvalidCommit, whichever surface sent it."""
    try:
        check_storable(value, what)
    except UntrustedJSONError as exc:
        raise InvalidCommit(str(exc)) from None


def _require_id(value: str | None, what: str) -> None:
    """An id the runtime never issued names nothing: NotFound, before any query."""
    if value is not None and not is_id(value):
        raise NotFound(f"{what} {value!r} does not exist")


def _messages_from_input(input: str | list[dict[str, Any]]) -> tuple[Message, ...]:
    if isinstance(input, str):
        if not input.strip():
            raise InvalidCommit("the input is empty")
        return (Message(role="user", content=input),)
    messages = []
    for item in input:
        role, content = item.get("role", "user"), item.get("content")
        if role not in ("user", "system") or not isinstance(content, str):
            raise InvalidCommit("input messages are {role: user|system, content: text}")
        messages.append(Message(role=role, content=content))
    if not messages:
        raise InvalidCommit("the input has no messages")
    return tuple(messages)


def start_run(
    *,
    agent: str,
    input: str | list[dict[str, Any]],
    metadata: dict[str, Any] | None = None,
    thread_id: str | None = None,
    actor: str = "",
    child: ChildLink | None = None,
    idempotency_key: str | None = None,
) -> str:
    """Start a run of ``agent`` on a new thread, or on ``thread_id``; return the run id.

    ``child`` makes it the child Run of a delegate call (its id and parent are recorded in
    the activation).

    ``idempotency_key`` (1 to 200 characters, scoped to ``actor``): the run and its key are
    recorded in one transaction (``_started_once``); the same key with the same agent,
    input, metadata and thread returns the run it started and starts nothing.

    ``metadata["script"]`` (a scripted model script) is accepted only when scripted runs are
    enabled. Raises UnknownAgent (with the known names), ScriptRefused, InvalidCommit for
    empty or malformed input or key, NotFound for an unknown thread, RunAlreadyActive when
    the thread has a run that has not ended, IdempotencyKeyReused when the key started a run
    with another request.
    """
    if idempotency_key is not None:
        request = {
            "start": agent,
            "input": input,
            "metadata": metadata or {},
            "thread_id": thread_id,
        }
        return _started_once(
            actor,
            idempotency_key,
            request,
            lambda: start_run(
                agent=agent, input=input, metadata=metadata, thread_id=thread_id, actor=actor
            ),
        )
    definition = get_agent(agent)
    plugins = definition.plugins
    metadata = dict(metadata or {})
    _storable(metadata, "metadata")
    _storable(input, "the input")
    _require_id(thread_id, "thread")
    if "script" in metadata:
        if not conf.allow_scripted():
            raise ScriptRefused("scripted runs are disabled (RUNTIME_ALLOW_SCRIPTED)")
        # A step_end hook may go on after a text-only answer (runtime.hooks).
        parse_script(metadata["script"], text_ends_run=not has_hook(plugins, "step_end"))
    messages = _messages_from_input(input)
    run_id = child.run_id if child else uuid.uuid4().hex
    parent = (
        {"parent_run_id": child.parent_run_id, "parent_call_id": child.parent_call_id}
        if child
        else {}
    )
    new_thread = thread_id is None
    activation = RunActivated(
        run_id=run_id,
        agent=agent,
        metadata=metadata,
        depth=child.depth if child else 0,
        agent_version=definition.deployed_version,
        **parent,
    )
    draft = CommitDraft(
        thread_id=new_id() if thread_id is None else thread_id,
        run_id=run_id,
        expected_version=0,
        disposition=Disposition.running(),
        messages=messages,
        events=(activation,),
        actor=actor,
    )
    if new_thread:  # the thread comes into being with its first commit, in one write
        commit(draft, new_thread=True)
        tracing.request_linked("start", run_id, actor=actor)
        return run_id
    for attempt in range(CONFLICT_RETRIES):  # a racing start makes the next try see its run
        head, _ = read_frontier(draft.thread_id, None)
        try:
            commit(replace(draft, expected_version=head.version), head=head, before=None)
            break
        except VersionConflict:
            if attempt == CONFLICT_RETRIES - 1:
                raise
    tracing.request_linked("start", run_id, actor=actor)
    return run_id


def create_thread(*, metadata: dict[str, Any] | None = None) -> str:
    """Create an empty thread (no commit yet: its version is 0); return its id."""
    return Thread.objects.create(metadata=dict(metadata or {})).id


def _committed_run(run_id: str) -> RunView:
    run = read_run(run_id)
    if run is None:
        raise NotFound(f"run {run_id} does not exist")
    return run


def _request_hash(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _started_once(actor: str, key: str, request: dict[str, Any], create: Callable[[], str]) -> str:
    """Run ``create`` (a start or a fork: it returns the new run's id) once per ``actor`` and
    idempotency ``key``; a repeat with the same ``request`` returns the run it created.

    The StartRecord is written in the transaction that creates the run, so "the key is
    recorded" holds exactly when "the run exists": a client that lost the answer (a 503 after
    the commit) and sends the request again with the key gets the committed run, never a
    second one; one whose start did not commit starts it now. A twin sent at the same time
    (PostgreSQL) waits on the first one's record, has its own run undone with its failed
    insert, and returns the first one's run. Raises InvalidCommit for a key out of bounds,
    IdempotencyKeyReused when the key created a run with another request, and what
    ``create`` raises (nothing is recorded then).
    """
    if not 0 < len(key) <= 200:
        raise InvalidCommit("an idempotency key has 1 to 200 characters")
    digest = _request_hash(request)

    def first_run() -> str | None:
        record = StartRecord.objects.filter(actor=actor, key=key).first()
        if record is not None and record.request_hash != digest:
            raise IdempotencyKeyReused(key=key)
        return record.run_id if record is not None else None

    try:
        with db.atomic():
            run_id = first_run()
            if run_id is not None:
                return run_id
            run_id = create()
            StartRecord.objects.create(actor=actor, key=key, request_hash=digest, run_id=run_id)
            return run_id
    except (RuntimeFault, IntegrityError):
        run_id = first_run()  # read committed: the twin's record, once it committed
        if run_id is None:
            raise
        return run_id
    except Exception as exc:
        run_id = _read_after_a_lost_connection(first_run, exc)
        if run_id is None:
            raise
        return run_id


def _read_after_a_lost_connection[T](read: Callable[[], T], lost: Exception) -> T:
    """``read`` the idempotency record again on a new connection, after the database's fault
    ``lost`` broke the write that commits it, perhaps in its COMMIT: whether it committed is
    the log's to say, and a command that committed is never answered as failed (issue 31,
    item 1). Re-raises ``lost`` when it is not the database's fault or the database still
    cannot answer.
    """
    if not db.unavailable(lost):
        raise lost
    db.connection.close()  # broken: the next statement opens another one
    try:
        return read()
    except Exception as again:
        if db.unavailable(again):
            raise lost from again
        raise


def _answered(
    run_id: str,
    key: str | None,
    payload: dict[str, Any],
    act: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """Run ``act`` once per idempotency key; a repeat with the same payload gets its answer.

    A twin sent at the same time (PostgreSQL) waits on the first one's commit, then finds
    its run changed (a consumed ticket, an ended run) or its key taken: it answers with the
    first one's record instead of that refusal.
    """
    if key is None:
        return act()
    if not 0 < len(key) <= 200:
        raise InvalidCommit("an idempotency key has 1 to 200 characters")
    digest = _request_hash(payload)

    def first_answer() -> dict[str, Any] | None:
        record = CommandRecord.objects.filter(run_id=run_id, key=key).first()
        if record is not None and record.request_hash != digest:
            raise IdempotencyKeyReused(key=key)
        return record.response if record is not None else None

    def once() -> dict[str, Any]:
        with db.atomic():
            answer = first_answer()
            if answer is not None:
                return answer
            try:
                response = act()
                with db.atomic():  # a savepoint: the twin may hold the key by now
                    CommandRecord.objects.create(
                        run_id=run_id, key=key, request_hash=digest, response=response
                    )
            except (RuntimeFault, IntegrityError):
                answer = first_answer()  # read committed: the twin's record once it commits
                if answer is None:
                    raise
                return answer
            return response

    try:
        return once()
    except Exception as exc:
        answer = _read_after_a_lost_connection(first_answer, exc)
        if answer is None:
            raise
        return answer


def _commit_retrying(
    run_id: str,
    build: Callable[[RunView], CommitDraft | None],
    retry_on: tuple[type[RuntimeFault], ...] = (VersionConflict,),
) -> Committed | None:
    """Read the committed run and its thread's head in one query, build the draft on them and
    commit it; when a worker commits first (or the commit finds a refusal in ``retry_on``),
    read both again and rebuild.

    ``build(run)`` returns the draft (its ``expected_version`` is filled in here), or None
    when there is nothing to write. Returns the commit, or None when nothing was written.
    Raises what ``build`` or the coordinator raises.
    """
    thread_id = _committed_run(run_id).thread_id
    for attempt in range(CONFLICT_RETRIES):
        head, run = read_frontier(thread_id, run_id)
        assert run is not None
        draft = build(run)
        if draft is None:
            return None
        try:
            return commit(replace(draft, expected_version=head.version), head=head, before=run)
        except retry_on:
            if attempt == CONFLICT_RETRIES - 1:
                raise
    raise AssertionError("unreachable: the last attempt returns or raises")


def _answer(run_id: str, committed: Committed | None, operation: str, actor: str) -> dict[str, Any]:
    """The run document after an operator's command, the command's answer.

    Once the command's commit is durable (its own transaction, not a caller's), whatever
    fails after it (the read of the document lost its connection, say) must not answer the
    command as failed: that raises CommittedUnread naming the commit instead (issue 21).
    Inside a caller's transaction (an idempotency record) a failure undoes the commit too, so
    it is raised as it is.
    """
    try:
        tracing.request_linked(operation, run_id, actor=actor)
        return run_document(run_id)
    except Exception as exc:
        if committed is None or db.connection.in_atomic_block:
            raise
        report = log.warning if db.unavailable(exc) else log.exception
        report(
            "%s of run %s is committed (seq %s); reading the run after it failed: %s",
            operation,
            run_id,
            committed.seq,
            exc,
        )
        raise CommittedUnread(run_id=run_id, seq=committed.seq) from exc


def resume(
    run_id: str,
    command: ResumeCommand,
    *,
    actor: str = "",
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Answer the run's open ticket; return the run document after the commit.

    Raises RunEnded, NotAwaiting, TicketConsumed, TicketMismatch, KindMismatch (the
    committed ticket decides, seed: "call at Awaiting"), TicketNotAnswerable for an answer to
    a delegation ticket (its child's end answers it) or a timer's deny (a timer only fires),
    InvalidInput when an input answer fails the ticket's JSON schema, IdempotencyKeyReused.
    Nothing is written on refusal. The same command sent again by the same actor, once
    committed, gets the run document again and writes nothing (with or without a key).
    Raises CommittedUnread when the command was committed but the run could not be read.
    """
    _require_id(run_id, "run")
    _storable([command.input, command.reason, command.ticket_id], "the command")
    payload = {
        "ticket_id": command.ticket_id,
        "kind": command.kind.value,
        "decision": command.decision.value,
        "input": command.input,
        "reason": command.reason,
        "arguments": command.arguments,
    }

    def build(run: RunView) -> CommitDraft:
        check_operator_resume(run, command)
        assert run.ticket is not None
        if command.arguments is not None:
            _check_edited_arguments(run, run.ticket.call_id, command.arguments)
        if command.decision is Decision.INPUT and run.ticket.schema is not None:
            problem = answer_problem(command.input, run.ticket.schema)
            if problem is not None:
                message, path = problem
                raise InvalidInput(
                    f"input does not match the ticket's schema: {message}", path=path
                )
        return CommitDraft(
            thread_id=run.thread_id,
            run_id=run.run_id,
            expected_version=0,  # the head read with the run (_commit_retrying)
            disposition=Disposition.running(),
            events=(_resumed(run.ticket.call_id, command),),
            actor=actor,
        )

    def act() -> dict[str, Any]:
        try:
            committed = _commit_retrying(run_id, build)
        except (TicketConsumed, RunEnded):
            if not _committed_before(run_id, command, actor):
                raise
            committed = None  # the same command, committed before: answered, not re-applied
        return _answer(run_id, committed, "resume", actor)

    return _answered(run_id, idempotency_key, payload, act)


def _resumed(call_id: str, command: ResumeCommand) -> CallResumed:
    """The event that commits ``command`` on the call it answers."""
    return CallResumed(
        call_id=call_id,
        ticket_id=command.ticket_id,
        decision=command.decision,
        input=command.input,
        reason=command.reason,
        arguments=command.arguments,
    )


def _committed_before(run_id: str, command: ResumeCommand, actor: str) -> bool:
    """Whether ``command`` itself (its ticket, kind, decision, input, note and arguments) was
    committed by ``actor``: then sending it again, with or without an idempotency key, gets
    the committed answer (DESIGN.md, "Repeats are answered, not re-applied"), so a client
    that never learnt its answer may simply send the command again. Another command on the
    consumed ticket, or another actor's, is still refused. The log decides: the commit that
    consumed the ticket must hold this very event.
    """
    ticket = (
        Ticket.objects.filter(id=command.ticket_id, run_id=run_id, state="consumed")
        .values_list("call_id", "kind", "closed_by", "closed_seq", "run__thread_id")
        .first()
    )
    if ticket is None:
        return False
    call_id, kind, closed_by, seq, thread_id = ticket
    if kind != command.kind.value or closed_by != actor or seq is None:
        return False
    events = (
        ThreadCommit.objects.filter(thread_id=thread_id, seq=seq)
        .values_list("events", flat=True)
        .first()
    )
    return codec.dump_event(_resumed(call_id, command)) in (events or [])


def _check_edited_arguments(run: RunView, call_id: str, arguments: dict[str, Any]) -> None:
    """Refuse edited arguments the tool would refuse (InvalidInput, 422): the worker runs the
    tool with exactly these, so a bad edit is caught before anything is committed."""
    call = next(c for b in run.batches for c in b.calls if c.call_id == call_id)
    tool = get_agent(run.agent).tool(call.name)
    if tool is None:
        return  # an unknown tool is refused by the worker, whatever the arguments
    try:
        tool.parse(json.dumps(arguments))
    except ToolArgumentsError as exc:
        raise InvalidInput(f"the edited arguments do not fit {call.name}: {exc}") from exc


def end_run(
    run_id: str,
    cause: EndCause,
    *,
    actor: str = "",
    reason: str = "",
    error: dict[str, Any] | None = None,
) -> Committed | None:
    """Commit Ended(cause), sealing open calls as Indeterminate; an ended run is left as is.
    Returns the commit, or None when the run had already ended."""

    def build(run: RunView) -> CommitDraft | None:
        if run.state is RunState.ENDED:
            return None
        # The seal's words say what ended the run, then the operator's reason, if any.
        why = end_cause_reason(cause) + (f" ({reason})" if reason else "")
        events, messages = ending(run, why)
        detail = error if error is not None else ({"reason": reason} if reason else None)
        return CommitDraft(
            thread_id=run.thread_id,
            run_id=run.run_id,
            expected_version=0,  # the head read with the run (_commit_retrying)
            disposition=Disposition.ended(cause, detail),
            messages=messages,
            events=events,
            actor=actor,
        )

    # An end that lands between this read and the commit is found by the commit as RunEnded:
    # the fresh read then sees the run Ended and leaves it as is (the terminus, never a 409).
    return _commit_retrying(run_id, build, retry_on=(VersionConflict, RunEnded))


def cancel(
    run_id: str,
    *,
    actor: str = "",
    reason: str = "",
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Cancel a run; return its terminus (the run document).

    One commit to Ended(cancelled) seals every open call; a run already ended gets the same
    terminus back and nothing is written. Raises NotFound for an unknown run, and
    CommittedUnread when the cancel was committed but the run could not be read after it.
    """

    _require_id(run_id, "run")
    _storable(reason, "the reason")

    def act() -> dict[str, Any]:
        committed = end_run(run_id, EndCause.CANCELLED, actor=actor, reason=reason)
        return _answer(run_id, committed, "cancel", actor)

    return _answered(run_id, idempotency_key, {"cancel": reason}, act)


def _pause_reason(reason: str) -> None:
    """Refuse a pause's or a resume's reason no surface may record: InvalidCommit for NUL or a
    lone surrogate, or more than PAUSE_REASON_MAX characters (one limit for all surfaces)."""
    _storable(reason, "the reason")
    if len(reason) > PAUSE_REASON_MAX:
        raise InvalidCommit(f"the reason has at most {PAUSE_REASON_MAX} characters")


def _kept(run: RunView) -> Disposition:
    """The disposition a pause, a resume or a move commits: the one the run has (README,
    "Pause")."""
    if run.state is RunState.AWAITING:
        assert run.ticket is not None
        return Disposition.awaiting(run.ticket)
    return Disposition.running()


def pause(
    run_id: str,
    *,
    actor: str = "",
    reason: str = "",
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Pause a run; return the run document after the commit.

    One commit opens the run's pause ticket (``RunPaused``, kind ``pause``, its request
    ``{"reason", "paused_by", "paused_at"}``) and keeps its disposition: the run stops at its
    next boundary (a call whose effect started finishes and its result is committed; nothing
    new starts), no worker claims it, its open ticket stays answerable, and only
    ``resume_run`` continues it. A cancel still ends it.

    Raises NotFound, RunEnded (an ended run is never paused), AlreadyPaused (paused by
    another actor, or with another reason: ``detail`` says by whom, when and why),
    InvalidCommit (a reason with NUL or over PAUSE_REASON_MAX characters),
    IdempotencyKeyReused; nothing is written on refusal. The same pause sent again by the
    actor who paused it gets the run document and writes nothing (with or without a key).
    Raises CommittedUnread when the pause was committed but the run could not be read.
    """
    _require_id(run_id, "run")
    _pause_reason(reason)

    def build(run: RunView) -> CommitDraft:
        if run.state is RunState.ENDED:
            raise RunEnded(end_cause=run.end_cause and run.end_cause.value)
        ticket = ResumeTicket(
            id=uuid.uuid4().hex,
            run_id=run.run_id,
            call_id="",
            kind=TicketKind.PAUSE,
            request={
                "reason": reason,
                "paused_by": actor,
                "paused_at": timezone.now().isoformat(),
            },
        )
        return CommitDraft(
            thread_id=run.thread_id,
            run_id=run.run_id,
            expected_version=0,  # the head read with the run (_commit_retrying)
            disposition=_kept(run),
            events=(RunPaused(ticket=ticket),),
            actor=actor,
        )

    def act() -> dict[str, Any]:
        try:
            committed = _commit_retrying(run_id, build)
        except AlreadyPaused as refused:
            if (refused.detail.get("paused_by"), refused.detail.get("reason")) != (actor, reason):
                raise
            committed = None  # the same pause, committed before: answered, not re-applied
        return _answer(run_id, committed, "pause", actor)

    return _answered(run_id, idempotency_key, {"pause": reason}, act)


def resume_run(
    run_id: str,
    *,
    actor: str = "",
    reason: str = "",
    ticket_id: str | None = None,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Resume a paused run; return the run document after the commit.

    One commit consumes the run's pause ticket (``RunResumed``) and keeps its disposition: a
    Running run is claimable again by any worker and continues from its committed frontier;
    an Awaiting run still waits on its own ticket. ``ticket_id``, when given, must name the
    open pause ticket.

    Raises NotFound, RunEnded, NotPaused (the run is not paused), TicketMismatch (another
    ticket named), InvalidCommit (a reason with NUL or over PAUSE_REASON_MAX characters),
    IdempotencyKeyReused; nothing is written on refusal. The same resume sent again by the
    actor whose resume consumed the run's last pause (the same reason, and the same ticket
    when one is named) gets the run document and writes nothing, as a repeated pause does.
    Raises CommittedUnread when the resume was committed but the run could not be read.
    """
    _require_id(run_id, "run")
    _pause_reason(reason)
    _storable(ticket_id, "the command")

    def build(run: RunView) -> CommitDraft:
        if run.state is RunState.ENDED:
            raise RunEnded(end_cause=run.end_cause and run.end_cause.value)
        if run.pause is None:
            raise NotPaused(state=run.state.value)
        return CommitDraft(
            thread_id=run.thread_id,
            run_id=run.run_id,
            expected_version=0,  # the head read with the run (_commit_retrying)
            disposition=_kept(run),
            events=(RunResumed(ticket_id=ticket_id or run.pause.id, reason=reason),),
            actor=actor,
        )

    def act() -> dict[str, Any]:
        try:
            committed = _commit_retrying(run_id, build)
        except NotPaused:
            if not _unpaused_before(run_id, actor, reason, ticket_id):
                raise
            committed = None  # the same resume, committed before: answered, not re-applied
        return _answer(run_id, committed, "resume", actor)

    return _answered(run_id, idempotency_key, {"resume": reason, "ticket_id": ticket_id}, act)


def _unpaused_before(run_id: str, actor: str, reason: str, ticket_id: str | None) -> bool:
    """Whether the run's last pause was consumed by this very resume: ``actor``'s commit holds
    a RunResumed with ``reason`` (and ``ticket_id`` when given). The log decides, as for a
    call's ticket (``_committed_before``): the newest pause event of the run is looked for."""
    commits = ThreadCommit.objects.filter(run_id=run_id).order_by("-seq")
    for by, events in commits.values_list("actor", "events").iterator(chunk_size=50):
        for event in reversed(events or []):
            if event.get("type") == RunPaused.__name__:
                return False
            if event.get("type") == RunResumed.__name__:
                resumed = codec.dump_event(RunResumed(ticket_id=event["ticket_id"], reason=reason))
                named = ticket_id is None or ticket_id == event["ticket_id"]
                return by == actor and named and event == resumed
    return False


def driven_now(owner: str) -> str:
    """Why a run the worker ``owner`` holds now is not moved (``move_run``, and the dry run
    of ``runtime.moves``)."""
    return (
        f"worker {owner} drives the run now: pause it first (its worker lets it go at its next"
        " boundary), then move it"
    )


def move_run(
    run_id: str,
    *,
    from_version: str,
    to_version: str,
    actor: str = "",
    reason: str = "",
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Move a run from ``from_version`` to ``to_version`` of its agent (deployed versions,
    ``Agent.deployed_version``); return the run document after the commit.

    One commit (``RunMoved``) keeps the run's disposition and stamps the run's row, so that
    from then on workers that carry ``to_version`` drive it (``runtime.versions``). Its calls
    keep what was pinned when they were requested. ``runtime.moves.plan`` says first what the
    move changes for the run (issue 34, item 3).

    Raises NotFound; MoveRefused when the run ended, when a worker holds its lease now (pause
    it first: its worker lets it go at its next boundary; judged again in the commit's own
    write), when it is already on ``to_version`` (another operator moved it: a move is
    written once), or when it is on another version than ``from_version``; InvalidCommit for
    a reason or a version no surface may record; IdempotencyKeyReused. Nothing is written on
    refusal; the same move sent again with its ``idempotency_key`` gets the first answer.
    Raises CommittedUnread when the move was committed but the run could not be read.
    """
    _require_id(run_id, "run")
    _pause_reason(reason)
    for version in (from_version, to_version):
        _storable(version, "a version")
        if len(version) > VERSION_MAX:
            raise InvalidCommit(f"a version has at most {VERSION_MAX} characters")
    if not to_version:
        raise InvalidCommit("a run moves to a named version")

    def build(run: RunView) -> CommitDraft | None:
        if run.state is RunState.ENDED:
            raise MoveRefused("the run ended: an ended run is not moved", end_cause=run.end_cause)
        if run.agent_version == to_version:  # another operator's move, or this one sent again
            raise MoveRefused(
                f"the run is already on version {to_version!r}", agent_version=to_version
            )
        if run.agent_version != from_version:
            raise MoveRefused(
                f"the run is on version {run.agent_version!r}, not {from_version!r}",
                agent_version=run.agent_version,
            )
        owner = (
            Run.objects.filter(id=run_id, lease_expires_at__gt=db.db_now())
            .values_list("lease_owner", flat=True)
            .first()
        )
        if owner:
            raise MoveRefused(driven_now(owner), lease_owner=owner)
        return CommitDraft(
            thread_id=run.thread_id,
            run_id=run.run_id,
            expected_version=0,  # the head read with the run (_commit_retrying)
            disposition=_kept(run),
            events=(RunMoved(from_version=from_version, to_version=to_version, reason=reason),),
            actor=actor,
        )

    def act() -> dict[str, Any]:
        return _answer(run_id, _commit_retrying(run_id, build), "move", actor)

    request = {"move": [from_version, to_version], "reason": reason}
    return _answered(run_id, idempotency_key, request, act)


def reconciliation_problem(outcome: str, evidence: str) -> str | None:
    """Say why a reconciliation cannot be recorded as given, or return None.

    The one rule every surface applies (DESIGN.md, "Reconciliation": *applied with
    evidence*): an outcome of "applied" needs evidence saying where the effect shows.
    """
    if outcome == "applied" and not evidence.strip():
        return "Applied needs evidence: say where the effect shows."
    return None


def _contradicted(call: ToolCallRecord, outcome: str) -> ReconciliationRecord | None:
    """The call's latest applied/not_applied record when ``outcome`` says the opposite."""
    if outcome not in ("applied", "not_applied"):
        return None
    earlier = (
        call.reconciliations.filter(outcome__in=("applied", "not_applied")).order_by("seq").last()
    )
    return earlier if earlier is not None and earlier.outcome != outcome else None


def reconcile(
    call_id: str,
    *,
    outcome: str,
    evidence: str = "",
    actor: str = "",
    follow_up_agent: str | None = None,
    correction: bool = False,
    idempotency_key: str | None = None,
) -> dict[str, Any]:
    """Record what the downstream system says of an Indeterminate call, as a thread note.

    An "applied" or "not_applied" that contradicts the call's latest decided record is refused
    with ReconciliationContradicts (409, naming that commit) unless ``correction`` says it
    corrects it: one rule for the console and the API.

    ``outcome`` is "applied", "not_applied" or "unknown". Nothing is reopened; with
    ``follow_up_agent`` a new run starts on the thread with the outcome as its input (when the
    thread has no active run). Returns {"call_id", "outcome", "seq", "follow_up_run_id"}.
    Raises NotFound, InvalidCommit (not Indeterminate, unknown outcome), and for the
    follow-up UnknownAgent or RunAlreadyActive; on any refusal nothing is written. With
    ``idempotency_key`` (scoped to the call's run, as a resume's) the same reconciliation
    sent again gets its first answer and records nothing (IdempotencyKeyReused for another
    one under the same key).
    """
    _require_id(call_id, "tool call")
    _storable([outcome, evidence], "the reconciliation")
    if (problem := reconciliation_problem(outcome, evidence)) is not None:
        raise InvalidCommit(problem)
    call = ToolCallRecord.objects.select_related("run").filter(id=call_id).first()
    if call is None:
        raise NotFound(f"tool call {call_id} does not exist")
    payload = {
        "reconcile": call_id,
        "outcome": outcome,
        "evidence": evidence,
        "follow_up_agent": follow_up_agent,
        "correction": correction,
    }
    return _answered(
        call.run_id,
        idempotency_key,
        payload,
        lambda: _reconciled(call, outcome, evidence, actor, follow_up_agent, correction),
    )


def _reconciled(
    call: ToolCallRecord,
    outcome: str,
    evidence: str,
    actor: str,
    follow_up_agent: str | None,
    correction: bool,
) -> dict[str, Any]:
    """Commit the reconciliation note (and its follow-up run): ``reconcile``'s write."""
    call_id = call.id
    if not correction and (earlier := _contradicted(call, outcome)) is not None:
        raise ReconciliationContradicts(
            f"this contradicts commit #{earlier.seq} ({earlier.outcome.replace('_', ' ')} by "
            f"{earlier.actor or 'an unnamed actor'}); record it as a correction to replace it",
            earlier_seq=earlier.seq,
            earlier_outcome=earlier.outcome,
        )
    thread_id = call.run.thread_id
    event = ReconciliationRecorded(
        run_id=call.run_id, call_id=call_id, outcome=outcome, evidence=evidence
    )
    follow_up = None
    # The note and the follow-up run land together or not at all.
    with db.atomic():
        done = commit(
            CommitDraft(
                thread_id=thread_id,
                run_id=None,
                expected_version=read_head(thread_id, lock=True).version,
                disposition=None,
                events=(event,),
                actor=actor,
            )
        )
        if follow_up_agent:
            text = (
                f"Operator reconciliation of tool call {call.name} (operation id "
                f"{call.operation_id}): outcome {outcome}. Evidence: {evidence or 'none given'}."
            )
            follow_up = start_run(
                agent=follow_up_agent, input=text, thread_id=thread_id, actor=actor
            )
    return {"call_id": call_id, "outcome": outcome, "seq": done.seq, "follow_up_run_id": follow_up}


def start_child(
    run: RunView,
    call: ToolCall,
    tool: Tool,
    arguments: dict[str, Any],
    commit_parent: Callable[[Disposition, tuple[Event, ...]], RunView],
) -> str | None:
    """Start the child of an Executing delegate call and park the call on it, atomically
    (issue 10): one transaction commits the child's activation on its own thread and the
    parent's ChildStarted (the call Awaiting with a ``delegation`` ticket naming the child),
    so a crash leaves both or neither. The child's id is derived from the call's operation id
    (``delegation.child_run_id``), so recovery finds it and never starts a second one.

    ``commit_parent(disposition, events)`` commits on the parent's thread (the driver's
    lease-fenced commit). Returns None, or the error text when the child cannot start (an
    unknown agent, a refused script, bad input): the caller completes the call with it.
    Raises what ``commit_parent`` raises (VersionConflict, LeaseLost), with nothing written.
    """
    assert tool.delegate is not None
    child_id = child_run_id(call.operation_id)
    link = ChildLink(
        run_id=child_id, parent_run_id=run.run_id, parent_call_id=call.call_id, depth=run.depth + 1
    )
    with db.atomic():
        existing = read_run(child_id)  # recovery finds the child by the call's operation id
        if existing is None:
            metadata = tool.delegate.metadata(arguments) if tool.delegate.metadata else {}
            try:
                with db.atomic():
                    start_run(
                        agent=tool.delegate.agent,
                        input=arguments["input"],
                        metadata=metadata,
                        actor=f"run:{run.run_id}",
                        child=link,
                    )
            except RuntimeFault as exc:
                return f"The child run could not start: {exc.message} ({exc.code})."
        child = read_run(child_id)
        assert child is not None
        ticket = ResumeTicket(
            id=uuid.uuid4().hex,
            run_id=run.run_id,
            call_id=call.call_id,
            kind=TicketKind.DELEGATION,
            request={"child_run_id": child_id, "agent": child.agent, "input": arguments["input"]},
        )
        event = ChildStarted(
            call_id=call.call_id,
            child_run_id=child_id,
            child_thread_id=child.thread_id,
            ticket=ticket,
        )
        commit_parent(settle(stage(run, (event,))), (event,))
    crash_point("child_started")
    return None


def fork_run(
    run_id: str,
    *,
    at_step: int,
    input: str | list[dict[str, Any]] | None = None,
    actor: str = "",
    idempotency_key: str | None = None,
) -> str:
    """Fork ``run_id`` after Step ``at_step`` onto a new thread; return the new run's id.

    The new run's committed history is the source's up to the end of that step (copied,
    nothing executed again; see runtime.fork), then ``input`` if given; the source is never
    changed. ``idempotency_key`` as for ``start_run`` (one scope per actor for starts and
    forks): the same key with the same source, step and input returns the fork it made and
    forks nothing. Raises NotFound, ForkRefused (no such step, or it has not finished),
    InvalidCommit (input that cannot be stored, a key out of bounds) and
    IdempotencyKeyReused.
    """
    from runtime import fork

    _require_id(run_id, "run")
    if idempotency_key is None:
        return fork.fork_run(run_id, at_step=at_step, input=input, actor=actor)
    request = {"fork": run_id, "at_step": at_step, "input": input}
    return _started_once(
        actor,
        idempotency_key,
        request,
        lambda: fork.fork_run(run_id, at_step=at_step, input=input, actor=actor),
    )
