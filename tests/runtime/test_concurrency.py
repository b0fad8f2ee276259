"""Writers racing for one thread's head: exactly one wins each version, the others get
VersionConflict, and the log stays linear with projections equal to its fold.

Each writer is a Python thread with its own Django connection (Django's connections are per
thread), released together by a threading.Barrier. On PostgreSQL the coordinator's row lock on
the thread makes the loser wait and then see the moved head; on SQLite the IMMEDIATE
transaction's write lock and busy timeout do the same (console/settings.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection, transaction

from runtime import fsck
from runtime.coordinator import commit, read_head, read_run
from runtime.domain.commit import fold
from runtime.domain.model import EndCause, RunState
from runtime.errors import RunAlreadyActive, VersionConflict
from runtime.models import Run, Thread, ThreadCommit
from tests.domain import drafts
from tests.runtime.test_coordinator import state_of

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT = 30  # seconds: a writer stuck longer than this is a failure, not a slow test


def race(*writers: Callable[[], Any]) -> list[tuple[str, Any]]:
    """Run ``writers`` at once, each on its own thread and connection; return, in order,
    ("won", result) or ("conflict", VersionConflict) or ("error", exception) for each."""
    barrier = threading.Barrier(len(writers), timeout=TIMEOUT)
    outcomes: list[tuple[str, Any]] = [("error", None)] * len(writers)

    def work(i: int, writer: Callable[[], Any]) -> None:
        try:
            barrier.wait()
            outcomes[i] = ("won", writer())
        except VersionConflict as exc:
            outcomes[i] = ("conflict", exc)
        except Exception as exc:  # reported, then asserted by the caller
            outcomes[i] = ("error", exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(i, w)) for i, w in enumerate(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "a writer is stuck"
    return outcomes


def assert_linear_and_folded(thread_id: str) -> None:
    """The log is 1..n without gaps, the head is at n, and the projections are the fold."""
    seqs = list(
        ThreadCommit.objects.filter(thread_id=thread_id)
        .order_by("seq")
        .values_list("seq", flat=True)
    )
    assert seqs == list(range(1, len(seqs) + 1))
    assert Thread.objects.get(id=thread_id).version == len(seqs)
    assert fsck.check_thread(thread_id) == []
    folded = fold(thread_id, fsck.read_log(thread_id))
    for run_id, run in folded.runs.items():
        assert read_run(run_id) == run


def test_two_writers_on_the_same_version_exactly_one_wins(make_run, drive):
    run = make_run()
    thread_id = run.thread_id
    for round_ in range(10):
        head, view = read_head(thread_id), read_run(run.run_id)
        a = drafts.infer_text(head, view, text=f"worker A round {round_}")
        b = drafts.infer_text(head, view, text=f"worker B round {round_}")
        outcomes = race(lambda a=a: commit(a), lambda b=b: commit(b))
        kinds = sorted(kind for kind, _ in outcomes)
        assert kinds == ["conflict", "won"], outcomes
        winner = next(value for kind, value in outcomes if kind == "won")
        loser = next(value for kind, value in outcomes if kind == "conflict")
        assert winner.seq == head.version + 1
        assert loser.detail["expected"] == head.version
        assert_linear_and_folded(thread_id)
    texts = list(
        ThreadCommit.objects.filter(thread_id=thread_id, seq__gt=1)
        .order_by("seq")
        .values_list("messages", flat=True)
    )
    assert len(texts) == 10  # one winner per round, nothing of a loser
    assert read_run(run.run_id).step == 10


def test_a_worker_step_and_an_operator_cancel_race(make_run):
    """Different commits at one version: whichever wins, the other must reload."""
    run = make_run()
    head, view = read_head(run.thread_id), read_run(run.run_id)
    step = drafts.infer_text(head, view)
    cancel = drafts.end(head, view, EndCause.CANCELLED)
    outcomes = race(lambda: commit(step), lambda: commit(cancel))
    assert sorted(kind for kind, _ in outcomes) == ["conflict", "won"], outcomes
    final = read_run(run.run_id)
    if outcomes[0][0] == "won":
        assert (final.state, final.step) == (RunState.RUNNING, 1)
    else:
        assert (final.state, final.end_cause) == (RunState.ENDED, EndCause.CANCELLED)
    assert_linear_and_folded(run.thread_id)


def test_the_loser_waits_for_the_winner_then_conflicts(make_run):
    """Force the overlap: the first writer holds its transaction open after writing its
    commit; the second must wait on the lock (not read a stale head) and then conflict."""
    run = make_run()
    head, view = read_head(run.thread_id), read_run(run.run_id)
    inside = threading.Event()
    times: dict[str, float] = {}

    def first():
        with transaction.atomic():
            done = commit(drafts.infer_text(head, view, text="first"))
            inside.set()
            time.sleep(0.5)
            times["first_commits"] = time.monotonic()
        return done

    def second():
        assert inside.wait(TIMEOUT)
        times["second_starts"] = time.monotonic()
        try:
            return commit(drafts.infer_text(head, view, text="second"))
        finally:
            times["second_ends"] = time.monotonic()

    outcomes = race(first, second)
    assert [kind for kind, _ in outcomes] == ["won", "conflict"], outcomes
    assert times["second_starts"] < times["first_commits"] <= times["second_ends"]
    assert_linear_and_folded(run.thread_id)


def test_two_activations_on_one_thread_leave_one_active_run(make_thread):
    thread_id = make_thread()
    head = read_head(thread_id)
    a = drafts.activate(head, "run-a-" + thread_id[:20])
    b = drafts.activate(head, "run-b-" + thread_id[:20])
    outcomes = race(lambda: commit(a), lambda: commit(b))
    assert sorted(kind for kind, _ in outcomes) == ["conflict", "won"], outcomes
    loser = a if outcomes[0][0] == "conflict" else b
    before = state_of(thread_id)
    with pytest.raises(RunAlreadyActive):  # the loser reloads: a run is already active
        commit(drafts.activate(read_head(thread_id), loser.run_id))
    assert state_of(thread_id) == before
    assert Run.objects.filter(thread_id=thread_id).exclude(state="ended").count() == 1
    assert_linear_and_folded(thread_id)


def test_four_writers_retrying_on_conflict_keep_the_log_linear(make_run):
    run = make_run()
    per_writer = 8
    conflicts = [0] * 4

    def writer(i: int) -> int:
        done = 0
        while done < per_writer:
            head, view = read_head(run.thread_id), read_run(run.run_id)
            assert view is not None
            try:
                commit(drafts.infer_text(head, view, text=f"w{i} #{done}"))
                done += 1
            except VersionConflict:
                conflicts[i] += 1  # reload and decide again, never overwrite
        return done

    outcomes = race(*(lambda i=i: writer(i) for i in range(4)))
    assert outcomes == [("won", per_writer)] * 4
    assert read_run(run.run_id).step == 4 * per_writer
    assert read_head(run.thread_id).version == 1 + 4 * per_writer
    assert_linear_and_folded(run.thread_id)
