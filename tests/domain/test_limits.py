"""The limits' decisions, without a database (runtime.domain.limits)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.domain.limits import (
    Bucket,
    Candidate,
    Grant,
    ModelLimit,
    RunLimit,
    Wait,
    admit,
    outage_retry,
    slowed,
    take_inference,
)
from runtime.errors import InvalidLimit

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@given(
    keys=st.lists(st.sampled_from("abc"), max_size=30),
    held=st.dictionaries(st.sampled_from("abc"), st.integers(0, 3)),
    runs=st.integers(1, 6),
    per_key=st.integers(1, 3),
    want=st.integers(0, 40),
)
def test_admit_never_exceeds_a_bound_and_keeps_each_keys_order(keys, held, runs, per_key, want):
    limits = {"x": RunLimit(runs=runs, key="k", per_key=per_key)}
    candidates = [Candidate(f"r{i}", "x", key) for i, key in enumerate(keys)]
    counts = {("x", key): n for key, n in held.items()}
    taken = admit(candidates, counts, limits, want)
    assert len(taken) <= want
    assert sum(held.values()) + len(taken) <= max(runs, sum(held.values()))
    by_key = Counter(keys[int(r[1:])] for r in taken)
    for key, n in by_key.items():
        assert held.get(key, 0) + n <= per_key
        mine = [c.run_id for c in candidates if c.key == key]
        assert [r for r in taken if r in mine] == mine[:n]  # the oldest of the key first


def test_a_full_key_does_not_stop_another_key():
    limits = {"x": RunLimit(runs=5, key="k", per_key=1)}
    candidates = [Candidate("1", "x", "a"), Candidate("2", "x", "a"), Candidate("3", "x", "b")]
    assert admit(candidates, {}, limits, 10) == ["1", "3"]


def test_a_paused_model_waits_until_its_pause_ends():
    bucket = Bucket(0, None, T0 + timedelta(seconds=2))
    decision = take_inference("m", ModelLimit(concurrency=5), bucket, 0, T0)
    assert isinstance(decision, Wait) and decision.seconds == 2
    assert isinstance(
        take_inference("m", ModelLimit(concurrency=5), bucket, 0, T0 + timedelta(seconds=2)), Grant
    )


def test_the_bucket_refills_at_its_rate():
    limit = ModelLimit(per_minute=60)
    first = take_inference("m", limit, Bucket(0, None, None), 0, T0)
    assert isinstance(first, Grant) and first.bucket.tokens == 59
    empty = Bucket(0.5, T0, None)
    wait = take_inference("m", limit, empty, 0, T0)
    assert isinstance(wait, Wait) and wait.seconds == pytest.approx(0.5)
    assert isinstance(take_inference("m", limit, empty, 0, T0 + timedelta(seconds=0.5)), Grant)


def test_a_pause_never_moves_back():
    later = T0 + timedelta(seconds=10)
    assert slowed(later, T0, 2) == later
    assert slowed(None, T0, 2) == T0 + timedelta(seconds=2)


@pytest.mark.parametrize(
    "kwargs",
    [{"runs": 0}, {"key": "k"}, {"per_key": 1}, {}, {"key": "a__b", "per_key": 1}, {"runs": True}],
)
def test_a_malformed_run_limit_is_refused(kwargs):
    with pytest.raises(InvalidLimit):
        RunLimit(**kwargs)


def test_a_model_outage_is_tried_with_doubling_waits_until_its_horizon():
    """Issue 31, item 6: each wait is as long as the outage so far (1 s to 1 min), a
    Retry-After wins, the last wait ends at the horizon, and past it the run fails."""
    since = datetime(2026, 1, 1, tzinfo=UTC)
    horizon = timedelta(minutes=15)

    def wait(after: float, retry_after: float | None = None) -> float | None:
        got = outage_retry(since, since + timedelta(seconds=after), horizon, retry_after)
        return None if got is None else got.total_seconds()

    assert [wait(t) for t in (0, 0.5, 8, 30, 300)] == [1, 1, 8, 30, 60]
    assert wait(8, retry_after=20) == 20
    assert wait(895) == 5  # one last try at the horizon
    assert wait(900) is None and wait(3600) is None
