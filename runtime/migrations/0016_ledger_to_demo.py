"""The demo's ledger (LedgerEffect) leaves the runtime for its own app, ``runtime.demo``
(label runtime_demo, issue 24): the model leaves the runtime's state here, and runtime_demo's
0001 adopts it with the same table, ``runtime_ledgereffect``. A database migrated before the
move keeps its ledger rows; a fresh one gets the table (from runtime 0001, or from
runtime_demo 0001 when this one dropped it).

The table is dropped here only where nothing will use it: the demo app is not installed and
the table is empty (a host project that never asked for the demo). A table holding rows is
never dropped."""

from django.apps import apps as global_apps
from django.db import migrations

TABLE = "runtime_ledgereffect"


def _table_exists(schema_editor) -> bool:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        return TABLE in connection.introspection.table_names(cursor)


def drop_when_unused(apps, schema_editor):
    if global_apps.is_installed("runtime.demo") or not _table_exists(schema_editor):
        return
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {connection.ops.quote_name(TABLE)} LIMIT 1")
        if cursor.fetchone() is not None:
            return
    schema_editor.delete_model(apps.get_model("runtime", "LedgerEffect"))


def create_when_missing(apps, schema_editor):
    if not _table_exists(schema_editor):
        schema_editor.create_model(apps.get_model("runtime", "LedgerEffect"))


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0015_webhooks'),
    ]

    operations = [
        migrations.RunPython(drop_when_unused, create_when_missing),
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='LedgerEffect')],
            database_operations=[],
        ),
    ]
