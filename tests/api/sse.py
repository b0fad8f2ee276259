"""A small Server-Sent Events reader for the tests (httpx streams lines; this groups them)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Event:
    event: str
    data: Any
    id: int | None


def parse(lines: Iterable[str]) -> Iterator[Event]:
    """Yield each event of an SSE stream; comments and ``retry`` lines are skipped."""
    fields: dict[str, str] = {}
    data: list[str] = []
    for line in lines:
        if line == "":
            if data:
                ident = fields.get("id")
                yield Event(
                    event=fields.get("event", "message"),
                    data=json.loads("\n".join(data)),
                    id=int(ident) if ident is not None else None,
                )
            fields, data = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            data.append(value)
        elif name in ("id", "event"):
            fields[name] = value
