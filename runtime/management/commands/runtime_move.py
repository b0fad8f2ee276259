"""``manage.py runtime_move AGENT [--from-version V] [--run ID ...] [--apply] [--json]``: move
runs to the version of their agent this process carries (issue 34, item 3).

Without ``--apply`` it is a dry run: one block per run (not ended, not on that version), with
what moving it changes for each call it touches and what it does next, and writes nothing.
With ``--apply`` it moves the runs it can (one committed ``RunMoved`` each, in Audit) and
says which; a run a worker drives now is left as it is (pause it first). ``--json`` prints
``{"agent", "to_version", "runs": [{"run_id", "from_version", "to_version", "state",
"paused", "changes", "next", "refused"}], "moved": [run ids], "more"}``. Exits 0, or 1 with
``unknown_agent`` when this process does not carry AGENT.
"""

from __future__ import annotations

import getpass
import json

from django.core.management.base import CommandError

from runtime import moves, versions
from runtime.errors import RuntimeFault
from runtime.management.base import RuntimeCommand


class Command(RuntimeCommand):
    help = (
        "Move runs of AGENT to the version of it this process carries: a dry run listing "
        "what changes per run, or with --apply the move."
    )

    def add_arguments(self, parser):
        parser.add_argument("agent")
        parser.add_argument("--from-version", default=None, help="only runs on this version")
        parser.add_argument("--run", action="append", dest="run_ids", help="only this run")
        parser.add_argument("--limit", type=int, default=moves.PAGE, help="runs at most")
        parser.add_argument("--reason", default="")
        parser.add_argument("--apply", action="store_true", help="move them (else a dry run)")
        parser.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args, agent, from_version, run_ids, limit, reason, apply, as_json, **o):
        try:
            if apply:
                to_version, found, moved, more = moves.move(
                    agent,
                    from_version=from_version,
                    run_ids=run_ids,
                    limit=limit,
                    actor=f"cli:{getpass.getuser()}",
                    reason=reason,
                )
            else:
                to_version, found, more = moves.plan(
                    agent, from_version=from_version, run_ids=run_ids, limit=limit
                )
                moved = []
        except RuntimeFault as exc:
            raise CommandError(f"{exc.code}: {exc.message}") from exc
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        if as_json:
            runs = [m.document() for m in found]
            out = {"agent": agent, "to_version": to_version, "runs": runs}
            self.stdout.write(json.dumps({**out, "moved": moved, "more": more}, indent=2))
            return
        for m in found:
            done = "moved" if m.run_id in moved else ("not movable" if m.refused else "would move")
            paused = ", paused" if m.paused else ""
            self.stdout.write(
                f"run {m.run_id} ({m.state}{paused}) {m.from_version or '(none)'}"
                f" -> {to_version}: {done}"
            )
            for line in (*m.changes, f"next: {m.next}", *([m.refused] if m.refused else [])):
                self.stdout.write(f"  {line}")
        if not found:  # a version copied wrong, or nothing left: say what there is
            there = [f"{v or '(none)'}" for _, v in versions.open_versions(agent)]
            self.stdout.write(
                f"no run of {agent} that has not ended is on"
                f" {f'version {from_version}' if from_version else 'another version'};"
                f" versions its runs are on: {', '.join(there) or 'none'}"
            )
        verb = f"moved {len(moved)} of" if apply else "dry run:"
        tail = " (more match: run it again)" if more else ""
        tail += "" if apply or not found else "; add --apply to move them"
        self.stdout.write(f"{verb} {len(found)} run(s) of {agent} to {to_version}{tail}")
