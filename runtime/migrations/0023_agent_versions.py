"""The agent's deployed version on a run (the one it started with) and on each commit (the
one whose code wrote it), issue 34.

SQLite adds a column with a default by rebuilding the table, which drops the run counts'
triggers on ``runtime_run`` (migration 0018): they are created again after it, on SQLite
alone (PostgreSQL adds the column in place and keeps them).
"""

import importlib

from django.db import migrations, models

RUN_COUNTS = importlib.import_module("runtime.migrations.0018_run_counts")


def recreate_sqlite_triggers(apps, schema_editor):
    if schema_editor.connection.vendor != "sqlite":
        return
    for statement in (*RUN_COUNTS.SQLITE_DROP, *RUN_COUNTS.SQLITE):
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("runtime", "0022_model_outage")]

    operations = [
        # Either way: backwards, the fields' removal rebuilds the table last.
        migrations.RunPython(migrations.RunPython.noop, recreate_sqlite_triggers),
        migrations.AddField(
            model_name="run",
            name="agent_version",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.AddField(
            model_name="threadcommit",
            name="agent_version",
            field=models.CharField(blank=True, default="", max_length=100),
        ),
        migrations.RunPython(recreate_sqlite_triggers, migrations.RunPython.noop),
    ]
