#!/usr/bin/env python
"""Django's command-line utility for the durable agent runtime."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as exc:  # a bad setting: its message names it, in one line
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
