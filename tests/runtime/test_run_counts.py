"""Run counts kept by the database (issue 28, item 2): after every kind of write that changes
a run (start, end, cancel, await, pause, fork, prune, a bulk update, a thread deleted), the
kept counts (RunCount, migration 0018's triggers) equal a full count, and /metrics and the
runs list's chips read them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management.color import no_style
from django.db import connection, transaction
from django.db.models import Count
from django.utils import timezone

from console.views import runs as runs_view
from runtime import inventory, operations, retention
from runtime.domain.commit import EndCause
from runtime.models import Run, RunCount, Thread
from tests.console.support import RunDriver

pytestmark = pytest.mark.django_db


def full_count(agent: str | None = None) -> dict[tuple[str, str], int]:
    rows = Run.objects.all() if agent is None else Run.objects.filter(agent=agent)
    counted = rows.order_by().values_list("state", "end_cause").annotate(n=Count("*"))
    return {(state, cause or ""): n for state, cause, n in counted}


def assert_kept() -> None:
    assert inventory.runs_by_state() == full_count()
    for agent in set(Run.objects.values_list("agent", flat=True)):
        assert inventory.runs_by_state(agent) == full_count(agent)


def started(text: str = "go") -> RunDriver:
    return RunDriver(operations.start_run(agent="demo", input=text, actor="t"))


def test_counts_follow_every_kind_of_write():
    assert_kept()
    a = started()
    assert_kept()
    assert inventory.runs_by_state()[("running", "")] == 1  # not vacuous
    a.text_step("done", end=True)  # ends naturally
    assert_kept()
    b = started()
    operations.cancel(b.run_id, actor="t", reason="test")
    assert_kept()
    c = started()
    c.open_batch({"name": "ledger_approval", "arguments": {"key": "k"}})  # awaits approval
    assert_kept()
    d = started()
    operations.pause(d.run_id, actor="t", reason="look")
    assert_kept()
    operations.resume_run(d.run_id, actor="t", reason="go on")
    assert_kept()
    operations.end_run(d.run_id, EndCause.FAILED, actor="t", reason="test")
    assert_kept()
    fork = operations.fork_run(a.run_id, at_step=1, input="again", actor="t")
    assert Run.objects.filter(id=fork).exists()
    assert_kept()
    Run.objects.filter(id=c.run_id).update(agent="other")  # any writer, even a bulk update
    assert_kept()
    Thread.objects.filter(id=Run.objects.get(id=b.run_id).thread_id).delete()
    assert_kept()
    Run.objects.update(created_at=timezone.now() - timedelta(days=400))
    report = retention.prune(timezone.now() - timedelta(days=30))
    assert Run.objects.count() < 5, report  # the prune deleted runs
    assert_kept()


def test_the_chips_and_metrics_read_the_kept_counts(django_assert_max_num_queries):
    started().text_step("done", end=True)
    started()
    with django_assert_max_num_queries(3):
        counts = runs_view._counts({})
    assert counts["total"] == 2
    assert dict(counts["states"])["ended"] == 1
    assert dict(counts["causes"])["natural"] == 1
    by_agent = runs_view._counts({"agent": "demo"})
    assert by_agent["total"] == 2
    assert runs_view._counts({"agent": "nobody"})["total"] == 0
    assert RunCount.objects.filter(n__gt=0).count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_suites_flush_leaves_no_count_behind():
    """The flush after each transactional test (tests/conftest.py DELETEs the rows on
    PostgreSQL) empties the counts after the runs, whatever order Django lists the tables in:
    its list follows the hash seed, and counts emptied first were left at -1 (issue 36's CI)."""
    started().text_step("done", end=True)
    kept = {"django_content_type", "auth_permission"}  # the reference rows the flush keeps
    tables = connection.introspection.django_table_names(only_existing=True, include_views=False)
    counts_first = sorted(
        (t for t in tables if t not in kept), key=lambda t: t != "runtime_runcount"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        for statement in connection.ops.sql_flush(no_style(), counts_first):
            cursor.execute(statement)
    assert not Run.objects.exists()
    assert list(RunCount.objects.values_list("state", "n")) == []
