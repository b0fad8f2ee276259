"""The hot path's budget, counted: statements per commit and per run, new connections per run.

On PostgreSQL a ThreadCommit is one statement whatever the number of calls and messages it
carries, and a whole demo run (start, claim, three ledger calls, a final answer) stays within
20 statements and opens no connection in steady state (issue: "the hot path"). A new
statement on this path fails here, so that adding one is a decision.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.db.backends.signals import connection_created

from runtime import operations
from runtime.coordinator import commit, read_head, read_run
from runtime.domain.model import Decision, EndCause, Permission, RunState
from runtime.loop import Services, ThreadPool
from runtime.loop import drive as loop_drive
from runtime.models import ThreadCommit
from runtime.providers.scripted import ScriptedProvider
from runtime.worker import Worker, claim, claim_many
from tests.domain import drafts
from tests.runtime.support import calls, run_row, text_step, tool_step

pytestmark = pytest.mark.django_db(transaction=True)
postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the one-statement commit is PostgreSQL's"
)

DEMO = tool_step(
    ("ledger_once", {"key": "a"}),
    ("ledger_reconnect", {"key": "b"}),
    ("ledger_replay", {"key": "c"}),
)
STATEMENTS_PER_RUN = 20


@dataclass
class Counted:
    statements: int = 0
    connections: int = 0


@contextmanager
def counting() -> Iterator[Counted]:
    """Count every statement run on any thread's connection, and every new connection."""
    counted = Counted()
    lock = threading.Lock()

    def wrapper(execute, sql, params, many, context):
        with lock:
            counted.statements += 1
        return execute(sql, params, many, context)

    def created(sender, connection, **kwargs):
        with lock:
            counted.connections += 1
        connection.execute_wrappers.append(wrapper)

    connection_created.connect(created)
    try:
        with connection.execute_wrapper(wrapper):
            yield counted
    finally:
        connection_created.disconnect(created)


def _held(run_id: str):
    view = read_run(run_id)
    assert view is not None
    return read_head(view.thread_id), view


@postgres_only
def test_every_commit_is_one_statement(make_run, make_calls):
    run = make_run()
    steps = [
        lambda head, view: drafts.infer_tools(head, view, make_calls(6)),
        lambda head, view: drafts.execute(head, view, view.batches[-1].calls[0].call_id),
        lambda head, view: drafts.complete(head, view, view.batches[-1].calls[0].call_id),
    ]
    for build in steps:
        head, view = _held(run.run_id)
        with counting() as counted:
            commit(build(head, view), head=head, before=view)
        assert counted.statements == 1
    for call in read_run(run.run_id).batches[-1].calls[1:]:
        head, view = _held(run.run_id)
        with counting() as counted:
            commit(drafts.complete(head, view, call.call_id), head=head, before=view)
        assert counted.statements == 1
    head, view = _held(run.run_id)
    with counting() as counted:  # six published results in one commit
        commit(drafts.finalize(head, view), head=head, before=view)
    assert counted.statements == 1


@postgres_only
def test_a_wait_resume_and_cancel_are_one_statement_each(make_run, make_calls):
    run = make_run()
    head, view = _held(run.run_id)
    commit(drafts.infer_tools(head, view, make_calls(3, permission=Permission.ASK)))
    for build in (
        lambda head, view: drafts.wait(head, view, view.batches[-1].calls[0].call_id, "tk1"),
        lambda head, view: drafts.resume(head, view, Decision.DENY),
        lambda head, view: drafts.wait(head, view, view.batches[-1].calls[1].call_id, "tk2"),
        lambda head, view: drafts.end(head, view, EndCause.CANCELLED),  # voids, seals, publishes
    ):
        head, view = _held(run.run_id)
        with counting() as counted:
            commit(build(head, view), head=head, before=view)
        assert counted.statements == 1


@postgres_only
def test_a_connection_prepares_the_commit_statement_once(make_run, make_calls):
    """Parameters are bound on the server (RUNTIME_DB_PREPARE), so psycopg prepares a
    statement from its fifth run on a connection: the commit is parsed and planned once."""
    run = make_run()
    head, view = _held(run.run_id)
    commit(drafts.infer_tools(head, view, make_calls(8)))
    for call in read_run(run.run_id).batches[-1].calls:
        head, view = _held(run.run_id)
        commit(drafts.complete(head, view, call.call_id), head=head, before=view)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'WITH head AS%%'"
        )
        assert cursor.fetchone()[0] >= 1


@postgres_only
def test_a_column_type_change_does_not_break_prepared_statements(make_run):
    """A migration on another connection changes the type of a column that a prepared
    statement returns: the next run of that statement is re-prepared, not refused ("cached
    plan must not change result type") until the process restarts."""
    import psycopg

    from runtime.models import Run
    from tests.subprocesses import subprocess_database_url

    run = make_run()
    for _ in range(6):  # prepared from the fifth run on this connection
        assert Run.objects.filter(id=run.run_id).values_list("step", flat=True).get() == 0
    with psycopg.connect(subprocess_database_url(), autocommit=True) as migration:
        migration.execute("ALTER TABLE runtime_run ALTER COLUMN step TYPE bigint")
        try:
            assert Run.objects.filter(id=run.run_id).values_list("step", flat=True).get() == 0
        finally:
            migration.execute("ALTER TABLE runtime_run ALTER COLUMN step TYPE integer")


def test_a_demo_run_stays_within_its_budget(start, settings):
    """Start, claim, three ledger calls and a final answer: at most 20 statements on
    PostgreSQL and no new connection once the worker's connections are open."""
    settings.RUNTIME_IDLE_POLL_SECONDS = 0.05
    worker = Worker(worker_id="counted", until_idle=True)
    tools = ThreadPool(1, "tools")
    try:
        start(DEMO, text_step())
        while worker.step(tools):  # the first run opens the connections a worker keeps
            pass
        with counting() as counted:
            run_id = start(DEMO, text_step())
            while worker.step(tools):
                pass
    finally:
        tools.close()
    assert (run_row(run_id).state, run_row(run_id).end_cause) == ("ended", "natural")
    assert [(c.phase, c.attempt) for c in calls(run_id)] == [("completed", 1)] * 3
    assert counted.connections == 0
    if connection.vendor == "postgresql":
        assert counted.statements <= STATEMENTS_PER_RUN
    else:  # statement by statement on SQLite, in-process and cheap; pinned all the same
        assert counted.statements <= 3 * STATEMENTS_PER_RUN


def test_a_thread_note_does_not_make_the_driver_ask_again(make_run, make_calls, drive, monkeypatch):
    """A reconciliation of an earlier run lands on the thread while the worker holds its run:
    the run did not move, so the worker commits its answer at the new thread version instead
    of reloading and asking the model again."""
    first = make_run()
    drive(drafts.infer_tools, first.run_id, make_calls(1))
    sealed = read_run(first.run_id).batches[-1].calls[0]
    drive(drafts.execute, first.run_id, sealed.call_id)
    drive(drafts.seal, first.run_id, sealed.call_id)
    drive(drafts.finalize, first.run_id)
    drive(drafts.infer_text, first.run_id, end=True)
    run_id = operations.start_run(
        agent="demo",
        input="go",
        metadata={"script": {"steps": [{"text": "done"}]}},
        thread_id=first.thread_id,
    )
    taken = claim("held")
    assert taken is not None and taken.run_id == run_id
    operations.reconcile(sealed.call_id, outcome="not_applied", actor="operator")
    inferences = []
    real = ScriptedProvider.infer
    monkeypatch.setattr(
        ScriptedProvider, "infer", lambda self, *a: inferences.append(1) or real(self, *a)
    )
    tools = ThreadPool(1, "tools")
    try:
        left = async_to_sync(loop_drive)(
            run_id, lease=taken.lease, services=Services.inline(tools), frontier=taken.frontier
        )
    finally:
        tools.close()
    assert (left.state, left.end_cause) == (RunState.ENDED, EndCause.NATURAL)
    assert len(inferences) == 1
    assert [c.actor for c in ThreadCommit.objects.filter(run_id=run_id).order_by("seq")] == [
        "",
        "worker:held",
    ]


def test_a_batch_claim_skips_runs_other_workers_hold(start):
    run_ids = [start(text_step()) for _ in range(3)]
    mine = claim_many("mine", 2)
    theirs = claim_many("theirs", 5)
    assert [taken.run_id for taken in mine] == run_ids[:2]  # oldest first
    assert [taken.run_id for taken in theirs] == run_ids[2:]
    assert claim_many("late", 5) == []
