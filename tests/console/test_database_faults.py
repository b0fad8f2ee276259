"""The console answers a database that cannot serve with a plain 503 page (issue 21, item 1).

A real fault: another connection holds the locks, the database cancels the request's
statement after its lock (busy) timeout. The page reads nothing from the database.
"""

from __future__ import annotations

import pytest
from django.urls import reverse

from runtime.models import Run
from tests.faults import locked_database

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_console_write_the_database_cancels_is_a_503_page_then_works(operator):
    url = reverse("console:start")
    with locked_database():
        response = operator.post(url, {"agent": "demo", "input": "hi"})
    assert response.status_code == 503
    assert int(response["Retry-After"]) > 0
    assert "The database is unavailable" in response.content.decode()
    assert not Run.objects.exists()
    assert operator.post(url, {"agent": "demo", "input": "hi"}).status_code == 302
    assert Run.objects.count() == 1


def test_a_database_fault_outside_a_view_is_a_503_too(rf):
    """Django's 500 handler (a fault in a middleware, say a session saved on the way out):
    a database fault is the 503 page, or the API's JSON under /api/; anything else a 500."""
    from django.db import OperationalError

    from console.unavailable import server_error

    for path, kind in [("/runs/", "text/html"), ("/api/v1/runs", "application/json")]:
        try:
            raise OperationalError("server closed the connection unexpectedly")
        except OperationalError:
            response = server_error(rf.get(path))
        assert response.status_code == 503 and response["Content-Type"].startswith(kind)
        assert int(response["Retry-After"]) > 0
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        assert server_error(rf.get("/runs/")).status_code == 500
