"""Make USERNAME an operator: ``manage.py runtime_operator USERNAME [--password P]``.

Creates the user when it does not exist (with a random password printed once, unless
``--password`` is given) and adds it to the operators group. USERNAME is held to the user
model's rules (Django's username validator and length); a refusal exits 2.
"""

from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.db import transaction

from console.management.groups import ensure_groups
from console.management.users import clean_username
from runtime.management.base import RuntimeCommand


class Command(RuntimeCommand):
    help = "Create a user or add an existing one to the operators group."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password", default=None, help="for a new user; default: random")

    def handle(self, *args, **options):
        User = get_user_model()
        username = clean_username(options["username"])
        with transaction.atomic():
            groups = ensure_groups()
            user = User.objects.filter(username=username).first()
            created = user is None
            password = options["password"] or secrets.token_urlsafe(12)
            if created:
                user = User.objects.create_user(username=username, password=password)
            user.groups.add(groups["operators"])
        if created:
            self.stdout.write(self.style.SUCCESS(f"Created operator {username!r}."))
            if options["password"] is None:
                self.stdout.write(f"Password (shown once): {password}")
        else:
            self.stdout.write(self.style.SUCCESS(f"{username!r} is in the operators group."))
            if options["password"] is not None:
                self.stderr.write(
                    f"{username!r} already existed: its password is unchanged"
                    f" (manage.py changepassword {username} changes it)"
                )
