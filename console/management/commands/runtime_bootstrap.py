"""Create the console's groups and the first operator: ``manage.py runtime_bootstrap
[--username U] [--password P] [--groups-only]``.

The groups viewers, approvers and operators (``console.management.groups``) are created when
missing, every time: this command, not a migration, is how a project asks for them. The
operator is created only when no user exists yet, so running it again is harmless. The
username is held to Django's username validator (a refusal exits 2). The operator is staff: it
may manage users and groups in ``/admin/`` and view the runtime's tables there (read only).
Without ``--password`` a random password is generated and printed once.
"""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import transaction
from django.db.models import Q

from console.management.groups import ensure_groups
from console.management.users import clean_username
from runtime.management.base import RuntimeCommand

# The bootstrap operator manages who may do what (users and groups) in /admin/, and may look
# at the runtime's tables there (read only: runtime/admin.py).
ADMIN_CODENAMES = [
    f"{action}_{model}" for action in ("add", "change", "view") for model in ("user", "group")
]


def admin_permissions() -> list[Permission]:
    """Permissions of the bootstrap operator in the admin: manage users and groups, view
    every runtime table."""
    return list(
        Permission.objects.filter(
            Q(content_type__app_label="auth", codename__in=ADMIN_CODENAMES)
            | Q(content_type__app_label="runtime", codename__startswith="view_")
        )
    )


class Command(RuntimeCommand):
    help = "Create the first operator (user 'operator' in group operators) when no user exists."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="operator")
        parser.add_argument("--password", default=None, help="default: random, printed once")
        parser.add_argument(
            "--groups-only", action="store_true", help="create the groups, no operator"
        )

    def handle(self, *args, **options):
        User = get_user_model()
        username = clean_username(options["username"], "--username")
        password = options["password"] or secrets.token_urlsafe(12)
        with transaction.atomic():
            groups = ensure_groups()
            if options["groups_only"]:
                self.stdout.write("The groups viewers, approvers and operators are ready.")
                return
            if User.objects.exists():
                self.stdout.write(
                    "A user already exists; no operator was created (the groups are ready)."
                )
                return
            user = User.objects.create_user(username=username, password=password, is_staff=True)
            user.groups.add(groups["operators"])
            user.user_permissions.add(*admin_permissions())
        self.stdout.write(self.style.SUCCESS(f"Created operator {username!r}."))
        if options["password"] is None:
            self.stdout.write(f"Password (shown once): {password}")
