"""Personal API tokens as ``Authorization: Bearer <token>``, checked against a permission.

A token is looked up by its SHA-256 digest (only the digest is stored). No token, an unknown,
revoked or malformed one, or one whose user is inactive is a 401; a valid token whose user
lacks the operation's permission is a 403. The permissions are the console's: READ (read runs),
RESUME (approve / deny / give input), OPERATE (start, cancel, reconcile).
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, Permission
from django.db.models import Exists, OuterRef
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from console.api.errors import Forbidden
from console.models import OPERATE, READ, RESUME, TOKEN_PREFIX, ApiToken, token_digest

# last_used_at is bookkeeping for the console's token list; a write per request is not needed.
LAST_USED_RESOLUTION = timedelta(minutes=1)
MAX_TOKEN_LENGTH = 200
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


def _token_with_grant(permission: str, **lookup: object) -> ApiToken | None:
    """The unrevoked token matching ``lookup`` (or None), with its user and two booleans:
    ``to_user`` and ``to_group``, whether Django's ModelBackend gives the user ``permission``
    ("app_label.codename") directly or through a group. One query, where the token and then
    ``user.has_perm`` took three on every request (issue 12, item 8)."""
    app_label, codename = permission.split(".", 1)
    perms = Permission.objects.filter(content_type__app_label=app_label, codename=codename)
    return (
        ApiToken.objects.active()
        .select_related("user")
        .annotate(
            to_user=Exists(perms.filter(user=OuterRef("user_id"))),
            to_group=Exists(perms.filter(group__user=OuterRef("user_id"))),
        )
        .filter(**lookup)
        .first()
    )


def _allows(row: ApiToken, permission: str) -> bool:
    """Whether the token's active user holds ``permission``: what ``user.has_perm`` answers.
    A superuser holds every permission; ModelBackend's grant read with the token answers
    yes at no further cost (when ModelBackend is configured); other backends are asked only
    when that grant is missing."""
    user = row.user
    if not user.is_active:
        return False
    if user.is_superuser:
        return True
    granted = row.to_user or row.to_group  # type: ignore[attr-defined]  # annotated
    if granted and MODEL_BACKEND in settings.AUTHENTICATION_BACKENDS:
        return True
    return user.has_perm(permission)


class TokenAuth(HttpBearer):
    """Bearer-token authentication that also requires one console permission."""

    def __init__(self, permission: str) -> None:
        self.permission = permission
        super().__init__()

    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser | None:
        token = token.strip()
        if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_LENGTH:
            return None
        row = _token_with_grant(self.permission, digest=token_digest(token))
        if row is None or not row.user.is_active:
            return None
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        if not _allows(row, self.permission):
            raise Forbidden(
                f"{row.user.get_username()} lacks the permission {self.permission}",
                permission=self.permission,
            )
        request.api_token_id = row.pk  # type: ignore[attr-defined]  # streams re-check it
        return row.user


def token_still_allows(token_id: int, permission: str) -> bool:
    """Whether the token is still unrevoked, its user active and holding ``permission``.

    Open streams call this every few seconds (issue 12: a revoked token kept streaming). The
    user is read afresh, so no permission cache of the request's user object answers.
    """
    row = _token_with_grant(permission, pk=token_id)
    return row is not None and _allows(row, permission)


read_auth = TokenAuth(READ)
resume_auth = TokenAuth(RESUME)
operate_auth = TokenAuth(OPERATE)


def actor(request: HttpRequest) -> str:
    """The username that authenticated this request (recorded on every write)."""
    return request.auth.get_username()  # type: ignore[attr-defined]
