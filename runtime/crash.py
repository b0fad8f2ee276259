"""Crash injection for tests: ``RUNTIME_CRASH_AT=<point>[:<occurrence>]``.

At the named point's n-th occurrence (from 1, counted within one process, default 1) the
process exits at once with ``os._exit(137)``, as if killed: no cleanup, no flush, no release of
its lease. The points are listed in ``POINTS`` and in the README.
"""

from __future__ import annotations

import os
import sys
import threading

POINTS = (
    "batch_committed",  # the model's batch is committed, nothing executed yet
    "executing_committed",  # a call's Executing attempt is committed, the effect not yet run
    "effect_applied",  # the tool returned; its result is not yet committed
    "call_completed",  # a call's terminal result is committed
    "batch_finalized",  # the batch's results are published
    "ticket_committed",  # a ResumeTicket is committed (the run is Awaiting)
    "resume_committed",  # a ResumeCommand is committed (in the process that sent it)
    "inference_streaming",  # after the first live Delta of an inference
    "child_started",  # a delegate call's child run and the call's delegation ticket committed
    "child_ended_before_delivery",  # a child's end is decided, inside its uncommitted transaction
    "delivery_committed",  # a child's Ended commit and its delivery to the parent committed
    "timer_fired",  # a due timer's ResumeCommand is committed (in the worker that fired it)
)

_lock = threading.Lock()
_seen: dict[str, int] = {}


def _target() -> tuple[str, int] | None:
    spec = os.environ.get("RUNTIME_CRASH_AT", "").strip()
    if not spec:
        return None
    point, _, occurrence = spec.partition(":")
    if point not in POINTS:
        raise ValueError(f"RUNTIME_CRASH_AT names an unknown point {point!r}; known: {POINTS}")
    return point, int(occurrence or 1)


def check_environment() -> str | None:
    """Return the configured ``point:occurrence``, or None; raise ValueError for a typo, so
    that a worker refuses to start rather than silently never crashing."""
    target = _target()
    return f"{target[0]}:{target[1]}" if target else None


def crash_point(point: str) -> None:
    """Exit the process hard here if RUNTIME_CRASH_AT names this point and occurrence."""
    target = _target()
    if target is None or target[0] != point:
        return
    with _lock:
        _seen[point] = _seen.get(point, 0) + 1
        if _seen[point] == target[1]:
            sys.stderr.write(f"RUNTIME_CRASH_AT: crashing at {point}:{target[1]}\n")
            sys.stderr.flush()
            os._exit(137)
