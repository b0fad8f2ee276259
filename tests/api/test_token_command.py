"""``manage.py runtime_token``: issue (printed once, stored hashed), revoke, list."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from console.models import ApiToken, token_digest

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    call_command("runtime_token", *args, stdout=out, stderr=err)
    return out.getvalue().strip()


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_superuser("alice", password=None)


def test_issue_prints_a_token_that_is_stored_hashed(alice):
    token = run("alice", "--name", "ci")
    assert token.startswith("rt_") and "\n" not in token
    row = ApiToken.objects.get(user=alice)
    assert row.name == "ci"
    assert row.digest == token_digest(token)
    assert token not in (row.digest, row.prefix) and token.startswith(row.prefix)
    response = Client().get("/api/v1/runs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200


def test_revoke_by_prefix(alice):
    token = run("alice")
    assert "revoked" in run("alice", "--revoke", token[:10])
    assert ApiToken.objects.get(user=alice).revoked_at is not None
    response = Client().get("/api/v1/runs", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 401


def test_revoke_by_whole_token(alice):
    token = run("alice")
    run("alice", "--revoke", token)
    assert not ApiToken.objects.active().exists()


def test_revoke_refuses_unknown_and_ambiguous_prefixes(alice):
    run("alice")
    run("alice")
    ApiToken.objects.update(prefix="rt_abcdefg")  # two tokens that look alike
    with pytest.raises(CommandError, match="several tokens"):
        run("alice", "--revoke", "rt_abcd")
    assert ApiToken.objects.active().count() == 2
    with pytest.raises(CommandError, match="no active token"):
        run("alice", "--revoke", "rt_zzzzzzz")
    with pytest.raises(CommandError, match="at least"):
        run("alice", "--revoke", "rt")


def test_list_shows_prefixes_never_tokens(alice):
    token = run("alice", "--name", "laptop")
    listing = run("alice", "--list")
    assert "laptop" in listing and token[:10] in listing and token not in listing


def test_an_unknown_user_is_an_error():
    with pytest.raises(CommandError, match="no user"):
        run("nobody")
