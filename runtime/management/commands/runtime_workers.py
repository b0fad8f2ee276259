"""``manage.py runtime_workers [--json] [--stale]``: the registered workers.

One line per worker: id, status (live | stale | stopped), host, pid, version, the agents'
versions it carries, last heartbeat age and the runs it holds; ``--json`` prints
``{"workers": [{"id", "status", "host", "pid", "concurrency", "version", "agents",
"started_at", "heartbeat_at", "stopped_at", "runs"}], "stale_after_seconds"}``. ``--stale``
lists only stale workers.

``--forget-stale`` deletes the rows of stale workers that hold no run (a crash whose runs
were taken over), whatever their age, and prints ``forgot <id>`` for each and ``kept <id>:
holds <runs>`` for a stale worker whose runs nobody has taken over yet (they are reclaimed
once a worker runs; the row goes with the next ``--forget-stale`` after that). Live workers
also forget such rows by themselves after RUNTIME_WORKER_FORGET_SECONDS. Exits 0.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.utils import timezone

from runtime import inventory, registry
from runtime.management.base import RuntimeCommand


def _iso(value: Any) -> str | None:
    return value.isoformat() if value else None


def worker_documents(stale_only: bool = False) -> list[dict[str, Any]]:
    """Every registered worker as a JSON-ready dict, most recent heartbeat first."""
    now = timezone.now()
    documents = [
        {
            "id": row.worker.id,
            "status": row.status,
            "host": row.worker.host,
            "pid": row.worker.pid,
            "concurrency": row.worker.concurrency,
            "version": row.worker.version,
            "agents": row.worker.agents,
            "started_at": _iso(row.worker.started_at),
            "heartbeat_at": _iso(row.worker.heartbeat_at),
            "heartbeat_age_seconds": round((now - row.worker.heartbeat_at).total_seconds(), 1),
            "stopped_at": _iso(row.worker.stopped_at),
            "runs": row.runs,
        }
        for row in inventory.worker_rows(now)
    ]
    return [d for d in documents if d["status"] == "stale"] if stale_only else documents


class Command(RuntimeCommand):
    help = "List the registered workers, flag stale ones, and show the runs each holds."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object")
        parser.add_argument("--stale", action="store_true", help="only stale workers")
        parser.add_argument(
            "--forget-stale",
            action="store_true",
            help="delete the rows of stale workers that hold no run",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["forget_stale"]:
            self.forget_stale()
            return
        documents = worker_documents(options["stale"])
        stale_after = inventory.stale_after().total_seconds()
        if options["json"]:
            out = {"workers": documents, "stale_after_seconds": stale_after}
            self.stdout.write(json.dumps(out, indent=2, sort_keys=True))
            return
        for d in documents:
            runs = ",".join(d["runs"]) or "-"
            self.stdout.write(
                f"{d['id']}  {d['status'].upper():7}  host={d['host']} pid={d['pid']} "
                f"version={d['version'] or '-'} agents={_agents(d['agents'])} "
                f"heartbeat={d['heartbeat_age_seconds']}s ago "
                f"runs={runs}"
            )
        stale = sum(d["status"] == "stale" for d in documents)
        self.stdout.write(
            f"{len(documents)} worker(s), {stale} stale (no heartbeat for > {stale_after:g} s)"
        )

    def forget_stale(self) -> None:
        for worker_id in registry.forget(timedelta(0), stopped=False):
            self.stdout.write(f"forgot {worker_id}")
        for d in worker_documents(stale_only=True):  # what is left holds runs
            self.stdout.write(f"kept {d['id']}: holds {','.join(d['runs'])}")


def _agents(agents: dict[str, str]) -> str:
    """``name@version,...`` of the agents a worker carries ("-" for none)."""
    return ",".join(f"{name}@{version}" for name, version in sorted(agents.items())) or "-"
