"""Keyset cursors (console.api.pagination, runtime.keyset) never skip or repeat a row, with
rows sharing a creation time and rows inserted between pages, on both databases."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from runtime.models import Run, Thread

pytestmark = pytest.mark.django_db


def _runs(count: int, at) -> list[str]:
    """``count`` ended runs all created at ``at`` (ties: only the id orders them)."""
    ids = []
    for _ in range(count):
        thread = Thread.objects.create()
        run = Run.objects.create(thread=thread, agent="demo", state="ended", end_cause="natural")
        ids.append(run.id)
    Run.objects.filter(id__in=ids).update(created_at=at)
    return ids


def _walk(api, path: str, limit: int, between=None) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": limit, **({"cursor": cursor} if cursor else {})}
        response = api.get(path, **params)
        assert response.status_code == 200, response.content
        page = response.json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen
        if between is not None:
            between()


def test_runs_pages_neither_skip_nor_repeat_under_concurrent_inserts(api):
    now = timezone.now()
    tied = _runs(7, now - timedelta(hours=1))  # one creation time: the id breaks the tie
    older = _runs(5, now - timedelta(hours=2))
    existing = set(tied) | set(older)
    added: list[str] = []

    def insert() -> None:
        # Between pages: a run newer than all (now), and one tied with the listed ones.
        added.extend(_runs(1, now))
        added.extend(_runs(1, now - timedelta(hours=1)))

    seen = _walk(api, "/runs", 3, insert)
    assert len(seen) == len(set(seen)), "a run was listed twice"
    assert existing <= set(seen), "a run that existed before the walk was skipped"
    assert set(seen) - existing <= set(added)
    expected = [r.id for r in Run.objects.filter(id__in=seen).order_by("-created_at", "-id")]
    assert seen == expected, "pages out of (created_at, id) order"


def test_ascending_tickets_cursor_is_the_same_rule(api, awaiting):
    """Tickets page oldest first: the comparison flips (``>``) and still neither skips nor
    repeats."""
    ids = {awaiting("approval")["ticket"]["id"] for _ in range(5)}
    seen = _walk(api, "/tickets", 2, lambda: awaiting("input"))
    assert len(seen) == len(set(seen)) and ids <= set(seen)
