"""Announcements of committed facts, sent only after the transaction commits.

Receivers get ``notice``: a CommitNotice. The console forwards it to the live stream; the
in-process worker wakes on it. A receiver must not assume it sees every commit (it is not
thread truth; the log is).
"""

from __future__ import annotations

from dataclasses import dataclass

from django.dispatch import Signal

commit_announced = Signal()


@dataclass(frozen=True, slots=True)
class CommitNotice:
    thread_id: str
    run_id: str | None
    seq: int
    state: str | None  # the run's state after the commit, None for a thread note
    runnable: bool  # the run became Running after not being runnable (activation, resume)
    paused: bool = False  # the commit paused the run: its worker lets it go at once
