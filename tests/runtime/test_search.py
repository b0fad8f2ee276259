"""Run search (issue 22, item 5): free text in input, answers and tool arguments, a time
range, a tool, a metadata key and value, a parent; the same rules on both databases (full
text search on PostgreSQL, a plain scan on SQLite)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from runtime import operations
from runtime.domain.delegation import ChildLink
from runtime.models import Run
from runtime.search import RunSearch, narrow
from tests.console.support import RunDriver

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs() -> dict[str, str]:
    acme = RunDriver(
        operations.start_run(
            agent="demo",
            input="Charge ACME for the March invoice",
            metadata={"customer": "acme", "tier": 3},
            actor="t",
        )
    )
    acme.open_batch({"name": "ledger_once", "arguments": {"key": "invoice-42"}})
    globex = RunDriver(
        operations.start_run(
            agent="demo", input="Refund Globex", metadata={"customer": "globex"}, actor="t"
        )
    )
    globex.text_step("Recorded the refund of 30 euros.", end=True)
    child = operations.start_run(
        agent="demo",
        input="look up the March rate",
        actor="t",
        child=ChildLink(
            run_id="c" * 32,
            parent_run_id=acme.run_id,
            parent_call_id=acme.calls[0].call_id,
            depth=1,
        ),
    )
    return {"acme": acme.run_id, "globex": globex.run_id, "child": child}


def found(**query) -> set[str]:
    return set(narrow(Run.objects.all(), RunSearch(**query)).values_list("id", flat=True))


def test_free_text_in_input_answers_and_tool_arguments(runs):
    assert found(text="acme") == {runs["acme"]}  # any case
    assert found(text="refund") == {runs["globex"]}  # the input, and the answer
    assert found(text="euros") == {runs["globex"]}  # only in the assistant's answer
    assert found(text="invoice-42") == {runs["acme"]}  # only in a tool call's arguments
    assert found(text="March") == {runs["acme"], runs["child"]}
    assert found(text="nothing like this") == set()
    if connection.vendor == "postgresql":  # full text search: words, phrases, exclusion
        assert found(text="march rate") == {runs["child"]}
        assert found(text="march -rate") == {runs["acme"]}
        assert found(text='"march invoice"') == {runs["acme"]}
    else:  # a plain scan for the whole text
        assert found(text="the march rate") == {runs["child"]}


def test_an_id_prefix_finds_its_run(runs):
    assert found(text=runs["globex"][:10]) == {runs["globex"]}
    thread = Run.objects.get(id=runs["acme"]).thread_id
    assert found(text=thread[:10]) == {runs["acme"]}


def test_time_tool_metadata_and_parent(runs):
    now = timezone.now()
    Run.objects.filter(id=runs["globex"]).update(created_at=now - timedelta(days=2))
    assert found(since=now - timedelta(days=1)) == {runs["acme"], runs["child"]}
    assert found(until=now - timedelta(days=1)) == {runs["globex"]}
    assert found(tool="ledger_once") == {runs["acme"]}
    assert found(tool="wait") == set()
    assert found(meta_key="customer") == {runs["acme"], runs["globex"]}
    assert found(meta_key="customer", meta_value="globex") == {runs["globex"]}
    assert found(meta_key="tier", meta_value="3") == {runs["acme"]}
    assert found(meta_key="customer", meta_value="initech") == set()
    assert found(parent=runs["acme"]) == {runs["child"]}
    assert found(text="march", parent=runs["acme"]) == {runs["child"]}


def test_refused_queries():
    with pytest.raises(ValueError, match="metadata key"):
        RunSearch(meta_key="a__b c")
    with pytest.raises(ValueError, match="under a metadata key"):
        RunSearch(meta_value="x")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's indexes")
def test_full_text_search_uses_the_gin_indexes(runs):
    from runtime.search import _matching_text

    messages, calls = _matching_text("acme")
    with connection.cursor() as cursor:
        # Only a bitmap scan is left, and the text is its one indexable condition: on a table
        # that autovacuum has just analyzed (nearly empty), an index scan of another index
        # with a filter would otherwise be as cheap, whatever the search expression.
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_indexscan = off")
        for query in (messages, calls):
            sql, params = query.query.sql_with_params()
            cursor.execute("EXPLAIN " + sql, params)
            plan = " ".join(row[0] for row in cursor.fetchall())
            assert "message_text_search" in plan or "call_arguments_search" in plan, plan
        cursor.execute("SET enable_seqscan = on")
        cursor.execute("SET enable_indexscan = on")
