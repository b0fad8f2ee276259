"""Random legal logs fold to what the model of the seed expects, and to the projections.

The pure half folds the generated log (also after a round trip through the codec, as the log
checker reads it) and compares it with the model. The database half writes the same log
through the commit coordinator, one commit at a time, and checks that the log checker finds
nothing and that every projection equals the fold.
"""

from __future__ import annotations

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings

from runtime import codec, fsck
from runtime.coordinator import commit, read_run
from runtime.domain.commit import CommitDraft, FoldedThread, fold
from runtime.domain.model import CallPhase, RunState
from runtime.models import MessageRecord, ReconciliationRecord, Thread, ThreadCommit
from tests.domain.legal_logs import Scenario, legal_logs


def roundtrip(draft: CommitDraft) -> CommitDraft:
    """The draft as the log stores it and the log checker reads it back."""
    return CommitDraft(
        thread_id=draft.thread_id,
        run_id=draft.run_id,
        expected_version=draft.expected_version,
        disposition=codec.load_disposition(codec.dump_disposition(draft.disposition)),
        messages=tuple(codec.load_message(codec.dump_message(m)) for m in draft.messages),
        events=tuple(codec.load_event(codec.dump_event(e)) for e in draft.events),
        actor=draft.actor,
    )


def assert_fold_matches_model(folded: FoldedThread, scenario: Scenario) -> None:
    head = folded.head
    assert head.version == len(scenario.commits)
    assert head.active_run_id == scenario.active
    assert set(folded.runs) == set(scenario.runs)
    for run_id, shadow in scenario.runs.items():
        run = folded.runs[run_id]
        assert run.state is shadow.state
        assert run.end_cause is shadow.end_cause
        assert run.step == shadow.step
        assert (run.ticket.id if run.ticket else None) == shadow.ticket
        assert list(run.consumed_tickets) == shadow.consumed
        assert [b.finalized for b in run.batches] == shadow.finalized
        for batch, expected in zip(run.batches, shadow.batches, strict=True):
            assert [c.call_id for c in batch.calls] == [c.call_id for c in expected]
            for call, want in zip(batch.calls, expected, strict=True):
                got = (call.phase, call.attempt, call.approved, call.is_error)
                assert got == (want.phase, want.attempt, want.approved, want.is_error)
                assert call.ticket_id == want.ticket_id
                sealed_after_start = want.phase is CallPhase.INDETERMINATE and want.started
                assert call.effect_may_have_started is sealed_after_start
                if call.phase.terminal:
                    assert call.result is not None
            # Seed invariants the fold must keep whatever the path.
            if batch.finalized:
                assert batch.all_terminal
        if run.state is RunState.ENDED:
            assert run.open_batch is None and run.ticket is None
        assert (run.state is RunState.AWAITING) == (run.ticket is not None)
    live = [r for r in folded.runs.values() if r.state is not RunState.ENDED]
    assert len(live) <= 1
    published = []
    current: list[str] = []
    last_seq = None
    for seq, _run, message in folded.messages:
        if message.role != "tool":
            continue
        if seq != last_seq and current:
            published.append(tuple(current))
            current = []
        assert message.tool_call_id is not None  # a tool message answers one call
        current.append(message.tool_call_id)
        last_seq = seq
    if current:
        published.append(tuple(current))
    assert published == scenario.published  # one publication per finalization, in call order
    assert len(folded.reconciliations) == scenario.reconciliations


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(legal_logs())
def test_random_legal_logs_fold_to_the_model(scenario):
    folded = fold(scenario.thread_id, scenario.commits)
    assert_fold_matches_model(folded, scenario)
    reread = fold(scenario.thread_id, ((seq, roundtrip(d)) for seq, d in scenario.commits))
    assert reread.head == folded.head
    assert reread.runs == folded.runs
    assert reread.messages == folded.messages
    assert reread.reconciliations == folded.reconciliations


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(legal_logs(max_moves=60))
def test_every_prefix_of_a_legal_log_is_legal(scenario):
    """Recovery may find the log cut at any commit: every prefix folds, and agrees with the
    whole log's fold on what it contains."""
    whole = fold(scenario.thread_id, scenario.commits)
    for n in range(len(scenario.commits)):
        part = fold(scenario.thread_id, scenario.commits[:n])
        assert part.head.version == n
        assert whole.messages[: len(part.messages)] == part.messages


@pytest.mark.django_db
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(legal_logs())
def test_random_legal_logs_through_the_coordinator_match_the_fold(scenario):
    # Each example runs in a savepoint that is rolled back, so the fixed ids never collide.
    with transaction.atomic():
        Thread.objects.create(id=scenario.thread_id)
        for seq, draft in scenario.commits:
            assert commit(draft).seq == seq
        folded = fold(scenario.thread_id, scenario.commits)
        assert fsck.check_thread(scenario.thread_id) == []
        thread = Thread.objects.get(id=scenario.thread_id)
        assert (thread.version, thread.active_run_id) == (
            folded.head.version,
            folded.head.active_run_id,
        )
        for run_id, run in folded.runs.items():
            assert read_run(run_id) == run
        assert ThreadCommit.objects.filter(thread_id=scenario.thread_id).count() == len(
            scenario.commits
        )
        assert MessageRecord.objects.filter(thread_id=scenario.thread_id).count() == len(
            folded.messages
        )
        assert ReconciliationRecord.objects.filter(thread_id=scenario.thread_id).count() == len(
            folded.reconciliations
        )
        transaction.set_rollback(True)
