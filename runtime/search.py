"""Search runs: free text in their input, answers and tool arguments, a time range, a tool,
a metadata key and value, a parent. The console's runs list and ``GET /api/v1/runs`` share
these rules; both page the result by keyset (newest first), as before.

Free text on PostgreSQL is full text search (``websearch_to_tsquery`` with the ``simple``
configuration: words are ANDed, "quoted phrases" kept together, ``-word`` excluded, no
stemming) over the first INDEXED_PREFIX characters of the runs' user, system and assistant
messages and of their calls' argument text, answered from GIN indexes (migrations 0011 and
0019, PostgreSQL only): a word past them is not found. On SQLite it is a plain
``LIKE`` scan for the whole text, case-insensitive for ASCII (``icontains``), which reads
every message: fine for the embedded database's sizes, documented as such. Either way a text
that looks like an id also matches run, thread and operation id prefixes.
"""

from __future__ import annotations

import json
import math
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
# The characters of each text the full text indexes cover (PostgreSQL; migration 0019): words
# past them are not found. The bound keeps every tsvector under PostgreSQL's limit of
# 1,048,575 bytes of lexemes and positions, which an index computes on every insert: over it,
# the row (a fact) could never be written. The densest text found costs about 7.5 bytes per
# character: distinct hyphenated pairs of 4-byte letters ("x-y " gives the lexemes "x-y", "x"
# and "y", each with its length, alignment and a position). 100,000 characters of it measure
# 750,000 bytes (8.5 per character by the most pessimistic count: 850,000), inside the limit
# with room; 200,000 characters of it measure 1,465,248 bytes, over it. Plain words (about 1.6
# bytes per character) would allow more, but the bound must hold for any text.
INDEXED_PREFIX = 100_000
SEARCHED_ROLES = ("user", "system", "assistant")
META_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
ID_PREFIX = re.compile(r"^[0-9A-Za-z_-]{1,64}$")
# Past this many matched runs, a page of a text search walks history newest-first testing
# each run (the matches are dense: 1 run in 100 at a million runs) instead of reading every
# match and sorting them.
SEARCH_CAP = 10_000


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
        # The configuration and the prefix are in the SQL text, not parameters, so that the
        # planner matches the indexes' expression (migration 0019) even in a generic plan.
        def matches(column: str) -> RawSQL:
            indexed = f"to_tsvector('{CONFIG}', left({column}, {INDEXED_PREFIX}))"
            return RawSQL(
                f"{indexed} @@ websearch_to_tsquery('{CONFIG}', %s)",
                [text],
                output_field=BooleanField(),
            )

        return messages.filter(matches('"content"')), calls.filter(matches('"arguments_text"'))
    return messages.filter(content__icontains=text), calls.filter(arguments_text__icontains=text)


def _meta_contains(key: str, value: str) -> Q:
    """``metadata @> {key: value}`` (as a string, and as the JSON ``value`` parses to): a
    superset of the runs whose key's text equals ``value``, read through the GIN index on
    metadata (migration 0017, PostgreSQL). The exact text comparison still applies after it."""
    found = Q(metadata__contains={key: value})
    try:
        parsed = json.loads(value)
    except (ValueError, RecursionError):
        return found
    if isinstance(parsed, float) and not math.isfinite(parsed):  # NaN, Infinity: not JSON
        return found
    return found | Q(metadata__contains={key: parsed})


def _text_branches(text: str) -> list[QuerySet[Any]]:
    """One query per place a text can match, each selecting the matching runs' ids from its
    own index: the messages' and calls' text (GIN on PostgreSQL), and, for a text that looks
    like an id, the run, thread and operation id prefixes (their ``LIKE`` indexes)."""
    messages, calls = _matching_text(text)
    branches: list[QuerySet[Any]] = [messages.values("run_id"), calls.values("run_id")]
    if ID_PREFIX.match(text):
        branches += [
            Run.objects.filter(id__startswith=text).values("id"),
            Run.objects.filter(thread__id__startswith=text).values("id"),
            ToolCallRecord.objects.filter(operation_id__startswith=text).values("run_id"),
        ]
    return branches


def matched_sql(text: str, *, distinct: bool = True) -> tuple[str, list[Any]]:
    """The SQL (and its parameters) of the ids of the runs whose text or id ``text`` matches
    (the module's rules): a ``UNION`` of one indexed lookup per branch, so that the database
    reads the matching rows only, never every run; ``UNION ALL`` when not ``distinct`` (a run
    may then come more than once, and a LIMIT stops the lookups early). ``text`` is stripped
    and non-empty."""
    parts: list[str] = []
    params: list[Any] = []
    for branch in _text_branches(text):
        sql, branch_params = branch.order_by().query.get_compiler(using=db.alias()).as_sql()
        parts.append(sql)
        params.extend(branch_params)
    return (" UNION " if distinct else " UNION ALL ").join(parts), params


def _first_rows(sql: str, params: list[Any], limit: int) -> list[str]:
    with db.connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM ({sql}) matched LIMIT %s", [*params, limit])
        return [row[0] for row in cursor.fetchall()]


def matched_ids(text: str, cap: int) -> list[str] | None:
    """The ids of the runs ``text`` matches (``matched_sql``), at most ``cap`` of them, or
    None when more than ``cap`` match: computed once, so that a page and its counts reuse it
    (``narrow(..., ids=)``) instead of matching the text again for each.

    Bounded by ``cap``: the lookups are read with ``UNION ALL`` under a LIMIT (2 rows per id
    allowed for runs matched in several places), so a common word stops after a few thousand
    rows; only when that many rows repeat fewer than ``cap`` runs is the distinct ``UNION``
    read instead."""
    text = text.strip()
    limit = 2 * (cap + 1)
    sql, params = matched_sql(text, distinct=False)
    rows = _first_rows(sql, params, limit)
    ids = list(dict.fromkeys(rows))
    if len(ids) > cap:
        return None
    if len(rows) < limit:
        return ids
    sql, params = matched_sql(text)
    ids = _first_rows(sql, params, cap + 1)
    return ids if len(ids) <= cap else None


def _dense(text: str) -> Q:
    """The predicate of a text that matches more than SEARCH_CAP runs, tested run by run
    while the page walks history newest-first (index run_recent): matches are then dense
    enough that a page fills after a few runs per match."""
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
    return found


def narrow[QS: QuerySet[Run]](runs: QS, search: RunSearch, *, ids: list[str] | None = None) -> QS:
    """``runs`` restricted to those ``search`` finds.

    A text is matched first (``matched_ids``, the union of index lookups, one query) unless
    the caller passes ``ids`` it computed so for the same text; the page is then taken over
    those ids by (created_at, id). Past SEARCH_CAP matches the text is tested run by run
    instead (``_dense``). Either way the runs found are the same."""
    text = search.text.strip()
    if text:
        if ids is None:
            ids = matched_ids(text, SEARCH_CAP)
        runs = runs.filter(id__in=ids) if ids is not None else runs.filter(_dense(text))
    if search.since is not None:
        runs = runs.filter(created_at__gte=search.since)
    if search.until is not None:
        runs = runs.filter(created_at__lt=search.until)
    if search.tool:
        tool_calls = ToolCallRecord.objects.filter(run_id=OuterRef("pk"), name=search.tool)
        runs = runs.filter(Exists(tool_calls))
    if search.meta_key:
        runs = runs.filter(metadata__has_key=search.meta_key)
        if search.meta_value and db.connection.vendor == "postgresql":
            runs = runs.filter(_meta_contains(search.meta_key, search.meta_value))
        if search.meta_value:
            # Cast: compared as text on both databases (a number's value is its JSON text).
            value = Cast(KeyTextTransform(search.meta_key, "metadata"), TextField())
            runs = runs.alias(meta_text=value).filter(meta_text=search.meta_value)
    if search.parent:
        runs = runs.filter(parent_run_id=search.parent)
    return runs
