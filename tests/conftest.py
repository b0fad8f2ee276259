"""Shared pytest configuration.

pytest-django reads DJANGO_SETTINGS_MODULE (console.settings) from pyproject.toml. Factories
here are fixtures that return functions (STYLE.md).
"""

from __future__ import annotations

import uuid

import pytest

# -- commit-log factories (fixtures that return functions; used by tests/runtime) ----------------
# Models are imported inside the fixtures: this module loads before pytest-django sets Django up.


@pytest.fixture
def make_thread():
    """Return ``make(**metadata) -> thread id``: a new, empty thread (version 0)."""
    from runtime.models import Thread

    def make(**metadata) -> str:
        return Thread.objects.create(metadata=metadata).id

    return make


@pytest.fixture
def make_run(make_thread):
    """Return ``make(thread_id=None, *, run_id=None, **activate_kwargs) -> RunView``: a run
    activated through the commit coordinator (on a new thread unless ``thread_id``)."""
    from runtime.coordinator import commit, read_head
    from tests.domain import drafts

    def make(thread_id: str | None = None, *, run_id: str | None = None, **kwargs):
        thread_id = thread_id or make_thread()
        draft = drafts.activate(read_head(thread_id), run_id or uuid.uuid4().hex, **kwargs)
        return commit(draft).run

    return make


@pytest.fixture
def make_calls():
    """Return ``make(n=1, **call_kwargs) -> tuple[ToolCall, ...]``: a new batch's calls, all
    Requested, with fresh ids (see tests.domain.drafts.make_call for the kwargs)."""
    from tests.domain import drafts

    ids = drafts.Ids()

    def make(n: int = 1, **kwargs):
        return tuple(drafts.make_call(i, ids=ids, **kwargs) for i in range(n))

    return make


@pytest.fixture
def drive():
    """Return ``drive(build, run_id, *args, **kwargs) -> Committed``: build a commit with a
    tests.domain.drafts builder from the run's committed state and head, and write it."""
    from runtime.coordinator import commit, read_head, read_run

    def apply(build, run_id: str, *args, **kwargs):
        run = read_run(run_id)
        assert run is not None, f"run {run_id} has no committed state"
        return commit(build(read_head(run.thread_id), run, *args, **kwargs))

    return apply


@pytest.fixture
def announcements():
    """The CommitNotices sent on ``runtime.signals.commit_announced`` during the test."""
    from runtime.signals import commit_announced

    heard: list = []

    def receiver(sender, notice, **kwargs):
        heard.append(notice)

    commit_announced.connect(receiver, weak=False)
    yield heard
    commit_announced.disconnect(receiver)
