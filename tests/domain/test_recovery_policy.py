"""The pinned ToolRecoveryPolicy for a call found Executing, table-driven: pure, no database.

Seed: "call at Executing: apply the pinned ToolRecoveryPolicy: replay, reconnect, or mark
indeterminate"; "Executing -> Indeterminate: outcome cannot be classified safely". A reconnect
lookup that cannot answer is such an outcome: it seals the call, whatever the attempts left.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.domain import recovery as rec
from runtime.domain.model import CallPhase, Effects, RecoveryPolicy
from tests.domain import drafts

REPLAY, RECONNECT, INDETERMINATE = (
    RecoveryPolicy.REPLAY,
    RecoveryPolicy.RECONNECT,
    RecoveryPolicy.INDETERMINATE,
)


def executing(policy: RecoveryPolicy, attempt: int, max_attempts: int):
    call = drafts.make_call(0, ids=drafts.Ids(), policy=policy, max_attempts=max_attempts)
    return replace(call, phase=CallPhase.EXECUTING, attempt=attempt)


@pytest.mark.parametrize(
    ("policy", "attempt", "looked_up", "lookup_failed", "expected"),
    [
        (REPLAY, 1, False, None, rec.Retry(2)),
        (REPLAY, 3, False, None, rec.Seal),
        (RECONNECT, 1, False, None, rec.Lookup()),
        (RECONNECT, 1, True, None, rec.Retry(2)),
        (RECONNECT, 3, True, None, rec.Seal),
        (RECONNECT, 1, False, "LookupError: down", rec.Seal),
        (RECONNECT, 3, False, "LookupError: down", rec.Seal),
        (INDETERMINATE, 1, False, None, rec.Seal),
    ],
)
def test_executing_decision(policy, attempt, looked_up, lookup_failed, expected):
    call = executing(policy, attempt, max_attempts=3)
    decision = rec.executing_decision(call, looked_up=looked_up, lookup_failed=lookup_failed)
    if expected is rec.Seal:
        assert isinstance(decision, rec.Seal)
        if lookup_failed:
            assert (
                decision.reason == f"the lookup by operation id could not answer: {lookup_failed}"
            )
    else:
        assert decision == expected


NONE, IDEMPOTENT, ONCE = Effects.NONE, Effects.IDEMPOTENT, Effects.ONCE


@pytest.mark.parametrize(
    ("policy", "effects", "attempt", "expected"),
    [
        (REPLAY, IDEMPOTENT, 1, rec.Retry(2)),  # attempts left: run it again
        (REPLAY, IDEMPOTENT, 3, rec.Fail),
        (REPLAY, NONE, 3, rec.Fail),
        (REPLAY, ONCE, 3, rec.Seal),
        (RECONNECT, IDEMPOTENT, 1, rec.Lookup()),  # the downstream may know it applied
        (INDETERMINATE, NONE, 1, rec.Fail),
        (INDETERMINATE, ONCE, 1, rec.Seal),  # a once effect that may have started: Reconcile
    ],
)
def test_a_tool_that_raised_fails_its_call_unless_a_once_effect_may_have_started(
    policy, effects, attempt, expected
):
    """Issue 31, item 7: the exception becomes the call's error result where the declared
    effects leave nothing for a person to check."""
    call = replace(executing(policy, attempt, max_attempts=3), effects=effects)
    decision = rec.executing_decision(call, raised="KeyError: 'x'")
    if expected in (rec.Fail, rec.Seal):
        assert isinstance(decision, expected)
    else:
        assert decision == expected
    if isinstance(decision, rec.Fail):
        tries = "1 attempt" if attempt == 1 else f"{attempt} attempts"
        assert decision.reason == f"the tool raised KeyError: 'x' ({tries})"


GONE = "the tool 'x' is not in agent 'a' as deployed now"


@pytest.mark.parametrize(
    ("policy", "effects", "attempt", "expected"),
    [
        (REPLAY, IDEMPOTENT, 1, rec.Fail),  # a Retry, but no code to retry with
        (REPLAY, NONE, 1, rec.Fail),
        (REPLAY, ONCE, 1, rec.Seal),  # its effect may have started: Reconcile
        (RECONNECT, IDEMPOTENT, 1, rec.Fail),  # a Lookup, but no code to ask with
        (RECONNECT, ONCE, 1, rec.Seal),
        (INDETERMINATE, NONE, 1, rec.Seal),  # the pinned policy never retried: as it was
        (INDETERMINATE, ONCE, 1, rec.Seal),
    ],
)
def test_a_call_the_code_now_cannot_run_is_never_retried(policy, effects, attempt, expected):
    """Issue 34: a deploy removed the tool of a call found Executing (or changed its schema).
    No Retry or Lookup; a once effect keeps Reconcile, anything else is the model's error."""
    call = replace(executing(policy, attempt, max_attempts=3), effects=effects)
    decision = rec.executing_decision(call, cannot_run=GONE)
    assert isinstance(decision, expected)
    if isinstance(decision, rec.Fail):
        assert decision.reason == f"{GONE}; not run again after 1 attempt"
    elif policy is not INDETERMINATE:
        assert decision.reason == f"{GONE}; the effect of its last attempt may have started"
