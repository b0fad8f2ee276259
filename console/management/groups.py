"""The console's groups and their permissions, as migration console/0002 creates them.

Commands call ``ensure_groups`` so they also work on a database whose rows were flushed
(tests) or whose groups were deleted by hand.
"""

from __future__ import annotations

import importlib

from django.apps import apps
from django.contrib.auth.models import Group

_migration = importlib.import_module("console.migrations.0002_groups")


def ensure_groups() -> dict[str, Group]:
    """Create the viewers, approvers and operators groups when missing; return them by name."""
    _migration.create_groups(apps, None)
    return {name: Group.objects.get(name=name) for name in _migration.GROUPS}
