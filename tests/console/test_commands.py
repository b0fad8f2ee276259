"""runtime_bootstrap and runtime_operator."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command

from console.models import OPERATE

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_bootstrap_creates_the_first_operator_once():
    out = run("runtime_bootstrap")
    password = out.split("Password (shown once): ")[1].strip()
    user = authenticate(username="operator", password=password)
    assert user is not None and user.has_perm(OPERATE)
    assert list(user.groups.values_list("name", flat=True)) == ["operators"]
    again = run("runtime_bootstrap", "--username", "other")
    assert "already exists" in again
    assert get_user_model().objects.count() == 1


def test_bootstrap_with_username_and_password():
    out = run("runtime_bootstrap", "--username", "root-op", "--password", "s3cret-pass")
    assert "Password" not in out
    assert authenticate(username="root-op", password="s3cret-pass") is not None


def test_bootstrap_refuses_an_empty_username():
    with pytest.raises(CommandError):
        run("runtime_bootstrap", "--username", " ")


def test_operator_creates_or_promotes(make_user):
    out = run("runtime_operator", "newbie")
    assert "Created operator 'newbie'" in out and "Password (shown once)" in out
    assert get_user_model().objects.get(username="newbie").has_perm(OPERATE)
    viewer = make_user("vee", "viewers")
    assert not viewer.has_perm(OPERATE)
    out = run("runtime_operator", "vee")
    assert "is in the operators group" in out
    viewer = get_user_model().objects.get(username="vee")
    assert viewer.has_perm(OPERATE)
    assert sorted(viewer.groups.values_list("name", flat=True)) == ["operators", "viewers"]


def test_operator_says_an_existing_users_password_is_unchanged(make_user):
    make_user("olga", "viewers")
    err = io.StringIO()
    call_command(
        "runtime_operator", "olga", "--password", "new-pass-123", stdout=io.StringIO(), stderr=err
    )
    assert "'olga' already existed: its password is unchanged" in err.getvalue()
    assert authenticate(username="olga", password="new-pass-123") is None


def test_migrate_creates_no_group_and_bootstrap_is_how_a_project_asks():
    """A host's auth tables get the console's groups only from runtime_bootstrap (scripts/start
    runs it), never as a side effect of migrate (console/0002 is empty now)."""
    from django.contrib.auth.models import Group

    assert not Group.objects.exists()  # the test database was migrated
    out = run("runtime_bootstrap", "--groups-only")
    assert "groups viewers, approvers and operators are ready" in out
    assert sorted(Group.objects.values_list("name", flat=True)) == [
        "approvers",
        "operators",
        "viewers",
    ]
    assert not get_user_model().objects.exists()
    run("runtime_bootstrap", "--groups-only")  # again: nothing new
    assert Group.objects.count() == 3
