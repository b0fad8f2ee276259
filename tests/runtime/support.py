"""Read-only views of the committed log for the loop, crash, worker, resume and cancel tests.

Everything here reads committed facts only (the log and its projections), the way an operator
or a recovering worker would; nothing writes.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction

from runtime import codec, fsck
from runtime.agents import get_agent
from runtime.coordinator import Lease, read_run
from runtime.demo.models import LedgerEffect
from runtime.domain.commit import CommitDraft, apply_commit
from runtime.domain.events import BatchOpened, CallExecuting, ReconciliationRecorded
from runtime.domain.model import CallPhase, ThreadHead
from runtime.loop import Frontier, RunDriver, Services, ThreadPool
from runtime.models import MessageRecord, Run, ThreadCommit, ToolCallRecord

# What a tool's recovery policy is called in the issue, and the demo tool that carries it.
POLICY_TOOLS = {
    "replay": "ledger_replay",
    "reconnect": "ledger_reconnect",
    "indeterminate": "ledger_once",
}


def tool_step(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    """One scripted response with ``calls`` as its batch, in this order."""
    return {"tool_calls": [{"name": name, "arguments": args} for name, args in calls]}


def text_step(text: str = "done") -> dict[str, Any]:
    return {"text": text}


def run_row(run_id: str) -> Run:
    return Run.objects.get(id=run_id)


def calls(run_id: str) -> list[ToolCallRecord]:
    """The run's tool calls (projection), in step and call order."""
    return list(ToolCallRecord.objects.filter(run_id=run_id).order_by("step", "index"))


def ledger(run_id: str) -> dict[str, dict[str, Any]]:
    """The effect ledger of a run by operation id: {"tool", "key", "applied"}."""
    return {
        row.operation_id: {"tool": row.tool, "key": row.key, "applied": row.applied}
        for row in LedgerEffect.objects.filter(run_id=run_id)
    }


def applied(call: ToolCallRecord) -> int:
    """How many times the ledger saw the call's operation id applied (0: never)."""
    row = LedgerEffect.objects.filter(operation_id=call.operation_id).first()
    return row.applied if row else 0


def commit_count(thread_id: str) -> int:
    return ThreadCommit.objects.filter(thread_id=thread_id).count()


def drafts(thread_id: str) -> list[tuple[int, CommitDraft]]:
    """The thread's ThreadCommit rows decoded into CommitDrafts, oldest first."""
    return [
        (
            row.seq,
            CommitDraft(
                thread_id=thread_id,
                run_id=row.run_id,
                expected_version=row.seq - 1,
                disposition=codec.load_disposition(row.disposition),
                messages=tuple(codec.load_message(m) for m in row.messages),
                events=tuple(codec.load_event(e) for e in row.events),
                actor=row.actor,
            ),
        )
        for row in ThreadCommit.objects.filter(thread_id=thread_id).order_by("seq")
    ]


def phase_history(thread_id: str) -> dict[str, list[CallPhase]]:
    """Every call's phase after each commit of the thread, folded from the log."""
    head = ThreadHead(thread_id=thread_id)
    runs: dict[str, Any] = {}
    history: dict[str, list[CallPhase]] = defaultdict(list)
    for _, draft in drafts(thread_id):
        target = draft.run_id or next(
            (e.run_id for e in draft.events if isinstance(e, ReconciliationRecorded)), None
        )
        head, run = apply_commit(head, runs.get(target or ""), draft)
        if run is None or draft.run_id is None:
            continue
        runs[run.run_id] = run
        for batch in run.batches:
            for call in batch.calls:
                history[call.call_id].append(call.phase)
    return history


def assert_log_sound(run_id: str) -> None:
    """The log of the run's thread folds cleanly, matches its projections, and no call is
    ever seen Requested again after an Executing commit (by its events and by the fold)."""
    thread_id = run_row(run_id).thread_id
    assert fsck.check_thread(thread_id) == []
    executing: set[str] = set()
    for seq, draft in drafts(thread_id):
        for event in draft.events:
            if isinstance(event, BatchOpened):
                reopened = {c.call_id for c in event.calls} & executing
                assert not reopened, f"seq {seq} requests calls {reopened} again"
            if isinstance(event, CallExecuting):
                executing.add(event.call_id)
    for call_id, phases in phase_history(thread_id).items():
        if CallPhase.EXECUTING in phases:
            after = phases[phases.index(CallPhase.EXECUTING) :]
            assert CallPhase.REQUESTED not in after, f"call {call_id} went back: {phases}"
    for call in calls(run_id):
        if call.attempt:
            assert call.phase != CallPhase.REQUESTED.value


def executing_workers(run_id: str) -> dict[str, list[tuple[int, str]]]:
    """Each call's committed executor attempts as (attempt, worker), in commit order."""
    thread_id = run_row(run_id).thread_id
    attempts: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for _, draft in drafts(thread_id):
        for event in draft.events:
            if isinstance(event, CallExecuting):
                attempts[event.call_id].append((event.attempt, event.worker))
    return attempts


def assistant_messages(run_id: str) -> list[MessageRecord]:
    return list(MessageRecord.objects.filter(run_id=run_id, role="assistant").order_by("seq"))


def rebuilt_request(run_id: str, before_seq: int) -> Any:
    """The inference request a fresh worker builds from the committed state as it was just
    before commit ``before_seq``.

    The later messages are hidden inside a transaction that is rolled back, so the request is
    built by ``RunDriver.request`` itself, exactly as a worker builds it.
    """
    run = read_run(run_id)
    assert run is not None
    tools = ThreadPool(1, "tools")
    driver = RunDriver(
        run_id,
        lease=Lease(worker_id="test", epoch=0, ttl=timedelta(seconds=1)),
        services=Services.inline(tools),
        frontier=Frontier(run=run, version=run.version),
    )
    try:
        with transaction.atomic():
            MessageRecord.objects.filter(thread_id=run.thread_id, seq__gte=before_seq).delete()
            request = async_to_sync(driver.request)(get_agent(run.agent), run)
            transaction.set_rollback(True)
    finally:
        tools.close()
    return request


def wait_for(predicate: Callable[[], Any], *, timeout: float = 20, what: str = "") -> Any:
    """Poll ``predicate`` every 20 ms until it returns a true value; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    pytest.fail(f"timed out after {timeout}s waiting for {what or predicate}")


def twins(call: Callable[[], Any]) -> list[Any]:
    """Make ``call`` twice at the same instant from two threads (two database connections);
    return what each returned, or the error it raised."""
    barrier = threading.Barrier(2)
    answers: list[Any] = [None, None]

    def one(i: int) -> None:
        barrier.wait()
        try:
            answers[i] = call()
        except Exception as exc:
            answers[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers
