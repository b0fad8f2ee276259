"""``GET /runs/{id}/events``: a run's committed facts as Server-Sent Events, as they commit.

Each commit is one ``commit`` event whose id is its sequence on the thread, so a client that
reconnects with ``Last-Event-ID`` gets exactly the commits after it: no gap, no repeat (a
thread's sequences become visible in order, because each commit takes the thread's head).
The log in the database is the source; a ``run.commit`` message on the run's channel-layer
group only wakes the stream early, and one poll per process (``_Watch``: a single query for
the versions of every run streamed from this process) covers workers in other processes that
cannot reach an in-memory layer. Database reads run on the thread pool, never on the event
loop and never on the one thread Django gives sync views, so open streams do not queue the
process's other requests behind their polls (issue 12, item 8). Every ACCESS_SECONDS the
stream checks that its token is still unrevoked and its user active and allowed to read;
when not, the stream ends. The streams of one token share that check (``_ACCESS``: one read
per token and process every ACCESS_FRESH seconds, however many streams it has open). With
``?live=1`` the stream also forwards the group's ``run.delta`` messages as ``delta`` events
flagged ``"confirmed": false`` and without an id: they are not thread truth and are never
replayed. The stream ends after the run's Ended
commit (then an ``end`` event); a client that already has it gets 204, which also stops a
browser's EventSource from reconnecting.
"""

from __future__ import annotations

import asyncio
import json
import logging
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from channels.layers import BaseChannelLayer, get_channel_layer
from django.db import connection
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from ninja import Field, Header, Query, Router, Schema

from console.api.auth import read_auth, token_still_allows
from console.api.documents import commit_document, ends_run
from console.api.errors import errors
from console.api.schemas import MAX_SEQ, Id
from console.db import ACCESS_FRESH, ACCESS_SECONDS, SharedAnswers, off_loop
from console.models import READ
from runtime.errors import NotFound
from runtime.live import Viewing, bind_to_running_loop, run_group
from runtime.models import Run, ThreadCommit

router = Router(tags=["runs"])

POLL_SECONDS = 0.25  # the longest a commit from another process waits to be seen
DRAIN_SECONDS = 0.05  # before the Ended commit: the wait for a delta still in transit
KEEPALIVE_SECONDS = 15.0  # a comment line keeps proxies from closing an idle stream
BATCH = 200  # commits read per query while catching up
RETRY_MS = 1000  # how soon a disconnected EventSource reconnects

log = logging.getLogger("console.api")


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


def _run_position(run_id: str) -> tuple[str, int]:
    """The run's state and version; raises NotFound. Then the request's thread gives back
    the connection its authentication and this read used: Django would close it only when
    the response ends, so every open stream would hold one (the stream reads off_loop)."""
    try:
        row = Run.objects.filter(id=run_id).values_list("state", "version").first()
    finally:
        if not connection.in_atomic_block:  # a test's transaction is not ours to end
            connection.close()
    if row is None:
        raise NotFound(f"run {run_id} does not exist")
    return row


@off_loop
def _commits_after(run_id: str, cursor: int) -> list[dict[str, Any]]:
    rows = ThreadCommit.objects.filter(run_id=run_id, seq__gt=cursor).order_by("seq")[:BATCH]
    return [commit_document(row) for row in rows]


@off_loop
def _versions(run_ids: list[str]) -> dict[str, int]:
    return dict(Run.objects.filter(id__in=run_ids).values_list("id", "version"))


_ACCESS = SharedAnswers(fresh=ACCESS_FRESH)


class _Watch:
    """One look at the log per POLL_SECONDS for every stream of this process: a single query
    reads the versions of the runs streamed, and the streams of runs that moved are woken.
    A run's version moves in the transaction of its commit, so no commit is missed."""

    def __init__(self) -> None:
        self.waiting: dict[str, set[asyncio.Event]] = {}
        self.seen: dict[str, int] = {}
        self.task: asyncio.Task[None] | None = None

    def join(self, run_id: str) -> asyncio.Event:
        event = asyncio.Event()
        self.waiting.setdefault(run_id, set()).add(event)
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._loop())
        return event

    def leave(self, run_id: str, event: asyncio.Event) -> None:
        events = self.waiting.get(run_id, set())
        events.discard(event)
        if not events:
            self.waiting.pop(run_id, None)
            self.seen.pop(run_id, None)

    async def _loop(self) -> None:
        while self.waiting:
            try:
                versions = await _versions(list(self.waiting))
            except Exception:  # a database hiccup: the next look tries again
                log.warning("the stream watch could not read the log", exc_info=True)
                versions = {}
            for run_id, version in versions.items():
                if self.seen.get(run_id) != version:
                    self.seen[run_id] = version
                    for event in self.waiting.get(run_id, ()):
                        event.set()
            await asyncio.sleep(POLL_SECONDS)


_watches: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watch] = weakref.WeakKeyDictionary()


def _watch() -> _Watch:
    loop = asyncio.get_running_loop()
    if loop not in _watches:
        _watches[loop] = _Watch()
    return _watches[loop]


class _Inbox:
    """The stream's wake-ups: its channel and its watch event, read with a timeout that never
    cancels a receive (channels_redis loses the message a cancelled ``receive`` was taking, so
    one receive stays pending from one wait to the next and is cancelled only at the end)."""

    def __init__(
        self, layer: BaseChannelLayer | None, channel: str | None, watched: asyncio.Event
    ) -> None:
        self.layer, self.channel, self.watched = layer, channel, watched
        self.pending: asyncio.Future[Any] | None = None

    async def receive(self, timeout: float) -> dict[str, Any] | None:
        """The next channel message, a ``run.commit`` when the watch saw the run move, or
        None after ``timeout`` seconds."""
        if self.watched.is_set():
            self.watched.clear()
            return {"type": "run.commit"}
        if self.pending is None and self.layer is not None and self.channel is not None:
            self.pending = asyncio.ensure_future(self.layer.receive(self.channel))
        watching = asyncio.ensure_future(self.watched.wait())
        waits = {watching} | ({self.pending} if self.pending is not None else set())
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watching.cancel()
        if self.pending is not None and self.pending.done():
            task, self.pending = self.pending, None
            return task.result()
        if self.watched.is_set():
            self.watched.clear()
            return {"type": "run.commit"}
        return None

    async def close(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            await asyncio.wait((self.pending,))
            self.pending = None


def _delta_event(message: dict[str, Any]) -> str:
    delta = {k: v for k, v in message.items() if k != "type"}
    return sse(event="delta", data={**delta, "confirmed": False})


async def stream_run(
    run_id: str,
    *,
    cursor: int,
    live: bool,
    timeout: float | None,
    allowed: Callable[[], Awaitable[bool]] | None = None,
) -> AsyncIterator[str]:
    """Yield the run's commits after ``cursor`` (and live deltas) until it has ended, the
    timeout passes, or ``allowed()`` (checked every ACCESS_SECONDS) says no more."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout if timeout is not None else None
    layer = get_channel_layer()
    group, channel = run_group(run_id), None
    viewing = Viewing(run_id) if live else None  # only a stream of deltas asks for them
    if layer is not None:
        bind_to_running_loop()  # this process's live sends go to the loop viewers are on
        if viewing is not None:
            await viewing.start()
        # Join before the first read, so a commit landing in between still wakes us.
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
    watch = _watch()
    watched = watch.join(run_id)
    inbox = _Inbox(layer, channel, watched)
    try:
        yield f"retry: {RETRY_MS}\n\n"
        stale = True
        next_access = loop.time() + ACCESS_SECONDS
        next_keepalive = loop.time() + KEEPALIVE_SECONDS
        while True:
            if stale:
                async for event in _catch_up(run_id, cursor, live, inbox):
                    if isinstance(event, int):
                        cursor = event
                        continue
                    yield event
                    if event.startswith("event: end\n"):
                        return
                stale = False
            now = loop.time()
            if deadline is not None and now >= deadline:
                return
            if allowed is not None and now >= next_access:
                if not await allowed():
                    return
                next_access = now + ACCESS_SECONDS
            if now >= next_keepalive:
                yield ": keepalive\n\n"
                next_keepalive = now + KEEPALIVE_SECONDS
            wake = min(next_keepalive, next_access if allowed is not None else next_keepalive)
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
        if viewing is not None:
            await viewing.stop()
        watch.leave(run_id, watched)
        await inbox.close()
        if layer is not None and channel is not None:
            await layer.group_discard(group, channel)


async def _catch_up(
    run_id: str, cursor: int, live: bool, inbox: _Inbox
) -> AsyncIterator[str | int]:
    """Yield the events of every commit after ``cursor``, each followed by its sequence (an
    int: the new cursor); after the Ended commit, its ``end`` event last."""
    while True:
        commits = await _commits_after(run_id, cursor)
        for commit in commits:
            if live and ends_run(commit):
                # The Ended commit closes the stream: first pass on the deltas that were sent
                # before it and are still queued on the channel (the answer's last tokens).
                while queued := await inbox.receive(DRAIN_SECONDS):
                    if queued.get("type") == "run.delta":
                        yield _delta_event(queued)
            cursor = commit["seq"]
            yield sse(event="commit", id=cursor, data={**commit, "confirmed": True})
            yield cursor
            if ends_run(commit):
                end = {"run_id": run_id, "seq": cursor, **commit["disposition"]}
                yield sse(event="end", data=end)
                return
        if len(commits) < BATCH:
            return


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
def run_events(
    request: HttpRequest,
    run_id: Id,
    query: Query[EventsQuery],
    last_event_id: int | None = Header(None, alias="Last-Event-ID", ge=0, le=MAX_SEQ),
) -> HttpResponse | StreamingHttpResponse:
    """Committed facts as they are committed; resume with ``Last-Event-ID`` (or ``?after=``)."""
    # A sync view: authentication and this read run on the request's thread with the rest
    # of the request, in one hand-over from the event loop; the stream it returns is async,
    # and Django's ASGI handler iterates it on the loop.
    state, version = _run_position(run_id)
    cursor = last_event_id if last_event_id is not None else (query.after or 0)
    if state == "ended" and cursor >= version:
        return HttpResponse(status=204)
    token_id = getattr(request, "api_token_id", None)

    async def allowed() -> bool:
        if token_id is None:
            return False
        return await _ACCESS.ask(
            (token_id, READ), lambda: off_loop(token_still_allows)(token_id, READ)
        )

    response = StreamingHttpResponse(
        stream_run(run_id, cursor=cursor, live=query.live, timeout=query.timeout, allowed=allowed),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
