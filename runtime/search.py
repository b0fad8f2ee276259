"""Search runs: free text in their input, answers and tool arguments, a time range, a tool,
a metadata key and value, a parent. The console's runs list and ``GET /api/v1/runs`` share
these rules; both page the result by keyset (newest first), as before.

Free text on PostgreSQL is full text search (``websearch_to_tsquery`` with the ``simple``
configuration: words are ANDed, "quoted phrases" kept together, ``-word`` excluded, no
stemming) over the runs' user, system and assistant messages and their calls' argument
text, answered from GIN indexes (migration 0008, PostgreSQL only). On SQLite it is a plain
``LIKE`` scan for the whole text, case-insensitive for ASCII (``icontains``), which reads
every message: fine for the embedded database's sizes, documented as such. Either way a text
that looks like an id also matches run, thread and operation id prefixes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.expressions import RawSQL
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from runtime import db
from runtime.models import MessageRecord, Run, ToolCallRecord

CONFIG = "simple"  # the text search configuration of the queries and of the indexes
SEARCHED_ROLES = ("user", "system", "assistant")
META_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
ID_PREFIX = re.compile(r"^[0-9A-Za-z_-]{1,64}$")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSearch:
    """What to look for; every field is optional (None or "" means any).

    ``text``: free text (see the module); ``since``/``until``: the run's creation time,
    inclusive / exclusive (aware datetimes); ``tool``: a call of that tool's name;
    ``meta_key`` (letters, digits, ``_ . -``, at most 64) with ``meta_value``: that top-level
    metadata key exists, and its value as text equals ``meta_value`` when given;
    ``parent``: the parent run's id (its children).
    """

    text: str = ""
    since: datetime | None = None
    until: datetime | None = None
    tool: str = ""
    meta_key: str = ""
    meta_value: str = ""
    parent: str = ""

    def __post_init__(self) -> None:
        if self.meta_key and not META_KEY.match(self.meta_key):
            raise ValueError("a metadata key has 1 to 64 letters, digits, '_', '.' or '-'")
        if self.meta_value and not self.meta_key:
            raise ValueError("a metadata value is searched under a metadata key")


def _matching_text(text: str) -> tuple[QuerySet[Any], QuerySet[Any]]:
    """Messages and calls whose text matches ``text`` (the module's rules per database)."""
    messages = MessageRecord.objects.filter(role__in=SEARCHED_ROLES)
    calls = ToolCallRecord.objects.all()
    if db.connection.vendor == "postgresql":
        # The configuration is in the SQL text, not a parameter, so that the planner matches
        # the indexes' expressions (to_tsvector('simple', column)) even in a generic plan.
        def matches(column: str) -> RawSQL:
            return RawSQL(
                f"to_tsvector('{CONFIG}', {column}) @@ websearch_to_tsquery('{CONFIG}', %s)",
                [text],
                output_field=BooleanField(),
            )

        return messages.filter(matches('"content"')), calls.filter(matches('"arguments_text"'))
    return messages.filter(content__icontains=text), calls.filter(arguments_text__icontains=text)


def narrow[QS: QuerySet[Run]](runs: QS, search: RunSearch) -> QS:
    """``runs`` restricted to those ``search`` finds (one query; the text is matched through
    EXISTS subqueries on the indexes)."""
    text = search.text.strip()
    if text:
        messages, calls = _matching_text(text)
        found = Q(Exists(messages.filter(run_id=OuterRef("pk")))) | Q(
            Exists(calls.filter(run_id=OuterRef("pk")))
        )
        if ID_PREFIX.match(text):
            by_operation = ToolCallRecord.objects.filter(operation_id__startswith=text)
            found |= (
                Q(id__startswith=text)
                | Q(thread__id__startswith=text)
                | Q(Exists(by_operation.filter(run_id=OuterRef("pk"))))
            )
        runs = runs.filter(found)
    if search.since is not None:
        runs = runs.filter(created_at__gte=search.since)
    if search.until is not None:
        runs = runs.filter(created_at__lt=search.until)
    if search.tool:
        tool_calls = ToolCallRecord.objects.filter(run_id=OuterRef("pk"), name=search.tool)
        runs = runs.filter(Exists(tool_calls))
    if search.meta_key:
        runs = runs.filter(metadata__has_key=search.meta_key)
        if search.meta_value:
            # Cast: compared as text on both databases (a number's value is its JSON text).
            value = Cast(KeyTextTransform(search.meta_key, "metadata"), TextField())
            runs = runs.alias(meta_text=value).filter(meta_text=search.meta_value)
    if search.parent:
        runs = runs.filter(parent_run_id=search.parent)
    return runs
