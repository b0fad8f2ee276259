"""Filters that turn committed JSON into readable, escaped text.

Every filter returns plain strings (never ``mark_safe``), so model output and tool arguments
stay inert text under autoescaping.
"""

from __future__ import annotations

import json
from typing import Any

from django import template

register = template.Library()


@register.filter
def pretty_json(value: Any) -> str:
    """Indented JSON of a value; text that is itself JSON is re-indented."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (json.JSONDecodeError, ValueError):
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@register.filter
def short(value: Any, length: int = 8) -> str:
    """The first characters of an id (the full id stays in the title and link)."""
    return str(value or "")[: int(length)]


@register.filter
def label(value: Any) -> str:
    return str(value or "").replace("_", " ")


def _call(event: dict[str, Any]) -> str:
    return str(event.get("call_id", ""))[:8]


@register.filter
def event_summary(event: dict[str, Any]) -> str:
    """One line for one logged event."""
    kind = event.get("type", "?")
    match kind:
        case "RunActivated":
            return f"run activated ({event.get('agent')})"
        case "StepCommitted":
            return f"step {event.get('step')} committed"
        case "BatchOpened":
            names = ", ".join(c.get("name", "?") for c in event.get("calls", []))
            return f"batch of step {event.get('step')} opened: {names}"
        case "CallExecuting":
            worker = event.get("worker") or "?"
            return f"call {_call(event)} executing, attempt {event.get('attempt')} ({worker})"
        case "CallAwaiting":
            return f"call {_call(event)} awaiting ticket {str(event.get('ticket_id'))[:8]}"
        case "CallResumed":
            reason = f": {event['reason']}" if event.get("reason") else ""
            return f"call {_call(event)} resumed: {event.get('decision')}{reason}"
        case "CallCompleted":
            error = " (error)" if event.get("is_error") else ""
            return f"call {_call(event)} completed{error}"
        case "CallIndeterminate":
            return f"call {_call(event)} indeterminate: {event.get('reason')}"
        case "BatchFinalized":
            return f"batch of step {event.get('step')} finalized"
        case "ReconciliationRecorded":
            return f"reconciled call {_call(event)}: {label(event.get('outcome'))}"
    return str(kind)


@register.filter
def disposition_summary(disposition: dict[str, Any] | None) -> str:
    if not disposition:
        return "thread note"
    state = disposition.get("state", "?")
    if state == "ended":
        return f"ended ({label(disposition.get('end_cause'))})"
    if state == "awaiting":
        ticket = disposition.get("ticket") or {}
        return f"awaiting {ticket.get('kind', '')} ticket"
    return str(state)


@register.filter
def state_class(run: Any) -> str:
    """A CSS class for a run's state badge: running, awaiting, ended-<cause>."""
    state = run.get("state") if isinstance(run, dict) else getattr(run, "state", "")
    cause = run.get("end_cause") if isinstance(run, dict) else getattr(run, "end_cause", "")
    return f"ended-{cause}" if state == "ended" else str(state)


@register.filter
def get(mapping: Any, key: Any) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None
