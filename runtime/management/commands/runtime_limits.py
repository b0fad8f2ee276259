"""``manage.py runtime_limits [--json]``: each limit on what runs at once and its use now.

One line per run limit (agent, running of runs, waiting, the busiest key value) and per model
limit (in flight of concurrency, requests a minute and the bucket's tokens, the pause a
provider's Retry-After set); ``--json`` prints ``runtime.limits.usage()``: ``{"runs": [...],
"models": [...]}``. Read from the database, so every worker's runs count. Exits 0.
"""

from __future__ import annotations

import json
from typing import Any

from runtime import limits
from runtime.management.base import RuntimeCommand


def _of(used: Any, bound: Any) -> str:
    return f"{used} of {'-' if bound is None else f'{bound:g}'}"


class Command(RuntimeCommand):
    help = "Show each limit on what runs at once (runs per agent and key, models) and its use."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        use = limits.usage()
        if options["json"]:
            self.stdout.write(json.dumps(use, indent=2, sort_keys=True, default=str))
            return
        for r in use["runs"]:
            line = f"agent {r['agent']}: {_of(r['running'], r['runs'])} running, "
            line += f"{r['waiting']} waiting"
            if r["key"]:
                line += (
                    f"; per {r['key']}: at most {r['per_key']}"
                    f" (busiest {r['busiest_key']!r}: {r['busiest_running']})"
                )
            self.stdout.write(line)
        for m in use["models"]:
            line = f"model {m['model']}: {_of(m['in_flight'], m['concurrency'])} in flight"
            if m["per_minute"] is not None:
                line += f", {m['per_minute']:g} a minute ({m['tokens']:g} tokens now)"
            if m["not_before"]:
                line += f", paused by the provider until {m['not_before'].isoformat()}"
            self.stdout.write(line + f", {m['waiting']} waiting")
        if not use["runs"] and not use["models"]:
            self.stdout.write(
                "no limits (RUNTIME_RUN_LIMITS, RUNTIME_MODEL_LIMITS, or an agent's limits)"
            )
