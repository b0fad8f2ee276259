"""``manage.py runtime_show RUN [--json]``: print a run's committed state.

The plain form prints the run's line, its error (a failed run: type and message), its open
ticket, every batch with its calls, and the final answer (the last assistant text) once the
run has ended.
"""

from __future__ import annotations

import json
from textwrap import shorten
from typing import Any

from django.core.management.base import CommandError

from runtime.documents import run_document
from runtime.errors import NotFound
from runtime.management.base import RuntimeCommand


class Command(RuntimeCommand):
    help = "Print the committed state of a run (the run document with --json)."

    def add_arguments(self, parser):
        parser.add_argument("run_id")
        parser.add_argument("--json", action="store_true", help="print the run document")

    def handle(self, *args, run_id, **options):
        try:
            document = run_document(run_id)
        except NotFound as exc:
            raise CommandError(exc.message) from exc
        if options["json"]:
            self.stdout.write(json.dumps(document, indent=2, sort_keys=True))
            return
        cause = f" ({document['end_cause']})" if document["end_cause"] else ""
        release = f" agent_version={document['agent_version']}" if document["agent_version"] else ""
        self.stdout.write(
            f"run {document['id']} agent={document['agent']} state={document['state']}{cause} "
            f"version={document['version']}{release}"
        )
        if document["error"]:
            self.stdout.write(f"  error: {describe_error(document['error'])}")
        if document["pause"]:
            self.stdout.write(f"  {document['pause']['line']}")
        if document["parent"]:
            parent = document["parent"]
            self.stdout.write(f"  parent run {parent['run']} call {parent['call']}")
        for child in document["children"]:
            ended = f" ({child['end_cause']})" if child["end_cause"] else ""
            self.stdout.write(
                f"  child run {child['id']} agent={child['agent']} state={child['state']}{ended}"
            )
        for ticket in document["tickets"]:
            due = f" due_at={ticket['due_at']}" if ticket["due_at"] else ""
            self.stdout.write(f"  open ticket {ticket['id']} kind={ticket['kind']}{due}")
        for batch in document["batches"]:
            mark = "finalized" if batch["finalized"] else "open"
            self.stdout.write(f"  step {batch['step']} batch ({mark})")
            for call in batch["calls"]:
                # An error result (a denial, a refused argument) is said, not only in --json.
                failed = f" error: {shorten(str(call['result']), 80)}" if call["is_error"] else ""
                self.stdout.write(
                    f"    [{call['index']}] {call['name']} {call['phase']} "
                    f"attempt={call['attempt']} op={call['operation_id']}{failed}"
                )
        answer = final_answer(document)
        if answer is not None:
            self.stdout.write(f"  answer: {answer}")


def describe_error(error: Any) -> str:
    """``type: message`` of a run's error dict (any other shape as JSON)."""
    if isinstance(error, dict) and error.get("message"):
        kind = error.get("type") or "error"
        where = f" ({error['provider']})" if error.get("provider") else ""
        return f"{kind}{where}: {error['message']}"
    return json.dumps(error, sort_keys=True)


def final_answer(document: dict[str, Any]) -> str | None:
    """The last assistant text without tool calls of an ended run, or None."""
    if document["state"] != "ended":
        return None
    for message in reversed(document["messages"]):
        if message["role"] == "assistant" and not message["tool_calls"] and message["content"]:
            return message["content"]
    return None
