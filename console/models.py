"""Console-side records: who may do what, and personal API tokens.

Permissions (used by the console and the JSON API alike):
``console.read_runs`` (viewers), ``console.resume_runs`` (approve / deny / give input:
approvers), ``console.operate_runs`` (cancel, reconcile, start runs: operators). The groups
``viewers``, ``approvers`` and ``operators`` are created by a migration.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

READ = "console.read_runs"
RESUME = "console.resume_runs"
OPERATE = "console.operate_runs"


class Access(models.Model):
    """Holds the console's permissions; it has no rows."""

    class Meta:
        managed = False
        default_permissions = ()
        permissions = [
            ("read_runs", "Can read runs, tickets and the log"),
            ("resume_runs", "Can approve, deny and give input to tickets"),
            ("operate_runs", "Can start and cancel runs and reconcile tool calls"),
        ]


TOKEN_PREFIX = "rt_"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet["ApiToken"]):
    def active(self) -> ApiTokenQuerySet:
        return self.filter(revoked_at__isnull=True)


class ApiToken(models.Model):
    """A personal API token. Only its SHA-256 digest is stored; the token is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True, default="")
    prefix = models.CharField(max_length=16)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    @classmethod
    def issue(cls, user, name: str = "") -> tuple[ApiToken, str]:
        """Create a token for ``user``; return the row and the plain token (shown once)."""
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        row = cls.objects.create(
            user=user, name=name, prefix=token[:10], digest=token_digest(token)
        )
        return row, token

    def revoke(self) -> None:
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
