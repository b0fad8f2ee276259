"""``manage.py runtime_import FILE``: load a thread log written by ``runtime_export``.

The log is folded by the rules ``runtime_fsck`` applies before anything is written, written
through the commit coordinator, and checked by the log checker; any refusal writes nothing
and exits 1 with the reason. ``-`` reads stdin. Prints ``imported thread=<id> commits=<n>
runs=<n>``.
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import CommandError

from runtime import retention
from runtime.errors import ImportRefused
from runtime.management.base import RuntimeCommand


class Command(RuntimeCommand):
    help = "Load a thread's commit log exported by runtime_export (checked like runtime_fsck)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("file", metavar="FILE", help="the export (- for stdin)")

    def handle(self, *args: Any, file: str, **options: Any) -> None:
        try:
            if file == "-":
                result = retention.import_thread(sys.stdin)
            else:
                with open(file, encoding="utf-8") as lines:
                    result = retention.import_thread(lines)
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc}", returncode=2) from exc
        except UnicodeDecodeError as exc:
            message = f"cannot read {file}: not UTF-8 text ({exc.reason})"
            raise CommandError(message, returncode=2) from exc
        except ImportRefused as exc:
            raise CommandError(f"not imported: {exc.message}", returncode=1) from exc
        self.stdout.write(
            f"imported thread={result['thread_id']} commits={result['commits']} "
            f"runs={result['runs']}"
        )
