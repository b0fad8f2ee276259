"""``/tickets``: the resume tickets of all runs, oldest first (the approval queue)."""

from __future__ import annotations

from typing import Any, Literal

from django.http import HttpRequest
from ninja import Field, Query, Router, Schema

from console.api.auth import read_auth
from console.api.errors import errors
from console.api.pagination import CURSOR_PATTERN, keyset_page
from console.api.schemas import Id, TicketKindName, TicketPageOut
from runtime.documents import call_document, ticket_document
from runtime.models import Ticket

router = Router(tags=["tickets"])


class TicketFilters(Schema):
    state: Literal["open", "consumed", "void", "all"] = "open"
    kind: TicketKindName | None = None
    run: Id | None = Field(None, description="a run id")
    cursor: str | None = Field(None, pattern=CURSOR_PATTERN, description="from next_cursor")
    limit: int = Field(50, ge=1, le=200)


@router.get(
    "",
    response={200: TicketPageOut, **errors(401, 403, 422)},
    auth=read_auth,
    by_alias=True,
    summary="List tickets, oldest first",
)
def list_tickets(request: HttpRequest, filters: Query[TicketFilters]) -> dict[str, Any]:
    """Tickets oldest first (open ones by default), each with its run and call."""
    rows = Ticket.objects.select_related("run", "call")
    if filters.state != "all":
        rows = rows.filter(state=filters.state)
    if filters.kind is not None:
        rows = rows.filter(kind=filters.kind)
    if filters.run is not None:
        rows = rows.filter(run_id=filters.run)
    page, next_cursor = keyset_page(
        rows, cursor=filters.cursor, limit=filters.limit, newest_first=False
    )
    items = [
        {
            **ticket_document(t),
            "run_id": t.run_id,
            "thread_id": t.run.thread_id,
            "agent": t.run.agent,
            "call": call_document(t.call),
        }
        for t in page
    ]
    return {"items": items, "next_cursor": next_cursor}
