"""Personal API tokens as ``Authorization: Bearer <token>``, checked against a permission.

A token is looked up by its SHA-256 digest (only the digest is stored). No token, an unknown,
revoked or malformed one, or one whose user is inactive is a 401; a valid token whose user
lacks the operation's permission is a 403. The permissions are the console's: READ (read runs),
RESUME (approve / deny / give input), OPERATE (start, cancel, reconcile).
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.http import HttpRequest
from django.utils import timezone
from ninja.security import HttpBearer

from console.api.errors import Forbidden
from console.models import OPERATE, READ, RESUME, TOKEN_PREFIX, ApiToken, token_digest

# last_used_at is bookkeeping for the console's token list; a write per request is not needed.
LAST_USED_RESOLUTION = timedelta(minutes=1)
MAX_TOKEN_LENGTH = 200


class TokenAuth(HttpBearer):
    """Bearer-token authentication that also requires one console permission."""

    def __init__(self, permission: str) -> None:
        self.permission = permission
        super().__init__()

    def authenticate(self, request: HttpRequest, token: str) -> AbstractBaseUser | None:
        token = token.strip()
        if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_LENGTH:
            return None
        row = (
            ApiToken.objects.active()
            .select_related("user")
            .filter(digest=token_digest(token))
            .first()
        )
        if row is None or not row.user.is_active:
            return None
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=row.pk).update(last_used_at=now)
        if not row.user.has_perm(self.permission):
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
    row = ApiToken.objects.active().select_related("user").filter(pk=token_id).first()
    return row is not None and row.user.is_active and row.user.has_perm(permission)


read_auth = TokenAuth(READ)
resume_auth = TokenAuth(RESUME)
operate_auth = TokenAuth(OPERATE)


def actor(request: HttpRequest) -> str:
    """The username that authenticated this request (recorded on every write)."""
    return request.auth.get_username()  # type: ignore[attr-defined]
