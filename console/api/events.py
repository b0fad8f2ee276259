"""``GET /runs/{id}/events``: a run's committed facts as Server-Sent Events, as they commit.

Each commit is one ``commit`` event whose id is its sequence on the thread, so a client that
reconnects with ``Last-Event-ID`` gets exactly the commits after it: no gap, no repeat (a
thread's sequences become visible in order, because each commit takes the thread's head).
The log in the database is the source; a ``run.commit`` message on the run's channel-layer
group only wakes the stream early, and a short poll covers workers in other processes that
cannot reach an in-memory layer. With ``?live=1`` the stream also forwards the group's
``run.delta`` messages as ``delta`` events flagged ``"confirmed": false`` and without an id:
they are not thread truth and are never replayed. The stream ends after the run's Ended
commit (then an ``end`` event); a client that already has it gets 204, which also stops a
browser's EventSource from reconnecting.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Field, Header, Query, Router, Schema

from console.api.auth import read_auth
from console.api.documents import commit_document, ends_run
from console.api.errors import errors
from console.api.schemas import MAX_SEQ, Id
from runtime.errors import NotFound
from runtime.live import bind_to_running_loop, run_group
from runtime.models import Run, ThreadCommit

router = Router(tags=["runs"])

POLL_SECONDS = 0.25  # the longest a commit from another process waits to be seen
DRAIN_SECONDS = 0.05  # before the Ended commit: the wait for a delta still in transit
KEEPALIVE_SECONDS = 15.0  # a comment line keeps proxies from closing an idle stream
BATCH = 200  # commits read per query while catching up
# Reads run through sync_to_async in the request's own thread, which keeps one connection for
# the life of the stream (Django closes it when the response ends) rather than reconnecting on
# every poll, as database_sync_to_async would with CONN_MAX_AGE=0.
RETRY_MS = 1000  # how soon a disconnected EventSource reconnects


class EventsQuery(Schema):
    live: bool = Field(False, description="also stream unconfirmed live deltas")
    after: int | None = Field(
        None, ge=0, le=MAX_SEQ, description="start after this sequence (Last-Event-ID wins)"
    )
    timeout: float | None = Field(
        None, gt=0, le=86_400, description="close the stream after this many seconds"
    )


# The 200 answer in OpenAPI terms: an event stream (OpenAPI 3.2's ``itemSchema`` types each
# event; ``data`` is JSON: a CommitOut with "confirmed": true, a live delta, or the end).
EVENT_STREAM_CONTENT: dict[str, Any] = {
    "schema": {"type": "string", "contentMediaType": "text/event-stream"},
    "itemSchema": {
        "type": "object",
        "required": ["event", "data"],
        "properties": {
            "event": {"type": "string", "enum": ["commit", "delta", "end"]},
            "id": {"type": "string", "description": "the commit's sequence (commit events)"},
            "retry": {"type": "integer", "description": "reconnect delay, milliseconds"},
            "data": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": {
                    "oneOf": [
                        {"$ref": "#/components/schemas/CommitOut"},
                        {
                            "type": "object",
                            "description": "a live delta",
                            "properties": {"confirmed": {"const": False}},
                        },
                        {
                            "type": "object",
                            "description": "the end: run_id, seq and the Ended disposition",
                            "properties": {
                                "run_id": {"type": "string"},
                                "seq": {"type": "integer"},
                            },
                        },
                    ]
                },
            },
        },
    },
}


def sse(*, event: str, data: dict[str, Any], id: int | None = None) -> str:
    """Format one Server-Sent Event; the JSON payload is a single ``data`` line."""
    head = f"id: {id}\n" if id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


@sync_to_async
def _run_position(run_id: str) -> tuple[str, int]:
    row = Run.objects.filter(id=run_id).values_list("state", "version").first()
    if row is None:
        raise NotFound(f"run {run_id} does not exist")
    return row


@sync_to_async
def _commits_after(run_id: str, cursor: int) -> list[dict[str, Any]]:
    rows = ThreadCommit.objects.filter(run_id=run_id, seq__gt=cursor).order_by("seq")[:BATCH]
    return [commit_document(row) for row in rows]


class _Inbox:
    """The stream's channel, read with a timeout that never cancels a receive: channels_redis
    loses the message a cancelled ``receive`` was taking, so one receive stays pending from one
    wait to the next and is cancelled only when the stream ends."""

    def __init__(self, layer: BaseChannelLayer | None, channel: str | None) -> None:
        self.layer, self.channel = layer, channel
        self.pending: asyncio.Future[Any] | None = None

    async def receive(self, timeout: float) -> dict[str, Any] | None:
        if self.layer is None or self.channel is None:
            await asyncio.sleep(timeout)
            return None
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.layer.receive(self.channel))
        done, _ = await asyncio.wait((self.pending,), timeout=timeout)
        if not done:
            return None
        task, self.pending = self.pending, None
        return task.result()

    async def close(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            await asyncio.wait((self.pending,))
            self.pending = None


def _delta_event(message: dict[str, Any]) -> str:
    delta = {k: v for k, v in message.items() if k != "type"}
    return sse(event="delta", data={**delta, "confirmed": False})


async def stream_run(
    run_id: str, *, cursor: int, live: bool, timeout: float | None
) -> AsyncIterator[str]:
    """Yield the run's commits after ``cursor`` (and live deltas) until it has ended."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout is not None else None
    layer = get_channel_layer()
    group, channel = run_group(run_id), None
    if layer is not None:
        bind_to_running_loop()  # this process's live sends go to the loop viewers are on
        # Join before the first read, so a commit landing in between still wakes us.
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
    inbox = _Inbox(layer, channel)
    try:
        yield f"retry: {RETRY_MS}\n\n"
        stale, next_poll, next_keepalive = True, 0.0, loop.time() + KEEPALIVE_SECONDS
        while True:
            now = loop.time()
            if stale or now >= next_poll:
                while True:
                    commits = await _commits_after(run_id, cursor)
                    for commit in commits:
                        if live and ends_run(commit):
                            # The Ended commit closes the stream: first pass on the deltas that
                            # were sent before it and are still queued on the channel (the
                            # answer's last tokens), or they would never be delivered.
                            while queued := await inbox.receive(DRAIN_SECONDS):
                                if queued.get("type") == "run.delta":
                                    yield _delta_event(queued)
                        cursor = commit["seq"]
                        yield sse(event="commit", id=cursor, data={**commit, "confirmed": True})
                        if ends_run(commit):
                            end = {"run_id": run_id, "seq": cursor, **commit["disposition"]}
                            yield sse(event="end", data=end)
                            return
                    if len(commits) < BATCH:
                        break
                stale, next_poll = False, loop.time() + POLL_SECONDS
            now = loop.time()
            if deadline is not None and now >= deadline:
                return
            if now >= next_keepalive:
                yield ": keepalive\n\n"
                next_keepalive = now + KEEPALIVE_SECONDS
            wake = min(next_poll, next_keepalive)
            if deadline is not None:
                wake = min(wake, deadline)
            message = await inbox.receive(max(wake - now, 0.0))
            if message is None:
                continue
            if message.get("type") == "run.commit":
                stale = True
            elif message.get("type") == "run.delta" and live:
                yield _delta_event(message)
    finally:
        await inbox.close()
        if layer is not None and channel is not None:
            await layer.group_discard(group, channel)


@router.get(
    "/{run_id}/events",
    response=errors(401, 403, 404, 422),
    auth=read_auth,
    summary="Stream a run's commits (and live deltas) as Server-Sent Events",
    openapi_extra={
        "responses": {
            "200": {
                "description": "text/event-stream: `commit` events (id = commit sequence, "
                'data = the log entry with "confirmed": true), with ?live=1 `delta` events '
                '(no id, "confirmed": false), then one `end` event after the Ended commit.',
                "content": {"text/event-stream": EVENT_STREAM_CONTENT},
            },
            "204": {"description": "the run has ended and the client has every commit"},
        }
    },
)
async def run_events(
    request: HttpRequest,
    run_id: Id,
    query: Query[EventsQuery],
    last_event_id: int | None = Header(None, alias="Last-Event-ID", ge=0, le=MAX_SEQ),
) -> HttpResponse | StreamingHttpResponse:
    """Committed facts as they are committed; resume with ``Last-Event-ID`` (or ``?after=``)."""
    state, version = await _run_position(run_id)
    cursor = last_event_id if last_event_id is not None else (query.after or 0)
    if state == "ended" and cursor >= version:
        return HttpResponse(status=204)
    response = StreamingHttpResponse(
        stream_run(run_id, cursor=cursor, live=query.live, timeout=query.timeout),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
