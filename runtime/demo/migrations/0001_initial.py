"""The demo's ledger, adopted from the runtime (runtime 0016 removed it from the runtime's
state): the model enters this app's state with its old table, ``runtime_ledgereffect``, so a
database migrated before the move keeps its rows. The table is created only where it is
missing (a database whose runtime 0016 ran without the demo installed).

Unapplied, the table and its rows stay: they were the runtime's before this migration, and
runtime 0016 unapplied finds them there."""

from django.db import migrations, models

TABLE = "runtime_ledgereffect"


def create_when_missing(apps, schema_editor):
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if TABLE in connection.introspection.table_names(cursor):
            return
    schema_editor.create_model(apps.get_model("runtime_demo", "LedgerEffect"))


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('runtime', '0016_ledger_to_demo'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='LedgerEffect',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('operation_id', models.CharField(max_length=100, unique=True)),
                        ('key', models.CharField(max_length=200)),
                        ('tool', models.CharField(max_length=100)),
                        ('run_id', models.CharField(max_length=32)),
                        ('applied', models.PositiveIntegerField(default=1)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                    ],
                    options={
                        'db_table': TABLE,
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(create_when_missing, migrations.RunPython.noop),
    ]
