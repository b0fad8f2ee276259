"""Usernames given on the command line, held to the rules of Django's user model."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.db.models import Field


def clean_username(raw: str, label: str = "USERNAME") -> str:
    """Return ``raw`` stripped, once the user model's username field accepts it (its
    validators: letters, digits and @/./+/-/_ for Django's user, and its length); raise
    CommandError (exit 2) with the field's reason otherwise."""
    User = get_user_model()
    field = User._meta.get_field(User.USERNAME_FIELD)
    assert isinstance(field, Field)  # a column, never a relation
    username = raw.strip()
    try:
        return str(field.clean(username, None))
    except ValidationError as exc:
        raise CommandError(f"{label}: {' '.join(exc.messages)}", returncode=2) from exc
