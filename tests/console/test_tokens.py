"""Personal API tokens: created and shown once, listed by prefix, revoked."""

from __future__ import annotations

import pytest
from django.urls import reverse

from console.models import ApiToken, token_digest

pytestmark = pytest.mark.django_db


def test_create_shows_the_token_once(viewer):
    response = viewer.post(reverse("console:tokens"), {"name": "ci"})
    assert response.status_code == 201
    assert response["Cache-Control"] == "no-store"
    plain = response.context["new_token"]
    assert plain.startswith("rt_") and plain in response.content.decode()
    row = ApiToken.objects.get()
    assert row.digest == token_digest(plain) and row.user.username == "vera"
    again = viewer.get(reverse("console:tokens")).content.decode()
    assert plain not in again
    assert f"{row.prefix}…" in again and ">ci<" in again


def test_revoke(viewer):
    viewer.post(reverse("console:tokens"), {"name": "old"})
    row = ApiToken.objects.get()
    response = viewer.post(reverse("console:revoke_token", args=[row.id]), follow=True)
    assert response.status_code == 200
    row.refresh_from_db()
    assert row.revoked_at is not None
    assert b"revoked" in response.content
    assert viewer.get(reverse("console:revoke_token", args=[row.id])).status_code == 405


def test_cannot_revoke_someone_elses_token(viewer, operator):
    operator.post(reverse("console:tokens"), {"name": "mine"})
    row = ApiToken.objects.get()
    assert viewer.post(reverse("console:revoke_token", args=[row.id])).status_code == 404
    row.refresh_from_db()
    assert row.revoked_at is None
    assert b"mine" not in viewer.get(reverse("console:tokens")).content


def test_name_too_long(viewer):
    response = viewer.post(reverse("console:tokens"), {"name": "x" * 101})
    assert response.status_code == 400
    assert not ApiToken.objects.exists()
