"""The pinned ToolRecoveryPolicy for a call found Executing, table-driven: pure, no database.

Seed: "call at Executing: apply the pinned ToolRecoveryPolicy: replay, reconnect, or mark
indeterminate"; "Executing -> Indeterminate: outcome cannot be classified safely". A reconnect
lookup that cannot answer is such an outcome: it seals the call, whatever the attempts left.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from runtime.domain import recovery as rec
from runtime.domain.model import CallPhase, RecoveryPolicy
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
