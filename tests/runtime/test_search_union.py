"""Search as a union of index lookups (issue 28, item 2) finds exactly what the former single
predicate (an OR of EXISTS semi-joins and id LIKEs over every run) found: a rare, a common and
an absent word, words only in answers or tool arguments, and run, thread and operation id
prefixes, on both databases. The console's runs list matches the text once and reuses the ids
for its page and its chip counts."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.models import Exists, OuterRef, Q
from django.test.utils import CaptureQueriesContext

from console.views import runs as runs_view
from runtime import operations, search
from runtime.models import Run, ToolCallRecord
from runtime.search import ID_PREFIX, RunSearch, _matching_text, matched_ids, narrow
from tests.console.support import RunDriver

pytestmark = pytest.mark.django_db

WORDS = ("invoice", "refund", "ledger", "payroll", "audit")


def former(text: str) -> set[str]:
    """The former search of ``text`` (before issue 28): one predicate over every run."""
    messages, calls = _matching_text(text)
    found = Q(Exists(messages.filter(run_id=OuterRef("pk")))) | Q(
        Exists(calls.filter(run_id=OuterRef("pk")))
    )
    if ID_PREFIX.match(text):
        by_operation = ToolCallRecord.objects.filter(operation_id__startswith=text)
        found |= (
            Q(id__startswith=text)
            | Q(thread__id__startswith=text)
            | Q(Exists(by_operation.filter(run_id=OuterRef("pk"))))
        )
    return set(Run.objects.filter(found).values_list("id", flat=True))


def now_found(text: str) -> set[str]:
    return set(narrow(Run.objects.all(), RunSearch(text=text)).values_list("id", flat=True))


@pytest.fixture
def history() -> dict[str, object]:
    """Fifteen runs: every run says "common"; each says one of WORDS in its input, in its
    answer or in a tool call's arguments; one says "zebra" (the rare word)."""
    ids: list[str] = []
    for n in range(15):
        word = WORDS[n % len(WORDS)]
        where = n % 3
        text = f"common request {n}" + (f" about {word}" if where == 0 else "")
        if n == 7:
            text += " zebra"
        driver = RunDriver(operations.start_run(agent="demo", input=text, actor="t"))
        if where == 1:
            driver.text_step(f"Done: the {word} is filed.", end=True)
        elif where == 2:
            driver.open_batch({"name": "ledger_once", "arguments": {"key": f"{word}-{n}"}})
        ids.append(driver.run_id)
    return {"ids": ids}


def queries(history: dict[str, object]) -> list[str]:
    ids = history["ids"]
    assert isinstance(ids, list)
    run = Run.objects.get(id=ids[2])
    operation = ToolCallRecord.objects.filter(run_id=ids[2]).values_list("operation_id", flat=True)
    return [
        "zebra",  # rare
        "common",  # in every run
        "nothing-like-this",  # absent
        "payroll",
        "ledger",
        "refund",
        run.id[:8],  # a run id prefix
        run.thread_id[:8],  # a thread id prefix
        operation[0][:12],  # an operation id prefix
        "common zebra",
    ]


def test_the_union_finds_what_the_former_predicate_found(history):
    for text in queries(history):
        assert now_found(text) == former(text), text
    assert now_found("zebra") == {history["ids"][7]}  # not vacuous: a rare word is found
    assert len(now_found("common")) == 15


def test_matched_ids_are_the_same_set_or_none_past_the_cap(history):
    for text in queries(history):
        assert set(matched_ids(text, cap=100) or ()) == former(text), text
    assert matched_ids("common", cap=14) is None
    assert sorted(matched_ids("common", cap=15) or ()) == sorted(former("common"))


def test_the_console_matches_the_text_once_for_page_and_counts(history, rf):
    data = {"q": "common"}
    with CaptureQueriesContext(connection) as captured:
        matched = runs_view._matched(data)
        page = list(runs_view._filtered(data, matched).order_by("-created_at", "-id"))
        counts = runs_view._counts(data, matched)
    texts = [q["sql"] for q in captured.captured_queries]
    assert sum("UNION" in sql for sql in texts) == 1, texts  # the text matched once
    assert {r.id for r in page} == former("common")
    assert counts["total"] == 15
    assert dict(counts["states"]) == {
        s: Run.objects.filter(id__in=former("common"), state=s).count() for s in runs_view.STATES
    }


def test_past_the_cap_the_console_shows_a_capped_total(history, monkeypatch):
    monkeypatch.setattr(search, "SEARCH_CAP", 10)
    data = {"q": "common"}
    matched = runs_view._matched(data)
    assert matched == runs_view.OVER_CAP
    page = {r.id for r in runs_view._filtered(data, matched)}
    assert page == former("common")  # the page is still exact
    counts = runs_view._counts(data, matched)
    assert counts["total"] == "10+"
    assert counts["paused"] is None


def test_past_the_search_cap_the_page_walks_history_and_finds_the_same(history, monkeypatch):
    monkeypatch.setattr(search, "SEARCH_CAP", 3)
    for text in queries(history):
        assert now_found(text) == former(text), text
    assert len(now_found("common")) == 15
