"""``GET /runs`` searches like the console (issue 22, item 5): free text, time range, tool,
metadata key and value, parent; keyset pages."""

from __future__ import annotations

from urllib.parse import quote

import pytest
from django.db import connection

from runtime.models import MessageRecord, ToolCallRecord
from tests.api.conftest import drive, error_of
from tests.hostile.corpus import LONG_WORDS

pytestmark = pytest.mark.django_db


def ids(response) -> list[str]:
    assert response.status_code == 200, response.json()
    return [item["id"] for item in response.json()["items"]]


def test_search_runs(api):
    def start(text: str, **metadata) -> str:
        body = {"agent": "demo", "input": text, "metadata": metadata}
        response = api.post("/runs", body)
        assert response.status_code == 201
        return response.json()["id"]

    acme = [start(f"Charge ACME, invoice {n}", customer="acme") for n in range(3)]
    globex = start("Refund Globex", customer="globex")
    assert set(ids(api.get("/runs", q="acme"))) == set(acme)
    assert ids(api.get("/runs", q="refund")) == [globex]
    assert ids(api.get("/runs", meta_key="customer", meta_value="globex")) == [globex]
    assert len(ids(api.get("/runs", meta_key="customer"))) == 4
    assert ids(api.get("/runs", q=globex[:12])) == [globex]
    assert ids(api.get("/runs", tool="ledger_once")) == []
    assert ids(api.get("/runs", since="2000-01-01T00:00:00Z", until="2000-01-02T00:00:00Z")) == []
    assert len(ids(api.get("/runs", since="2000-01-01T00:00:00Z"))) == 4
    # keyset pages over a search: newest first, no repeats, no gaps
    first = api.get("/runs", q="acme", limit=2).json()
    second = api.get("/runs", q="acme", limit=2, cursor=first["next_cursor"]).json()
    assert [i["id"] for i in first["items"] + second["items"]] == list(reversed(acme))
    assert second["next_cursor"] is None


@pytest.mark.parametrize(
    "query",
    [
        "meta_value=x",
        "meta_key=a%20b",
        "since=2026-01-01T00:00:00",
        "since=yesterday",
        "q=",
        "q=" + quote("x" * 501),
    ],
)
def test_malformed_searches_are_422(api, query):
    response = api.client.get(f"/api/v1/runs?{query}", headers=api.headers())
    assert response.status_code == 422, response.content
    assert error_of(response)["code"] in ("validation_error", "invalid_commit")


# -- a long text never decides whether a fact commits (issue 31, item 2) ---------------------

# The hostile corpus's 160,000 distinct words as a person's answer and as the model's text:
# before the search indexes covered a bounded prefix, PostgreSQL refused their tsvector
# ("string is too long for tsvector") and neither could ever commit.
LONG_TEXT = LONG_WORDS
TEXT_SCHEMA = {
    "type": "object",
    "properties": {"text": {"type": "string"}},
    "required": ["text"],
}
# The densest text for a tsvector: distinct hyphenated pairs of CJK letters ("x-y" indexes as
# "x-y", "x" and "y"), about 7.4 bytes of tsvector per character; at the start input's
# 200,000-character limit that is 1.46 MB of lexemes, over PostgreSQL's 1 MB.
LETTERS = [
    chr(code)
    for start, end in [
        (0x20000, 0x2A6E0),  # CJK extension B (4 bytes in UTF-8)
        (0x2A700, 0x2B73A),  # C
        (0x2B740, 0x2B81E),  # D
        (0x2B820, 0x2CEA2),  # E
        (0x2CEB0, 0x2EBE1),  # F
        (0x30000, 0x3134B),  # G
        (0x4E00, 0xA000),  # CJK unified ideographs (3 bytes)
        (0xAC00, 0xD7A4),  # Hangul syllables
        (0x3400, 0x4DC0),  # CJK extension A
    ]
    for code in range(start, end)
]
DENSE_INPUT = " ".join(f"{LETTERS[2 * n]}-{LETTERS[2 * n + 1]}" for n in range(len(LETTERS) // 2))[
    :200_000
]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's tsvector limit")
def test_a_long_answer_and_a_long_model_text_commit_and_the_run_goes_on(api, start):
    from runtime.search import INDEXED_PREFIX

    ask = {"name": "ask_input", "arguments": {"question": "Paste", "answer_schema": TEXT_SCHEMA}}
    run = start({"tool_calls": [ask]}, {"text": LONG_TEXT})
    drive()
    ticket = api.get(f"/runs/{run['id']}").json()["ticket"]
    answer = {"ticket_id": ticket["id"], "kind": "input", "input": {"text": LONG_TEXT}}
    response = api.post(f"/runs/{run['id']}/resume", answer)
    assert response.status_code == 200, response.content[:500]
    drive()
    document = api.get(f"/runs/{run['id']}").json()
    assert (document["state"], document["end_cause"]) == ("ended", "natural")
    # The whole texts are the facts; search indexes a prefix of each.
    assert LONG_TEXT in MessageRecord.objects.get(run_id=run["id"], role="tool").content
    said = MessageRecord.objects.get(run_id=run["id"], role="assistant", content=LONG_TEXT)
    early, late = "w10", f"w{159_999:x}"
    assert said.content.index(late) > INDEXED_PREFIX
    assert ids(api.get("/runs", q=early)) == [run["id"]]
    assert ids(api.get("/runs", q=late)) == []  # past the prefix: not found (documented)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's tsvector limit")
def test_long_tool_arguments_commit_and_the_run_goes_on(api, start):
    # The tool refuses a question this long (an error result the model sees): the call and
    # its argument text are committed first, and the run goes on to its answer.
    ask = {"name": "ask_input", "arguments": {"question": LONG_TEXT, "answer_schema": {}}}
    run = start({"tool_calls": [ask]}, {"text": "done"})
    drive()
    document = api.get(f"/runs/{run['id']}").json()
    assert (document["state"], document["end_cause"]) == ("ended", "natural")
    (call,) = ToolCallRecord.objects.filter(run_id=run["id"])
    assert LONG_TEXT in call.arguments_text
    assert ids(api.get("/runs", q="w10")) == [run["id"]]


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's tsvector limit")
def test_the_densest_input_at_its_limit_starts_a_run(api):
    assert len(DENSE_INPUT) == 200_000
    response = api.post("/runs", {"agent": "demo", "input": DENSE_INPUT})
    assert response.status_code == 201, response.content[:500]
    run_id = response.json()["id"]
    assert ids(api.get("/runs", q=DENSE_INPUT[:3])) == [run_id]
