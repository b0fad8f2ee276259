"""The console's groups and their permissions, created by ``manage.py runtime_bootstrap``
(never by a migration: a host's auth tables get them only when it asks).

Commands call ``ensure_groups`` so they also work on a database whose rows were flushed
(tests) or whose groups were deleted by hand.
"""

from __future__ import annotations

from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.db import transaction

GROUPS = {
    "viewers": ("read_runs",),
    "approvers": ("read_runs", "resume_runs"),
    "operators": ("read_runs", "resume_runs", "operate_runs"),
}
PERMISSIONS = {
    "read_runs": "Can read runs, tickets and the log",
    "resume_runs": "Can approve, deny and give input to tickets",
    "operate_runs": "Can start and cancel runs and reconcile tool calls",
}


def ensure_groups() -> dict[str, Group]:
    """Create the viewers, approvers and operators groups with their console permissions when
    missing; return them by name."""
    with transaction.atomic():
        content_type, _ = ContentType.objects.get_or_create(app_label="console", model="access")
        perms = {}
        for codename, name in PERMISSIONS.items():
            perms[codename], _ = Permission.objects.get_or_create(
                content_type=content_type, codename=codename, defaults={"name": name}
            )
        groups = {}
        for group_name, codenames in GROUPS.items():
            groups[group_name], _ = Group.objects.get_or_create(name=group_name)
            groups[group_name].permissions.add(*(perms[c] for c in codenames))
    return groups
