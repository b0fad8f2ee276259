"""``manage.py runtime_token USERNAME [--name N] [--revoke PREFIX] [--list]``.

Without options: issue a personal API token for USERNAME and print it (stdout, one line, so
``TOKEN=$(python manage.py runtime_token alice)`` works). Only its digest is stored; it is
shown this once. ``--revoke PREFIX`` revokes the user's active token whose prefix (the first
characters shown in the console, or the whole token) matches; ``--list`` lists the user's tokens.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from console.models import ApiToken, token_digest
from runtime.management.base import RuntimeCommand

NAME_MAX = 100  # ApiToken.name's max_length


class Command(RuntimeCommand):
    help = "Issue (print once), revoke or list a user's personal API tokens."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="a label for the new token")
        action = parser.add_mutually_exclusive_group()
        action.add_argument("--revoke", metavar="PREFIX", help="revoke the token with this prefix")
        action.add_argument("--list", action="store_true", help="list the user's tokens")

    def handle(self, *args, username: str, name: str, revoke: str | None, list: bool, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user {username!r}")
        if list:
            self._list(user)
        elif revoke is not None:
            self._revoke(user, revoke.strip())
        else:
            if len(name) > NAME_MAX:
                raise CommandError(f"--name is too long ({NAME_MAX} characters at most)")
            row, token = ApiToken.issue(user, name=name)
            self.stderr.write(f"token {row.prefix}… for {username} (shown once; store it now)")
            self.stdout.write(token)

    def _revoke(self, user, prefix: str) -> None:
        if len(prefix) < 4:
            raise CommandError("give at least the first 4 characters of the token")
        active = ApiToken.objects.active().filter(user=user)
        matches = list(active.filter(digest=token_digest(prefix))) or [
            row for row in active if row.prefix.startswith(prefix) or prefix.startswith(row.prefix)
        ]
        if not matches:
            raise CommandError(f"{user.get_username()} has no active token {prefix}…")
        if len(matches) > 1:
            shown = ", ".join(f"{row.prefix}… ({row.name or 'unnamed'})" for row in matches)
            raise CommandError(f"{prefix!r} matches several tokens: {shown}; give more of it")
        matches[0].revoke()
        self.stdout.write(f"revoked {matches[0].prefix}…")

    def _list(self, user) -> None:
        for row in ApiToken.objects.filter(user=user).order_by("created_at"):
            state = f"revoked {row.revoked_at:%Y-%m-%d %H:%M}" if row.revoked_at else "active"
            used = f"{row.last_used_at:%Y-%m-%d %H:%M}" if row.last_used_at else "never"
            self.stdout.write(
                f"{row.prefix}…  {row.name or '-'}  created {row.created_at:%Y-%m-%d %H:%M}"
                f"  last used {used}  {state}"
            )
