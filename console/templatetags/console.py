"""Filters that turn committed JSON into readable, escaped text.

Every filter returns plain strings (never ``mark_safe``), so model output and tool arguments
stay inert text under autoescaping; the one tag that returns markup (``when``) builds it with
``format_html``, which escapes every value.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from django import template
from django.utils.html import format_html

from console.routing import ws_path
from runtime import conf

register = template.Library()


@register.simple_tag
def ws_url(name: str, *args: Any) -> str:
    """The path of the console's WebSocket route ``name`` (console.routing.ws_path)."""
    return ws_path(name, *args)


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
def trace_url(trace_id: Any) -> str:
    """The trace viewer's URL of ``trace_id`` (RUNTIME_TRACE_URL with ``{trace_id}``), or ""."""
    template = conf.trace_url()
    if not template or not trace_id:
        return ""
    return template.replace("{trace_id}", quote(str(trace_id), safe=""))


@register.filter
def short(value: Any, length: int = 8) -> str:
    """The first characters of an id (the full id stays in the title and link)."""
    return str(value or "")[: int(length)]


@register.filter
def label(value: Any) -> str:
    return str(value or "").replace("_", " ")


@register.filter
def event_summary(event: dict[str, Any], calls: dict[str, str] | None = None) -> str:
    """One line for one logged event; ``calls`` maps call ids to "#index name" (the batch
    cards' naming), else calls are named by an id prefix."""

    def _call(event: dict[str, Any]) -> str:
        call_id = str(event.get("call_id", ""))
        return (calls or {}).get(call_id) or call_id[:8]

    kind = event.get("type", "?")
    match kind:
        case "RunActivated":
            return f"run activated ({event.get('agent')})"
        case "StepCommitted":
            return f"step {event.get('step')} committed"
        case "BatchOpened":
            names = ", ".join(
                f"#{c.get('index', '?')} {c.get('name', '?')}" for c in event.get("calls", [])
            )
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
        case "RunMoved":
            reason = f": {event['reason']}" if event.get("reason") else ""
            before = event.get("from_version") or "(none)"
            return f"moved from version {before} to {event.get('to_version')}{reason}"
        case "RunForked":
            source = str(event.get("source_run_id", ""))[:8]
            return (
                f"forked from run {source} after step {event.get('at_step')} (commits "
                f"1-{event.get('source_seq')} copied; nothing ran again)"
            )
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


@register.filter
def past(decision: Any) -> str:
    """A decision in the past tense: approve -> approved."""
    return {"approve": "approved", "deny": "denied", "input": "answered"}.get(
        str(decision), str(decision or "")
    )


@register.filter
def first_line(text: Any, length: int = 120) -> str:
    """The first non-empty line of a text, cut to ``length`` characters."""
    line = next((ln.strip() for ln in str(text or "").splitlines() if ln.strip()), "")
    return line if len(line) <= int(length) else line[: int(length) - 1] + "…"


@register.filter
def span(value: Any) -> str:
    """A duration (timedelta or seconds) in words: "250 ms", "4.2 s", "3 min 7 s", "2 h 5 min";
    "—" for None."""
    if value is None:
        return "—"
    seconds = value.total_seconds() if hasattr(value, "total_seconds") else float(value)
    seconds = max(0.0, seconds)
    if seconds < 1:
        return f"{round(seconds * 1000)} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


@register.simple_tag
def when(moment: datetime | str | None, style: str = "full") -> str:
    """A ``<time>`` that always names its zone: UTC from the server, the browser's own zone
    once console.js localizes it (``data-local``), with the relative time in its title.

    ``style``: "full" (date and time) or "time" (time of day with milliseconds, for logs).
    """
    if moment is None or moment == "":
        return "—"
    if isinstance(moment, str):  # an ISO instant kept in a document (a pause's paused_at)
        moment = datetime.fromisoformat(moment)
    utc = moment.astimezone(UTC)
    text = utc.strftime("%Y-%m-%d %H:%M:%S") + " UTC"
    return format_html(
        '<time datetime="{}" data-local="{}" title="{}">{}</time>',
        utc.isoformat(),
        style,
        text,
        text,
    )
