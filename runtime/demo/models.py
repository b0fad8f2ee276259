"""The demo agent's effect ledger."""

from __future__ import annotations

from django.apps import apps
from django.core.exceptions import ImproperlyConfigured
from django.db import models

if not apps.is_installed("runtime.demo"):
    # Without this, Django would give the model to the "runtime" app (the package holding
    # it): a runtime.LedgerEffect without a migration. Said before anything is registered.
    raise ImproperlyConfigured(
        'the demo (its agents, ledger and demo_ledger) needs its app: add "runtime.demo" to'
        " INSTALLED_APPS and migrate"
    )


class LedgerEffect(models.Model):
    """The demo agent's effect ledger: one row per operation id, with how often it applied.

    The table keeps the name it had when the model was the runtime's (``runtime_ledgereffect``,
    before migration runtime 0016): a database migrated before the demo became an app of its
    own keeps its rows (runtime_demo 0001)."""

    operation_id = models.CharField(max_length=100, unique=True)
    key = models.CharField(max_length=200)
    tool = models.CharField(max_length=100)
    run_id = models.CharField(max_length=32)
    applied = models.PositiveIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        db_table = "runtime_ledgereffect"
