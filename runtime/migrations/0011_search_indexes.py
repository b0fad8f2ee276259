"""Full text search indexes for run search (runtime.search), on PostgreSQL only.

GIN indexes over ``to_tsvector('simple', ...)`` of message content and call argument text:
the expressions runtime.search queries with. SQLite has no such index (its search is a plain
scan, documented in runtime.search), so there this migration does nothing.
"""

from django.db import migrations

INDEXES = (
    ("message_text_search", "runtime_messagerecord", "content"),
    ("call_arguments_search", "runtime_toolcallrecord", "arguments_text"),
)


def create(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, table, column in INDEXES:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {name} ON {table} "
            f"USING gin (to_tsvector('simple', {column}))"
        )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name, _, _ in INDEXES:
        schema_editor.execute(f"DROP INDEX IF EXISTS {name}")


class Migration(migrations.Migration):
    dependencies = [("runtime", "0010_call_effects")]

    operations = [migrations.RunPython(create, drop, elidable=False)]
