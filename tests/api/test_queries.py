"""Query counts of the reading endpoints do not grow with what they list (no N+1)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.django_db


def queries(api, path: str, **params) -> int:
    api.get(path, **params)  # warm: token bookkeeping and permission caches
    with CaptureQueriesContext(connection) as captured:
        response = api.get(path, **params)
    assert response.status_code == 200, response.content
    return len(captured)


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("/runs", {}),
        ("/tickets", {}),
        ("/tool-calls", {"phase": "awaiting"}),
    ],
)
def test_lists_take_the_same_queries_for_one_item_or_many(api, awaiting, path, params):
    awaiting("approval")
    one = queries(api, path, **params)
    for _ in range(4):
        awaiting("approval")
    assert len(api.get(path, **params).json()["items"]) == 5
    assert queries(api, path, **params) == one


def test_a_thread_and_a_run_take_the_same_queries_however_long(api, awaiting, start):
    run = awaiting("approval")
    thread_one = queries(api, f"/threads/{run['thread_id']}")
    run_one = queries(api, f"/runs/{run['id']}")
    api.post(f"/runs/{run['id']}/cancel", {})
    for _ in range(3):
        later = start({"text": "x"}, thread=run["thread_id"])
        api.post(f"/runs/{later['id']}/cancel", {})
    assert queries(api, f"/threads/{run['thread_id']}") == thread_one
    assert queries(api, f"/runs/{run['id']}") == run_one
