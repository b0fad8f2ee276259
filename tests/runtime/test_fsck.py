"""The log checker: a clean log exits 0; a hand-corrupted projection or log is reported as
``thread=<id> seq=<n> <what>`` and exits non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from datetime import timedelta
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db.models import F
from django.utils import timezone

from runtime import codec, fsck
from runtime.coordinator import read_head, read_run
from runtime.domain.model import Decision, Permission, RecoveryPolicy, TicketKind
from runtime.models import (
    MessageRecord,
    ReconciliationRecord,
    Run,
    Thread,
    ThreadCommit,
    Ticket,
    ToolCallRecord,
)
from tests.domain import drafts
from tests.subprocesses import subprocess_database_url

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Busy:
    """A thread with every kind of projection row: an ended run whose batch had a completed
    call and a sealed one (with a consumed ticket and a reconciliation), then an Awaiting run
    with an open ticket; plus its ids for corrupting."""

    thread_id: str
    ended_run: str
    active_run: str
    done_call: str
    sealed_call: str
    open_ticket: str
    consumed_ticket: str


@pytest.fixture
def busy_thread(make_run, make_calls, drive):
    """Return ``make() -> Busy`` (see Busy)."""

    def make() -> Busy:
        first = make_run(text="pay the invoice", system="be careful", metadata={"who": "me"})
        rid = first.run_id
        allow = make_calls(2, permission=Permission.ALLOW)[0]
        ask = make_calls(2, permission=Permission.ASK, policy=RecoveryPolicy.INDETERMINATE)[1]
        drive(drafts.infer_tools, rid, (allow, ask))
        drive(drafts.execute, rid, allow.call_id)
        drive(drafts.complete, rid, allow.call_id, result='{"ok": true}')
        consumed = "tkc" + rid[:20]
        drive(drafts.wait, rid, ask.call_id, consumed)
        drive(drafts.resume, rid, Decision.APPROVE)
        drive(drafts.execute, rid, ask.call_id)
        drive(drafts.seal, rid, ask.call_id, reason="worker lost mid-call")
        drive(drafts.finalize, rid)
        drive(drafts.reconcile, rid, ask.call_id, outcome="applied")
        drive(drafts.infer_text, rid, text="paid", end=True)
        second = make_run(first.thread_id, text="and the next one")
        drive(drafts.infer_tools, second.run_id, make_calls(1, permission=Permission.ASK))
        second_view = read_run(second.run_id)
        assert second_view is not None
        waiting = second_view.batches[-1].calls[0]
        opened = "tko" + second.run_id[:20]
        drive(drafts.wait, second.run_id, waiting.call_id, opened, kind=TicketKind.INPUT)
        return Busy(
            thread_id=first.thread_id,
            ended_run=rid,
            active_run=second.run_id,
            done_call=allow.call_id,
            sealed_call=ask.call_id,
            open_ticket=opened,
            consumed_ticket=consumed,
        )

    return make


def fsck_command(*args: str) -> tuple[int, str]:
    """Run the command in-process: (exit code, stdout)."""
    out = StringIO()
    try:
        call_command("runtime_fsck", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


# -- clean ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_clean_log_exits_zero(busy_thread, make_thread):
    busy = busy_thread()
    make_thread()  # an empty thread is clean too
    assert fsck.check() == []
    code, out = fsck_command()
    assert code == 0
    assert out.strip() == "checked 2 thread(s): 0 violation(s)"
    assert fsck_command("--thread", busy.thread_id) == (
        0,
        "checked 1 thread(s): 0 violation(s)\n",
    )
    code, out = fsck_command("--json")
    assert code == 0
    assert json.loads(out) == {"threads": 2, "violations": [], "ok": True}


@pytest.mark.django_db
def test_an_unknown_thread_is_a_usage_error():
    with pytest.raises(CommandError, match="does not exist") as excinfo:
        call_command("runtime_fsck", "--thread", "nope", stdout=StringIO())
    assert excinfo.value.returncode == 2


@pytest.mark.django_db
def test_since_checks_exactly_the_threads_with_a_recent_commit(busy_thread, make_thread):
    old, recent = busy_thread(), busy_thread()
    quiet = make_thread()  # no commit at all: never a candidate
    ThreadCommit.objects.filter(thread_id=old.thread_id).update(
        created_at=timezone.now() - timedelta(days=10)
    )
    # The old thread's projection disagrees with its log: only a full check sees it.
    ToolCallRecord.objects.filter(id=old.done_call).update(result="forged")
    assert fsck.recent_threads(timezone.now() - timedelta(days=1)) == [recent.thread_id]
    assert fsck.recent_threads(timezone.now() - timedelta(days=11)) == sorted(
        [old.thread_id, recent.thread_id]
    )
    assert quiet not in fsck.recent_threads(timezone.now() - timedelta(days=365))
    code, out = fsck_command("--since", "1", "--json")
    assert (code, json.loads(out)) == (0, {"threads": 1, "violations": [], "ok": True})
    assert fsck_command("--since", "0.5") == (0, "checked 1 thread(s): 0 violation(s)\n")
    code, out = fsck_command("--since", "11")
    assert code == 1
    assert out.splitlines()[-1] == "checked 2 thread(s): 1 violation(s)"
    assert fsck_command()[0] == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--thread", "x", "--since", "1"), "--thread and --since exclude each other"),
        (("--since", "-1"), "--since must be 0 or more days"),
    ],
)
def test_since_refuses_a_thread_and_a_negative_number_of_days(args, message):
    with pytest.raises(CommandError, match=message) as excinfo:
        call_command("runtime_fsck", *args, stdout=StringIO())
    assert excinfo.value.returncode == 2


# -- corrupted projections -------------------------------------------------------------------


def _busy_seq(busy: Busy, run_id: str) -> int:
    return Run.objects.get(id=run_id).version


CORRUPTIONS = {
    "run state": (
        lambda b: Run.objects.filter(id=b.active_run).update(state="running"),
        lambda b: f"run {b.active_run}: state is 'running', the log says 'awaiting'",
    ),
    "run end cause": (
        lambda b: Run.objects.filter(id=b.ended_run).update(end_cause="cancelled"),
        lambda b: f"run {b.ended_run}: end_cause is 'cancelled', the log says 'natural'",
    ),
    "run step": (
        lambda b: Run.objects.filter(id=b.ended_run).update(step=F("step") + 1),
        lambda b: f"run {b.ended_run}: step is 3, the log says 2",
    ),
    "run version": (
        lambda b: Run.objects.filter(id=b.ended_run).update(version=1),
        lambda b: f"run {b.ended_run}: version is 1, the log says",
    ),
    "run metadata": (
        lambda b: Run.objects.filter(id=b.ended_run).update(metadata={}),
        lambda b: f"run {b.ended_run}: metadata is {{}}, the log says {{'who': 'me'}}",
    ),
    "run snapshot": (
        lambda b: Run.objects.filter(id=b.active_run).update(snapshot={"step": 9}),
        lambda b: f"run {b.active_run}: snapshot differs from the fold at ['agent', 'batches'",
    ),
    "a run row the log never activated": (
        lambda b: Run.objects.create(thread_id=b.thread_id, agent="ghost", state="ended"),
        lambda b: "Run row with no activation in the log",
    ),
    "a second non-Ended run": (
        lambda b: Run.objects.filter(id=b.ended_run).update(state="running", end_cause=None),
        lambda b: f"2 runs are not Ended: {sorted([b.ended_run, b.active_run])}",
    ),
    "thread version": (
        lambda b: Thread.objects.filter(id=b.thread_id).update(version=F("version") + 1),
        lambda b: "thread: version is",
    ),
    "thread active run": (
        lambda b: Thread.objects.filter(id=b.thread_id).update(active_run=None),
        lambda b: f"thread: active_run is None, the log says '{b.active_run}'",
    ),
    "call phase (Executing back to Requested)": (
        lambda b: ToolCallRecord.objects.filter(id=b.sealed_call).update(
            phase="requested", attempt=0
        ),
        lambda b: f"call {b.sealed_call}: phase is 'requested', the log says 'indeterminate'",
    ),
    "call result": (
        lambda b: ToolCallRecord.objects.filter(id=b.done_call).update(result="forged"),
        lambda b: f"call {b.done_call}: result is 'forged', the log says '{{\"ok\": true}}'",
    ),
    "call is_error": (
        lambda b: ToolCallRecord.objects.filter(id=b.done_call).update(is_error=True),
        lambda b: f"call {b.done_call}: is_error is True, the log says False",
    ),
    "batch finalized with a call unfinished": (
        lambda b: ToolCallRecord.objects.filter(run_id=b.active_run).update(batch_finalized=True),
        lambda b: "its batch is finalized but it is awaiting",
    ),
    "a call row deleted": (
        lambda b: ToolCallRecord.objects.filter(id=b.done_call).delete(),
        lambda b: f"call {b.done_call}: no ToolCallRecord row",
    ),
    "open ticket closed": (
        lambda b: Ticket.objects.filter(id=b.open_ticket).update(state="consumed"),
        lambda b: (
            f"ticket {b.open_ticket}: state is 'consumed' but the run's current ticket "
            f"is '{b.open_ticket}'"
        ),
    ),
    "consumed ticket reopened": (
        lambda b: Ticket.objects.filter(id=b.consumed_ticket).update(state="open"),
        lambda b: (
            f"ticket {b.consumed_ticket}: state is 'open' but the run's current ticket is None"
        ),
    ),
    "ticket decision": (
        lambda b: Ticket.objects.filter(id=b.consumed_ticket).update(decision="deny"),
        lambda b: f"ticket {b.consumed_ticket}: decision is 'deny', the log says 'approve'",
    ),
    "message content": (
        lambda b: MessageRecord.objects.filter(thread_id=b.thread_id, seq=1, idx=1).update(
            content="pay twice"
        ),
        lambda b: "seq=1 message 1: content is 'pay twice', the log says 'pay the invoice'",
    ),
    "a message row deleted": (
        lambda b: MessageRecord.objects.filter(thread_id=b.thread_id, role="tool").delete(),
        lambda b: "message 0: no MessageRecord row",
    ),
    "a message row added": (
        lambda b: MessageRecord.objects.create(
            thread_id=b.thread_id, run_id=b.active_run, seq=99, idx=0, role="assistant"
        ),
        lambda b: "seq=99 message 0: MessageRecord row not in the log",
    ),
    "reconciliation outcome": (
        lambda b: ReconciliationRecord.objects.filter(thread_id=b.thread_id).update(
            outcome="not_applied"
        ),
        lambda b: f"reconciliation of call {b.sealed_call} (not_applied): row not in the log",
    ),
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_corrupted_projection_is_reported(name, busy_thread):
    busy = busy_thread()
    other = busy_thread()  # a clean neighbour stays clean
    corrupt, expected = CORRUPTIONS[name]
    corrupt(busy)
    violations = fsck.check()
    assert violations, "the corruption went unnoticed"
    assert {v.thread_id for v in violations} == {busy.thread_id}
    lines = [str(v) for v in violations]
    assert any(expected(busy) in line for line in lines), lines
    assert all(line.startswith(f"thread={busy.thread_id} seq=") for line in lines)

    code, out = fsck_command()
    assert code == 1
    assert out.splitlines()[:-1] == lines
    assert out.splitlines()[-1] == f"checked 2 thread(s): {len(lines)} violation(s)"
    assert fsck_command("--thread", other.thread_id)[0] == 0
    code, out = fsck_command("--json", "--thread", busy.thread_id)
    document = json.loads(out)
    assert code == 1 and document["ok"] is False and document["threads"] == 1
    assert document["violations"] == [v.as_dict() for v in violations]


@pytest.mark.django_db
def test_the_violation_names_the_commit_to_blame(busy_thread):
    busy = busy_thread()
    Run.objects.filter(id=busy.active_run).update(state="running")
    (violation,) = fsck.check_thread(busy.thread_id)
    assert violation.seq == _busy_seq(busy, busy.active_run) == read_head(busy.thread_id).version
    assert violation.what == f"run {busy.active_run}: state is 'running', the log says 'awaiting'"


# -- corrupted logs: the fold's refusal, at the sequence that breaks it ----------------------


def _append(thread_id: str, seq: int, run_id: str | None, draft) -> None:
    ThreadCommit.objects.create(
        thread_id=thread_id,
        seq=seq,
        run_id=run_id,
        disposition=codec.dump_disposition(draft.disposition),
        messages=[codec.dump_message(m) for m in draft.messages],
        events=[codec.dump_event(e) for e in draft.events],
    )


@pytest.mark.django_db
def test_a_commit_after_ended_is_reported(busy_thread):
    busy = busy_thread()
    ended = read_run(busy.ended_run)
    seq = read_head(busy.thread_id).version + 1
    late = drafts.infer_text(read_head(busy.thread_id), ended, text="after the end")
    _append(busy.thread_id, seq, busy.ended_run, late)
    (violation,) = fsck.check_thread(busy.thread_id)
    assert violation.seq == seq
    assert violation.what.startswith("log refused: run_ended:")
    code, out = fsck_command("--thread", busy.thread_id)
    assert code == 1 and f"thread={busy.thread_id} seq={seq} log refused: run_ended" in out


@pytest.mark.django_db
def test_requesting_an_executed_call_again_is_reported(make_run, make_calls, drive):
    """Executing is never turned back into Requested: a later batch that lists a call the log
    already executed is refused by the fold."""
    run = make_run()
    (call,) = make_calls(1)
    drive(drafts.infer_tools, run.run_id, (call,))
    drive(drafts.execute, run.run_id, call.call_id)
    drive(drafts.complete, run.run_id, call.call_id)
    drive(drafts.finalize, run.run_id)
    head, view = read_head(run.thread_id), read_run(run.run_id)
    forged = drafts.infer_tools(head, view, (call,))  # the same call, Requested again
    _append(run.thread_id, head.version + 1, run.run_id, forged)
    (violation,) = fsck.check_thread(run.thread_id)
    assert violation.seq == head.version + 1
    assert violation.what == (
        "log refused: invalid_commit: a call id or operation id of an earlier batch is never reused"
    )


@pytest.mark.django_db
def test_a_gap_in_the_log_is_reported(busy_thread):
    busy = busy_thread()
    ThreadCommit.objects.filter(thread_id=busy.thread_id, seq=3).delete()
    (violation,) = fsck.check_thread(busy.thread_id)
    assert violation.seq == 4
    assert violation.what == "log refused: invalid_commit: sequence 4 does not follow 2"


@pytest.mark.django_db
def test_an_undecodable_commit_is_reported(busy_thread):
    busy = busy_thread()
    ThreadCommit.objects.filter(thread_id=busy.thread_id, seq=2).update(
        events=[{"type": "NoSuchEvent"}]
    )
    (violation,) = fsck.check_thread(busy.thread_id)
    assert violation.seq == 2
    assert "does not decode" in violation.what


@pytest.mark.django_db
def test_results_published_out_of_call_order_are_reported(busy_thread):
    busy = busy_thread()
    row = next(
        r
        for r in ThreadCommit.objects.filter(thread_id=busy.thread_id).order_by("seq")
        if any(e["type"] == "BatchFinalized" for e in r.events)
    )
    ThreadCommit.objects.filter(pk=row.pk).update(messages=list(reversed(row.messages)))
    (violation,) = fsck.check_thread(busy.thread_id)
    assert violation.seq == row.seq
    assert "in call order" in violation.what


@pytest.mark.django_db
def test_finalizing_before_every_call_is_terminal_is_reported(busy_thread):
    busy = busy_thread()
    rows = list(ThreadCommit.objects.filter(thread_id=busy.thread_id).order_by("seq"))
    seal = next(r for r in rows if any(e["type"] == "CallIndeterminate" for e in r.events))
    finalize = next(r for r in rows if any(e["type"] == "BatchFinalized" for e in r.events))
    # Swap the two commits' contents: the batch is finalized while a call still executes.
    ThreadCommit.objects.filter(pk=seal.pk).update(
        events=finalize.events, messages=finalize.messages
    )
    ThreadCommit.objects.filter(pk=finalize.pk).update(events=seal.events, messages=seal.messages)
    (violation,) = fsck.check_thread(busy.thread_id)
    assert violation.seq == seal.seq
    assert "are not terminal" in violation.what


# -- the real command line --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_manage_py_exits_zero_then_one(busy_thread):
    busy = busy_thread()
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    command = [sys.executable, "manage.py", "runtime_fsck", "--thread", busy.thread_id]

    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )

    clean = run()
    assert clean.returncode == 0, clean.stderr
    assert "0 violation(s)" in clean.stdout
    ToolCallRecord.objects.filter(id=busy.sealed_call).update(phase="executing")
    broken = run()
    assert broken.returncode == 1
    assert f"thread={busy.thread_id} seq=" in broken.stdout
    assert f"call {busy.sealed_call}: phase is 'executing'" in broken.stdout
    assert "disagree" in broken.stderr
