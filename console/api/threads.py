"""``/threads``: create a thread, read its committed messages and runs, start a run on it."""

from __future__ import annotations

from typing import Any

from django.http import HttpRequest
from ninja import Router
from ninja.responses import Status

from console.api import runs
from console.api.auth import operate_auth, read_auth
from console.api.documents import SUMMARY_FIELDS, run_summaries
from console.api.errors import errors
from console.api.runs import IdempotencyKey
from console.api.schemas import CommittedOut, Id, RunIn, RunOut, ThreadIn, ThreadOut
from runtime import operations
from runtime.documents import snapshot
from runtime.errors import NotFound
from runtime.models import MessageRecord, Run, Thread

router = Router(tags=["threads"])


def thread_document(thread: Thread) -> dict[str, Any]:
    messages = MessageRecord.objects.filter(thread_id=thread.id).order_by("seq", "idx")
    thread_runs = Run.objects.filter(thread_id=thread.id).only(*SUMMARY_FIELDS)
    return {
        "id": thread.id,
        "created_at": thread.created_at.isoformat(),
        "version": thread.version,
        "active_run_id": thread.active_run_id,
        "metadata": thread.metadata,
        "messages": [
            {
                "run_id": m.run_id,
                "seq": m.seq,
                "role": m.role,
                "content": m.content,
                "tool_call_id": m.tool_call_id,
                "tool_calls": m.tool_calls,
                "name": m.name,
            }
            for m in messages
        ],
        "runs": run_summaries(list(thread_runs.order_by("created_at", "id"))),
    }


def _thread(thread_id: str) -> Thread:
    thread = Thread.objects.filter(id=thread_id).first()
    if thread is None:
        raise NotFound(f"thread {thread_id} does not exist")
    return thread


@router.post(
    "",
    response={201: ThreadOut, **errors(400, 401, 403, 422)},
    auth=operate_auth,
    summary="Create a thread",
)
def create_thread(request: HttpRequest, payload: ThreadIn | None = None) -> Status[Any]:
    """Create an empty thread; start runs on it with ``POST /threads/{id}/runs``."""
    thread_id = operations.create_thread(metadata=payload.metadata if payload else None)
    return Status(201, thread_document(_thread(thread_id)))


@router.get(
    "/{thread_id}",
    response={200: ThreadOut, **errors(401, 403, 404, 422)},
    auth=read_auth,
    summary="Read a thread: its committed messages and its runs",
)
def get_thread(request: HttpRequest, thread_id: Id) -> dict[str, Any]:
    with snapshot():  # its messages and runs from one moment of the log
        return thread_document(_thread(thread_id))


@router.post(
    "/{thread_id}/runs",
    response={201: RunOut, 202: CommittedOut, **errors(400, 401, 403, 404, 409, 422)},
    auth=operate_auth,
    by_alias=True,
    summary="Start a run on a thread",
)
def start_thread_run(
    request: HttpRequest, thread_id: Id, payload: RunIn, idempotency_key: IdempotencyKey = None
) -> Status[Any]:
    """Start a run on the thread. 409 ``run_active`` when the thread has a run that has not
    ended (``detail.active_run_id``); 404 ``unknown_agent`` lists the known agents under
    ``detail.known``. An ``Idempotency-Key`` works as for ``POST /runs``: the same key and
    body get 201 the run it started (also after the thread's run has ended), another body
    422 ``idempotency_key_reused``."""
    return runs.start(request, payload, thread_id=thread_id, idempotency_key=idempotency_key)
