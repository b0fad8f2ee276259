"""Keyset conditions as SQL row comparisons: ``(created_at, id) < (X, Y)``.

A page after a cursor (console.api.pagination, the console's lists) and a batch after the last
one (runtime.retention) are read with one row comparison rather than ``created_at < X OR
(created_at = X AND id < Y)``: PostgreSQL reads a row comparison as the index condition of a
(created_at, id) index and starts the scan at the key, where the OR is a filter applied to
every row before it (issue 28). SQLite has row values since 3.15.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db.models import BooleanField, CharField, DateTimeField, Expression, F, Value


class RowCompare(Expression):
    """``(a, b) <op> (x, y)``: a SQL row comparison of two columns with two values.

    Django has no public row-value expression (``fields.tuple_lookups`` serves composite
    primary keys and is internal), hence this one: it compiles its four parts with the
    compiler, so columns are quoted and values adapted by their fields (a datetime as the
    backend stores it).
    """

    output_field = BooleanField()
    conditional = True  # usable in .filter()

    def __init__(self, columns: tuple[str, str], op: str, values: tuple[Any, Any]) -> None:
        if op not in ("<", "<=", ">", ">="):
            raise ValueError(op)
        super().__init__()
        self.op = op
        self.parts: list[Any] = [
            F(columns[0]),
            F(columns[1]),
            Value(values[0], output_field=DateTimeField()),
            Value(values[1], output_field=CharField()),
        ]

    def get_source_expressions(self) -> list[Any]:
        return self.parts

    def set_source_expressions(self, exprs: Sequence[Any]) -> None:
        self.parts = list(exprs)

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        sqls: list[str] = []
        params: list[Any] = []
        for part in self.parts:
            sql, part_params = compiler.compile(part)
            sqls.append(sql)
            params.extend(part_params)
        a, b, x, y = sqls
        return f"(({a}, {b}) {self.op} ({x}, {y}))", tuple(params)
