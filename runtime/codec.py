"""JSON encoding of the domain's values for the log and its projections.

pydantic's TypeAdapter does the work for the frozen dataclasses; events carry a ``type`` key so
that a stored log reads back into the same typed events.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import TypeAdapter

from runtime.domain import events as ev
from runtime.domain.model import Disposition, Message, RunView

EVENT_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        ev.RunActivated,
        ev.StepCommitted,
        ev.BatchOpened,
        ev.CallExecuting,
        ev.CallAwaiting,
        ev.ChildStarted,
        ev.CallResumed,
        ev.CallCompleted,
        ev.CallIndeterminate,
        ev.BatchFinalized,
        ev.StateStaged,
        ev.RunForked,
        ev.RunPaused,
        ev.RunResumed,
        ev.RunMoved,
        ev.ReconciliationRecorded,
    )
}


@cache
def _adapter(cls: Any) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def dump(value: Any) -> Any:
    """Encode a domain value (dataclass, tuple of them, or None) as JSON-ready data."""
    if value is None:
        return None
    cls: type = type(value)  # plain `type`: mypy reads type[Any] as unhashable (a cache key)
    return _adapter(cls).dump_python(value, mode="json")


def load(cls: Any, data: Any) -> Any:
    """Decode JSON data produced by ``dump`` back into ``cls``; None stays None."""
    if data is None:
        return None
    return _adapter(cls).validate_python(data)


def dump_event(event: ev.Event) -> dict[str, Any]:
    return {"type": type(event).__name__, **dump(event)}


def load_event(data: dict[str, Any]) -> ev.Event:
    fields = dict(data)
    return load(EVENT_TYPES[fields.pop("type")], fields)


def dump_disposition(disposition: Disposition | None) -> dict[str, Any] | None:
    return dump(disposition)


def load_disposition(data: dict[str, Any] | None) -> Disposition | None:
    return load(Disposition, data)


def dump_run(run: RunView) -> dict[str, Any]:
    return dump(run)


def load_run(data: dict[str, Any]) -> RunView:
    return load(RunView, data)


def dump_message(message: Message) -> dict[str, Any]:
    return dump(message)


def load_message(data: dict[str, Any]) -> Message:
    return load(Message, data)
