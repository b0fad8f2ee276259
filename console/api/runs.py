"""``/runs``: start, list and read runs, read their log, resume, pause and cancel them."""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime
from typing import Annotated, Any

from django.http import HttpRequest
from ninja import Field, Header, Query, Router, Schema
from ninja.responses import Status

from console.api.auth import actor, operate_auth, read_auth, resume_auth
from console.api.documents import (
    SUMMARY_FIELDS,
    commit_document,
    run_out,
    run_summaries,
    with_active_batch,
)
from console.api.errors import Forbidden, errors
from console.api.pagination import CURSOR_PATTERN, keyset_page
from console.api.schemas import (
    MAX_SEQ,
    AgentName,
    CancelIn,
    CommitPageOut,
    CommittedOut,
    EndCauseName,
    ForkIn,
    Id,
    MoveIn,
    MoveOut,
    PauseIn,
    ResumeIn,
    RunIn,
    RunOut,
    RunPageOut,
    RunStateName,
)
from console.models import OPERATE
from runtime import db, moves, operations
from runtime.documents import snapshot
from runtime.domain.model import Decision, ResumeCommand, TicketKind
from runtime.errors import CommittedUnread, InvalidCommit, NotFound, RuntimeFault
from runtime.models import Run, ThreadCommit
from runtime.search import RunSearch, narrow

router = Router(tags=["runs"])

IdempotencyKey = Annotated[
    str | None,
    Header(
        None,
        alias="Idempotency-Key",
        max_length=200,
        pattern=r"^[\x21-\x7e]+$",
        description="repeat a request safely: the same key and body get the first answer",
    ),
]


class RunFilters(Schema):
    state: RunStateName | None = None
    end_cause: EndCauseName | None = None
    agent: AgentName | None = None
    thread: Id | None = Field(None, description="a thread id")
    parent: Id | None = Field(None, description="the parent run's id: its child runs")
    paused: bool | None = Field(None, description="true: only paused runs; false: none of them")
    q: str | None = Field(
        None,
        min_length=1,
        max_length=500,
        description="free text in the runs' input, answers and tool arguments (PostgreSQL: "
        'full text search of each text\'s first 100,000 characters, words ANDed, "phrases", '
        "-excluded; SQLite: the whole text, case-insensitive), or a run, thread or operation "
        "id prefix",
    )
    since: datetime | None = Field(None, description="created at or after (ISO 8601)")
    until: datetime | None = Field(None, description="created before (ISO 8601)")
    tool: str | None = Field(None, min_length=1, max_length=200, description="called this tool")
    meta_key: str | None = Field(
        None, pattern=r"^[A-Za-z0-9_.-]{1,64}$", description="has this top-level metadata key"
    )
    meta_value: str | None = Field(
        None, max_length=500, description="with meta_key: the key's value, as text, equals this"
    )
    cursor: str | None = Field(None, pattern=CURSOR_PATTERN, description="from next_cursor")
    limit: int = Field(50, ge=1, le=200)

    def search(self) -> RunSearch:
        """The runtime.search query of the search fields; raises InvalidCommit (422) for a
        metadata value without its key, or a naive time."""
        for moment in (self.since, self.until):
            if moment is not None and moment.tzinfo is None:
                raise InvalidCommit("since and until name their zone (e.g. 2026-12-01T10:00Z)")
        try:
            return RunSearch(
                text=self.q or "",
                since=self.since,
                until=self.until,
                tool=self.tool or "",
                meta_key=self.meta_key or "",
                meta_value=self.meta_value or "",
            )
        except ValueError as exc:
            raise InvalidCommit(str(exc)) from None


def start(
    request: HttpRequest,
    payload: RunIn,
    thread_id: str | None = None,
    idempotency_key: str | None = None,
) -> Status[Any]:
    """Start a run of ``payload.agent`` (on ``thread_id``, or on a new thread), once per
    idempotency key when one is given: 201 the run."""
    run_id = operations.start_run(
        agent=payload.agent,
        input=payload.input
        if isinstance(payload.input, str)
        else [m.model_dump() for m in payload.input],
        metadata=payload.metadata,
        thread_id=thread_id,
        actor=actor(request),
        idempotency_key=idempotency_key,
    )
    return Status(201, made(run_id))


def made(run_id: str) -> Any:
    """The document of the run a start or a fork just committed; raises CommittedUnread
    (202) when the database fails to read it: the command took effect, and is never
    answered as failed (issue 31, item 1)."""
    try:
        return run_out(run_id)
    except Exception as exc:
        if not db.unavailable(exc):
            raise
        raise CommittedUnread(run_id=run_id, seq=None) from exc


@router.post(
    "",
    response={201: RunOut, 202: CommittedOut, **errors(400, 401, 403, 404, 422)},
    auth=operate_auth,
    by_alias=True,
    summary="Start a run on a new thread",
)
def start_run(
    request: HttpRequest, payload: RunIn, idempotency_key: IdempotencyKey = None
) -> Status[Any]:
    """Start a run on a new thread. 404 ``unknown_agent`` lists the known agents under
    ``detail.known``; a metadata script the scripted model refuses is 422 ``script_refused``.

    With an ``Idempotency-Key`` (scoped to the token's user, one scope for starts and forks)
    the run and its key are committed in one transaction: the same key with the same body
    gets 201 the run it started (as it is now) and starts nothing, also when the first
    answer was lost after the commit; the same key with another body is 422
    ``idempotency_key_reused``. A start that committed is never 503: when the run cannot be
    read after it, 202 ``{committed, run_id, seq: null, message}``; a 503 means it did not
    commit (with a key, the server asks the log on a new connection when the write broke)."""
    return start(request, payload, idempotency_key=idempotency_key)


@router.get(
    "",
    response={200: RunPageOut, **errors(401, 403, 422)},
    auth=read_auth,
    summary="List runs, newest first",
)
def list_runs(request: HttpRequest, filters: Query[RunFilters]) -> dict[str, Any]:
    """Runs newest first, filtered by state, end cause, agent, thread and parent run, and
    searched by free text (``q``), creation time, called tool and metadata key and value
    (runtime.search); keyset-paginated (pass ``next_cursor`` back as ``cursor``)."""
    rows = Run.objects.only(*SUMMARY_FIELDS)
    for field, value in (
        ("state", filters.state),
        ("end_cause", filters.end_cause),
        ("agent", filters.agent),
        ("thread_id", filters.thread),
        ("parent_run_id", filters.parent),
        ("paused", filters.paused),
    ):
        if value is not None:
            rows = rows.filter(**{field: value})
    rows = narrow(rows, filters.search())
    page, next_cursor = keyset_page(
        rows, cursor=filters.cursor, limit=filters.limit, newest_first=True
    )
    return {"items": run_summaries(page), "next_cursor": next_cursor}


@router.post(
    "/move",
    response={200: MoveOut, **errors(400, 401, 403, 404, 422)},
    auth=operate_auth,
    summary="Move runs to the deployed version of their agent (dry run by default)",
)
def move_runs(request: HttpRequest, payload: MoveIn) -> dict[str, Any]:
    """Move the runs of ``agent`` that are not ended and not on the version of it this server
    carries to that version: with ``apply`` false (the default), a dry run that lists per
    run what moving it changes (each call whose tool is gone or refuses its arguments is
    completed with an error before any effect; a call whose tool declares another policy
    keeps the pinned one) and what it does next, and writes nothing. With ``apply`` true each
    run that can be moved gets one committed ``RunMoved`` (in Audit); a run a worker drives
    now is left as it is, its ``refused`` says why (pause it first). 404 ``unknown_agent``
    when the server does not carry ``agent``."""
    if payload.apply:
        to_version, found, moved, more = moves.move(
            payload.agent,
            from_version=payload.from_version,
            run_ids=payload.run_ids,
            limit=payload.limit,
            actor=actor(request),
            reason=payload.reason,
        )
    else:
        to_version, found, more = moves.plan(
            payload.agent,
            from_version=payload.from_version,
            run_ids=payload.run_ids,
            limit=payload.limit,
        )
        moved = []
    runs = [m.document() for m in found]
    return {
        "agent": payload.agent,
        "to_version": to_version,
        "runs": runs,
        "moved": moved,
        "more": more,
    }


@router.get(
    "/{run_id}",
    response={200: RunOut, **errors(401, 403, 404, 422)},
    auth=read_auth,
    by_alias=True,
    summary="Read a run's committed state",
)
def get_run(request: HttpRequest, run_id: Id) -> dict[str, Any]:
    """The committed run document: state, version, end cause, the open ticket, every batch
    with every call (phase, attempt, operation id, pinned policy, arguments, result), the
    active batch and the time of the last commit."""
    return run_out(run_id)


@router.get(
    "/{run_id}/commits",
    response={200: CommitPageOut, **errors(401, 403, 404, 422)},
    auth=read_auth,
    summary="Read a run's log entries",
)
def list_commits(
    request: HttpRequest,
    run_id: Id,
    after: int = Query(0, ge=0, le=MAX_SEQ, description="only commits with seq > after"),
    limit: int = Query(100, ge=1, le=1000),
) -> dict[str, Any]:
    """The run's commits in sequence order, each with its disposition, messages and events.
    Sequences are per thread, so a run's commits need not be consecutive."""
    with snapshot():
        if not Run.objects.filter(id=run_id).exists():
            raise NotFound(f"run {run_id} does not exist")
        rows = list(
            ThreadCommit.objects.filter(run_id=run_id, seq__gt=after).order_by("seq")[: limit + 1]
        )
    more = len(rows) > limit
    rows = rows[:limit]
    return {
        "items": [commit_document(row) for row in rows],
        "next_after": rows[-1].seq if more else None,
    }


def _command(payload: ResumeIn) -> ResumeCommand:
    assert payload.ticket_id is not None  # ResumeIn requires it but for kind pause
    if payload.decision in ("approve", "deny"):
        decision, value = Decision(payload.decision), None
    elif payload.decision == "respond":
        decision, value = Decision.RESPOND, payload.result
    else:
        decision = Decision.INPUT
        value = payload.input if "input" in payload.model_fields_set else payload.result
    return ResumeCommand(
        ticket_id=payload.ticket_id,
        kind=TicketKind(payload.kind),
        decision=decision,
        input=value,
        reason=payload.note,
        call_id=payload.call_id,
        arguments=payload.arguments,
    )


def _with_committed_run(fault: RuntimeFault, run_id: str) -> RuntimeFault:
    """Attach the committed run document to a conflict, so the client can decide again."""
    if fault.status == 409:
        with suppress(NotFound):  # a run that does not exist has no state to show
            fault.detail["run"] = run_out(run_id)
    return fault


@router.post(
    "/{run_id}/resume",
    response={200: RunOut, 202: CommittedOut, **errors(400, 401, 403, 404, 409, 422)},
    auth=resume_auth,
    by_alias=True,
    summary="Answer a run's open ticket",
)
def resume_run(
    request: HttpRequest, run_id: Id, payload: ResumeIn, idempotency_key: IdempotencyKey = None
) -> dict[str, Any]:
    """Approve, deny, give input or supply a result for the open ticket; 200 the new committed
    state. 409 (``ticket_mismatch``, ``kind_mismatch``, ``ticket_consumed``, ``run_ended``,
    ``not_awaiting``, ``ticket_not_answerable``, ``version_conflict``) writes nothing and
    carries the committed run under ``detail.run``; 422 ``invalid_input`` when the input fails
    the ticket's schema, 422 ``idempotency_key_reused`` when the key was used with another body.

    A delegation ticket is answered only by its child run's end (409
    ``ticket_not_answerable``, ``detail.child_run_id`` names the child to cancel instead); a
    timer ticket only fires: ``decision: approve`` fires it now, anything else is refused.

    The same command sent again by the same user (same ticket, kind, decision, input or
    result, note and arguments) gets the run again (200) and writes nothing, with or without
    an ``Idempotency-Key``. 202 ``{committed, run_id, seq, message}``: the command was
    committed, but the run could not be read after it; send it again for the run.

    ``{"kind": "pause"}`` (optionally ``"decision": "resume"``, the pause's ``ticket_id`` and a
    ``note``) answers the run's pause ticket: the run continues from its committed frontier on
    any worker. It needs the operate permission (403 otherwise); 409 ``not_paused`` when the
    run is not paused, ``run_ended`` when it has ended, ``ticket_mismatch`` for another
    ticket id; nothing is written on refusal."""
    try:
        if payload.kind == "pause":
            if not request.auth.has_perm(OPERATE):  # type: ignore[attr-defined]
                raise Forbidden("resuming a paused run needs the operate permission")
            document = operations.resume_run(
                run_id,
                actor=actor(request),
                reason=payload.note,
                ticket_id=payload.ticket_id,
                idempotency_key=idempotency_key,
            )
        else:
            document = operations.resume(
                run_id, _command(payload), actor=actor(request), idempotency_key=idempotency_key
            )
    except RuntimeFault as fault:
        raise _with_committed_run(fault, run_id) from None
    return with_active_batch(document)


@router.post(
    "/{run_id}/cancel",
    response={200: RunOut, 202: CommittedOut, **errors(400, 401, 403, 404, 422)},
    auth=operate_auth,
    by_alias=True,
    summary="Cancel a run",
)
def cancel_run(
    request: HttpRequest,
    run_id: Id,
    payload: CancelIn | None = None,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """End the run as cancelled, sealing its open calls; 200 the terminus. A run that has
    already ended gets the same terminus again, and nothing is written. 202 ``{committed,
    run_id, seq, message}``: the cancel was committed, but the run could not be read after
    it; send it again for the terminus."""
    document = operations.cancel(
        run_id,
        actor=actor(request),
        reason=payload.reason if payload else "",
        idempotency_key=idempotency_key,
    )
    return with_active_batch(document)


@router.post(
    "/{run_id}/pause",
    response={200: RunOut, 202: CommittedOut, **errors(400, 401, 403, 404, 409, 422)},
    auth=operate_auth,
    by_alias=True,
    summary="Pause a run",
)
def pause_run(
    request: HttpRequest,
    run_id: Id,
    payload: PauseIn | None = None,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    """Pause the run; 200 the run with its ``pause`` ("paused by X at T: reason").

    One commit (a ``RunPaused`` event: a ticket of kind ``pause`` that only a resume answers)
    keeps the run's state: it stops at its next boundary (a call whose effect started
    finishes and its result is committed; nothing new starts), no worker holds it, its open
    ticket stays answerable (answers wait for the resume), and a cancel still ends it. Resume
    it with ``POST /runs/{id}/resume`` ``{"kind": "pause"}``. 409 ``run_ended`` (an ended run),
    ``already_paused`` (paused by someone else or for another reason; ``detail`` says by whom,
    when and why) write nothing and carry the committed run under ``detail.run``. The same
    pause sent again by the user who paused it gets the run again and writes nothing. 202
    ``{committed, run_id, seq, message}``: the pause was committed, but the run could not be
    read after it."""
    try:
        document = operations.pause(
            run_id,
            actor=actor(request),
            reason=payload.reason if payload else "",
            idempotency_key=idempotency_key,
        )
    except RuntimeFault as fault:
        raise _with_committed_run(fault, run_id) from None
    return with_active_batch(document)


@router.post(
    "/{run_id}/fork",
    response={201: RunOut, 202: CommittedOut, **errors(400, 401, 403, 404, 409, 422)},
    auth=operate_auth,
    by_alias=True,
    summary="Fork a run from a step onto a new thread",
)
def fork_run(
    request: HttpRequest, run_id: Id, payload: ForkIn, idempotency_key: IdempotencyKey = None
) -> Status[Any]:
    """Start a new run on a new thread whose committed history is this run's up to the end of
    step ``at_step`` (copied: nothing is executed again), then ``input`` if given; 201 the new
    run. It names its source in ``metadata.forked_from``; the source is never changed. 409
    ``fork_refused`` when the run has no such step or it has not finished.

    With an ``Idempotency-Key`` (scoped to the token's user, one scope for starts and forks)
    the fork and its key are committed in one transaction: the same key with the same source,
    ``at_step`` and ``input`` gets 201 the fork it made (as it is now) and forks nothing,
    also when the first answer was lost after the commit; the same key with another body is
    422 ``idempotency_key_reused``."""
    text = payload.input
    fork = operations.fork_run(
        run_id,
        at_step=payload.at_step,
        input=text if text is None or isinstance(text, str) else [m.model_dump() for m in text],
        actor=actor(request),
        idempotency_key=idempotency_key,
    )
    return Status(201, made(fork))
