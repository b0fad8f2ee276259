"""Limits on what runs at once, as values and decisions (no clock, no I/O).

Two kinds (issue 23, item 2):

- a **run limit** of an agent: at most ``runs`` of its runs driven at once, and at most
  ``per_key`` at once among the runs whose metadata field ``key`` has the same value (one run
  per customer at a time). A run holds its slot while a worker holds its live lease; the
  others wait their turn, oldest commit first (``admit``);
- a **model limit**: at most ``concurrency`` inferences at once and ``per_minute`` requests a
  minute (a token bucket holding up to a minute's worth), and a ``not_before`` instant that a
  provider's 429 with ``Retry-After`` pushes forward for every worker (``take_inference``).

The database layer (``runtime.limits``) reads the counts under a lock and applies what these
functions decide.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from runtime.errors import InvalidLimit


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLimit:
    """How many runs of one agent may be driven at once: ``runs`` in all (None: no bound),
    and ``per_key`` among the runs whose metadata field ``key`` holds the same value (None
    when ``key`` is None). Runs whose metadata lacks the field share the value ""."""

    runs: int | None = None
    key: str | None = None
    per_key: int | None = None

    def __post_init__(self) -> None:
        for name in ("runs", "per_key"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or value < 1):
                raise InvalidLimit(f"a run limit's {name} must be a whole number of at least 1")
        if (self.key is None) != (self.per_key is None):
            raise InvalidLimit("a run limit names a metadata key and its per_key bound together")
        if self.key is not None and (not self.key or "__" in self.key or len(self.key) > 100):
            raise InvalidLimit("a run limit's key is a metadata field name without '__'")
        if self.runs is None and self.key is None:
            raise InvalidLimit("a run limit bounds runs, or per_key runs of a metadata key")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelLimit:
    """How one model may be asked: ``concurrency`` inferences at once and ``per_minute``
    requests a minute (None: no bound)."""

    concurrency: int | None = None
    per_minute: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and (
            isinstance(self.concurrency, bool) or self.concurrency < 1
        ):
            raise InvalidLimit("a model limit's concurrency must be a whole number of at least 1")
        if self.per_minute is not None and self.per_minute <= 0:
            raise InvalidLimit("a model limit's per_minute must be more than 0")


@dataclass(frozen=True, slots=True)
class Candidate:
    """A runnable run of a limited agent, in claim order: its id, agent and key value."""

    run_id: str
    agent: str
    key: str


def admit(
    candidates: Iterable[Candidate],
    held: Mapping[tuple[str, str], int],
    limits: Mapping[str, RunLimit],
    want: int,
) -> list[str]:
    """The ids of the candidates to claim now, at most ``want``, in the candidates' order.

    ``held`` counts the runs driven now by (agent, key value) (key value "" for an agent
    without a key). A candidate is taken when its agent and its key both have a free slot
    once the candidates taken before it count; a candidate refused for its key does not stop a
    younger run of another key (each key keeps its own order), but a refused key refuses all
    its younger runs, so a key's runs start in order.
    """
    by_agent: Counter[str] = Counter()
    by_key: Counter[tuple[str, str]] = Counter()
    for (agent, key), count in held.items():
        by_agent[agent] += count
        by_key[(agent, key)] += count
    taken: list[str] = []
    for c in candidates:
        if len(taken) >= want:
            break
        limit = limits[c.agent]
        if limit.runs is not None and by_agent[c.agent] >= limit.runs:
            continue
        if limit.per_key is not None and by_key[(c.agent, c.key)] >= limit.per_key:
            continue
        taken.append(c.run_id)
        by_agent[c.agent] += 1
        by_key[(c.agent, c.key)] += 1
    return taken


def run_wait_reason(
    agent: str, key_name: str | None, key: str, limit: RunLimit, agent_held: int, key_held: int
) -> str | None:
    """Why a runnable run of ``agent`` waits (its agent's or its key's slots are all held),
    as operators read it; None when a slot is free."""
    if limit.runs is not None and agent_held >= limit.runs:
        return f"waiting for a slot: agent {agent}, {agent_held} of {limit.runs} running"
    if limit.per_key is not None and key_held >= limit.per_key:
        return (
            f"waiting for a slot: agent {agent} {key_name}={key!r},"
            f" {key_held} of {limit.per_key} running"
        )
    return None


@dataclass(frozen=True, slots=True)
class Bucket:
    """A model's budget row: the tokens left at ``refilled_at`` and the instant before which
    nothing may be asked (a provider's Retry-After)."""

    tokens: float
    refilled_at: datetime | None
    not_before: datetime | None


@dataclass(frozen=True, slots=True)
class Grant:
    """Ask the model now; store ``bucket`` as the model's budget."""

    bucket: Bucket


@dataclass(frozen=True, slots=True)
class Wait:
    """Do not ask before ``seconds`` have passed (None: until a slot frees), for ``reason``."""

    seconds: float | None
    reason: str


def take_inference(
    model: str, limit: ModelLimit, bucket: Bucket, in_flight: int, now: datetime
) -> Grant | Wait:
    """Decide whether one more inference of ``model`` may start at ``now`` while
    ``in_flight`` run; a grant takes one token from the bucket.

    The bucket holds up to ``per_minute`` tokens and refills at ``per_minute`` a minute.
    ``not_before`` (a provider's 429 with Retry-After) refuses everything until it passes.
    """
    if bucket.not_before is not None and now < bucket.not_before:
        seconds = (bucket.not_before - now).total_seconds()
        until = bucket.not_before.isoformat(timespec="seconds")
        why = f"waiting for model {model}: the provider asked for a pause until {until}"
        return Wait(seconds, why)
    if limit.concurrency is not None and in_flight >= limit.concurrency:
        return Wait(
            None,
            f"waiting for a slot: model {model}, {in_flight} of {limit.concurrency} inferences",
        )
    if limit.per_minute is None:
        return Grant(bucket)
    tokens = refill(limit.per_minute, bucket, now)
    if tokens < 1:
        seconds = (1 - tokens) * 60 / limit.per_minute
        return Wait(
            seconds, f"waiting for a slot: model {model}, {limit.per_minute:g} requests a minute"
        )
    return Grant(Bucket(tokens - 1, now, bucket.not_before))


def refill(per_minute: float, bucket: Bucket, now: datetime) -> float:
    """The tokens of ``bucket`` at ``now``: a new bucket is full."""
    if bucket.refilled_at is None:
        return per_minute
    elapsed = max((now - bucket.refilled_at).total_seconds(), 0.0)
    return min(per_minute, bucket.tokens + elapsed * per_minute / 60)


def slowed(not_before: datetime | None, now: datetime, retry_after: float) -> datetime:
    """The model's new ``not_before`` after a provider asked to retry after ``retry_after``
    seconds: never earlier than it was."""
    pushed = now + timedelta(seconds=max(retry_after, 0.0))
    return pushed if not_before is None or pushed > not_before else not_before


# Between two tries of a model that keeps failing: at least a second, at most a minute.
OUTAGE_RETRY_BOUNDS = (timedelta(seconds=1), timedelta(minutes=1))


def outage_retry(
    since: datetime, now: datetime, horizon: timedelta, retry_after: float | None
) -> timedelta | None:
    """How long a run whose model has failed retryably since ``since`` waits, released,
    before its worker asks again (issue 31, item 6); None once ``horizon`` has passed since
    ``since``: the run fails.

    The wait is as long as the model has failed so far, so the tries double their spacing,
    within OUTAGE_RETRY_BOUNDS; a ``Retry-After`` (seconds) the model answered wins. The
    last wait ends at the horizon, for one last try there.
    """
    left = since + horizon - now
    if left <= timedelta(0):
        return None
    low, high = OUTAGE_RETRY_BOUNDS
    wait = timedelta(seconds=retry_after) if retry_after is not None else now - since
    return min(max(wait, low), high, left)
