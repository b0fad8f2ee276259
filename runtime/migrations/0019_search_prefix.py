"""The full text search indexes cover a bounded prefix of each text (issue 31, item 2).

PostgreSQL refuses a tsvector whose lexemes and positions take more than 1,048,575 bytes
("string is too long for tsvector"), and an index over ``to_tsvector(column)`` computes one
for every row written: a long enough text could then never be inserted, so a fact (a person's
answer, a tool's result, the model's text or arguments) could never commit. The indexes of
migration 0011 are rebuilt over ``to_tsvector('simple', left(column, 100000))``, the
expression runtime.search queries with (``runtime.search.INDEXED_PREFIX`` says why 100,000
characters always fit). On SQLite, which has no such index, this migration does nothing.

The expression is written out here, not imported: a migration keeps the schema it made.
"""

from django.db import migrations

INDEXES = (
    ("message_text_search", "runtime_messagerecord", "content"),
    ("call_arguments_search", "runtime_toolcallrecord", "arguments_text"),
)


def _rebuild(schema_editor, expression: str) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, table, column in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")
        schema_editor.execute(
            f"CREATE INDEX {name} ON {table} "
            f"USING gin (to_tsvector('simple', {expression.format(column=column)}))"
        )


def bounded(apps, schema_editor):
    _rebuild(schema_editor, "left({column}, 100000)")


def whole(apps, schema_editor):
    _rebuild(schema_editor, "{column}")


class Migration(migrations.Migration):
    dependencies = [("runtime", "0018_run_counts")]

    operations = [migrations.RunPython(bounded, whole, elidable=False)]
