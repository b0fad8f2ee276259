"""``GET /runs`` searches like the console (issue 22, item 5): free text, time range, tool,
metadata key and value, parent; keyset pages."""

from __future__ import annotations

from urllib.parse import quote

import pytest

from tests.api.conftest import error_of

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
