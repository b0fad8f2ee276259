"""``/tool-calls``: find calls by phase (Indeterminate ones for reconciliation) and record
what the downstream system says of them."""

from __future__ import annotations

from typing import Any, Literal

from django.db.models import Prefetch
from django.http import HttpRequest
from ninja import Field, Query, Router, Schema
from ninja.responses import Status

from console.api.auth import actor, operate_auth, read_auth
from console.api.errors import errors
from console.api.pagination import CURSOR_PATTERN, keyset_page
from console.api.runs import IdempotencyKey
from console.api.schemas import (
    CallPhaseName,
    Id,
    ReconcileIn,
    ReconciliationOut,
    StorableText,
    ToolCallPageOut,
)
from runtime import operations
from runtime.documents import call_document
from runtime.inventory import SEAL_REASONS, unreconciled_calls, with_seal_reason
from runtime.models import ReconciliationRecord, ToolCallRecord

router = Router(tags=["tool calls"])


class CallFilters(Schema):
    phase: CallPhaseName | None = None
    all: bool = Field(
        False,
        description="with phase=indeterminate: also calls sealed before any attempt started "
        "(by default only those whose effect may have started, which need reconciliation)",
    )
    unreconciled: bool = Field(
        False,
        description="only Indeterminate calls whose effect may have started and that no "
        'reconciliation was recorded for yet (the console\'s "To check" list)',
    )
    run: Id | None = Field(None, description="a run id")
    tool: StorableText | None = Field(None, max_length=200, description="a tool's name")
    agent: StorableText | None = Field(None, max_length=100, description="the run's agent")
    reason: Literal[tuple(SEAL_REASONS)] | None = Field(  # type: ignore[valid-type]
        None, description="why an Indeterminate call was sealed: " + ", ".join(SEAL_REASONS)
    )
    cursor: str | None = Field(None, pattern=CURSOR_PATTERN, description="from next_cursor")
    limit: int = Field(50, ge=1, le=200)


def reconciliation_document(record: ReconciliationRecord, run_id: str) -> dict[str, Any]:
    return {
        "id": record.pk,
        "call_id": record.call_id,
        "run_id": run_id,
        "thread_id": record.thread_id,
        "seq": record.seq,
        "outcome": record.outcome,
        "evidence": record.evidence,
        "actor": record.actor,
        "created_at": record.created_at.isoformat(),
    }


@router.get(
    "",
    response={200: ToolCallPageOut, **errors(401, 403, 422)},
    auth=read_auth,
    summary="List tool calls, newest first",
)
def list_tool_calls(request: HttpRequest, filters: Query[CallFilters]) -> dict[str, Any]:
    """Tool calls by phase, newest first (by when their batch was committed, then id: a key
    that never changes, so a call that changes while a client walks the pages is neither
    skipped nor repeated), each with its run, operation id and recorded reconciliations.
    ``phase=indeterminate`` lists only calls whose effect may have started unless ``all``;
    ``unreconciled`` keeps only those no decisive reconciliation (applied / not applied)
    settles (runtime.inventory.unreconciled_calls; "still unknown" leaves a call to check);
    ``tool``, ``agent`` and ``reason`` (the seal's reason, runtime.inventory.SEAL_REASONS)
    narrow it as the console's Reconcile queue does. A call of a tool without external
    effects is never "to check": its seal says "no external effect; nothing to check"."""
    rows = ToolCallRecord.objects.select_related("run").prefetch_related(
        Prefetch("reconciliations", ReconciliationRecord.objects.order_by("seq"))
    )
    if filters.phase is not None:
        rows = rows.filter(phase=filters.phase)
        if filters.phase == "indeterminate" and not filters.all:
            rows = rows.filter(effect_may_have_started=True)
    if filters.unreconciled:
        rows = rows.filter(id__in=unreconciled_calls().values("id"))
    if filters.run is not None:
        rows = rows.filter(run_id=filters.run)
    if filters.tool:
        rows = rows.filter(name=filters.tool)
    if filters.agent:
        rows = rows.filter(run__agent=filters.agent)
    if filters.reason:
        rows = with_seal_reason(rows, filters.reason)
    page, next_cursor = keyset_page(
        rows, cursor=filters.cursor, limit=filters.limit, newest_first=True
    )
    items = [
        {
            **call_document(call),
            "run_id": call.run_id,
            "thread_id": call.run.thread_id,
            "agent": call.run.agent,
            "step": call.step,
            "ticket_id": call.ticket_id,
            "reconciliations": [
                reconciliation_document(r, call.run_id) for r in call.reconciliations.all()
            ],
        }
        for call in page
    ]
    return {"items": items, "next_cursor": next_cursor}


@router.post(
    "/{call_id}/reconciliation",
    response={201: ReconciliationOut, **errors(400, 401, 403, 404, 409, 422)},
    auth=operate_auth,
    summary="Record what the downstream system says of an Indeterminate call",
)
def reconcile(
    request: HttpRequest,
    call_id: Id,
    payload: ReconcileIn,
    idempotency_key: IdempotencyKey = None,
) -> Status[Any]:
    """Record the outcome (applied / not_applied / unknown) and evidence as a committed,
    audited fact on the thread; nothing is reopened. 422 ``invalid_commit`` when the call is
    not Indeterminate. A follow-up run is started separately (``POST /threads/{id}/runs``).

    With an ``Idempotency-Key`` (scoped to the call's run, as a resume's) the same body sent
    again gets 201 the reconciliation it recorded and records nothing; another body under
    the same key is 422 ``idempotency_key_reused``."""
    answer = operations.reconcile(
        call_id,
        outcome=payload.outcome,
        evidence=payload.evidence,
        actor=actor(request),
        correction=payload.correction,
        idempotency_key=idempotency_key,
    )
    call = (
        ToolCallRecord.objects.only("run_id", "run__thread_id")
        .select_related("run")
        .get(id=call_id)
    )
    record = ReconciliationRecord.objects.get(
        thread_id=call.run.thread_id, seq=answer["seq"], call_id=call_id
    )
    return Status(201, reconciliation_document(record, call.run_id))
