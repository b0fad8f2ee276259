"""Drop the foreign keys' own indexes that another index already serves (issue 28, item 5).

Django gives every foreign key an index of its own, and on PostgreSQL a second one with the
``varchar_pattern_ops`` operator class (``..._like``) because the keys are text. Most were
never read: a commit's thread and run lead ``commit_seq_unique_per_thread`` and
``commit_run_seq``, a message's thread leads ``message_order_unique``, and no query matches
a prefix of a commit's, message's, call's or ticket's key, nor of a thread's, ticket's or
call's own id. At 100,000 runs of ``bench/history.py`` they held 1.6 KB per run. What stays: one plain index per key still read
alone (``message_run``, ``call_run``, ``ticket_run``, ``ticket_call``, ``thread_active_run``)
and, for a run's thread, one pattern-class index (``run_thread``) that answers equality and
the search's thread id prefix alike.

The old indexes are found by introspection (their names are Django's hashes) and dropped
with ``DROP INDEX``; the fields' ``db_index=False`` is a change of state only, because
SQLite would otherwise rebuild each table (and ``runtime_run``'s rebuild drops the run
counts' triggers of migration 0018).
"""

from django.db import migrations, models

# (model, foreign key column) whose single-column indexes go.
DROPPED = (
    ("threadcommit", "thread_id"),
    ("threadcommit", "run_id"),
    ("messagerecord", "thread_id"),
    ("messagerecord", "run_id"),
    ("toolcallrecord", "run_id"),
    ("ticket", "run_id"),
    ("ticket", "call_id"),
    ("thread", "active_run_id"),
    ("run", "thread_id"),
    # PostgreSQL's pattern-class copies of primary keys whose prefixes no query matches (the
    # primary key's own index stays).
    ("thread", "id"),
    ("ticket", "id"),
    ("toolcallrecord", "id"),
)


def drop_key_indexes(apps, schema_editor):
    connection = schema_editor.connection
    for model_name, column in DROPPED:
        table = apps.get_model("runtime", model_name)._meta.db_table
        with connection.cursor() as cursor:
            found = connection.introspection.get_constraints(cursor, table)
        for name, info in found.items():
            plain = info["index"] and not (info["unique"] or info["primary_key"])
            if plain and info["columns"] == [column]:
                schema_editor.execute(f"DROP INDEX {schema_editor.quote_name(name)}")


def create_key_indexes(apps, schema_editor):
    for model_name, column in DROPPED:
        if column == "id":
            continue  # its primary key index serves it
        model = apps.get_model("runtime", model_name)
        field = column.removesuffix("_id")
        schema_editor.add_index(
            model, models.Index(fields=[field], name=f"{model_name}_{field}_fk")
        )


def key(model_name, name, to, **options):
    return migrations.AlterField(
        model_name=model_name,
        name=name,
        field=models.ForeignKey(db_index=False, on_delete=models.CASCADE, to=to, **options),
    )


class Migration(migrations.Migration):
    dependencies = [("runtime", "0024_versions_routing")]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                key("messagerecord", "run", "runtime.run", related_name="messages"),
                key("messagerecord", "thread", "runtime.thread", related_name="messages"),
                key("run", "thread", "runtime.thread", related_name="runs"),
                migrations.AlterField(
                    model_name="thread",
                    name="active_run",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=models.SET_NULL,
                        related_name="+",
                        to="runtime.run",
                    ),
                ),
                key(
                    "threadcommit",
                    "run",
                    "runtime.run",
                    related_name="commits",
                    blank=True,
                    null=True,
                ),
                key("threadcommit", "thread", "runtime.thread", related_name="commits"),
                key("ticket", "call", "runtime.toolcallrecord", related_name="tickets"),
                key("ticket", "run", "runtime.run", related_name="tickets"),
                key("toolcallrecord", "run", "runtime.run", related_name="calls"),
            ],
            database_operations=[migrations.RunPython(drop_key_indexes, create_key_indexes)],
        ),
        migrations.AddIndex(
            model_name="messagerecord", index=models.Index(fields=["run"], name="message_run")
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                fields=["thread"], name="run_thread", opclasses=["varchar_pattern_ops"]
            ),
        ),
        migrations.AddIndex(
            model_name="thread",
            index=models.Index(fields=["active_run"], name="thread_active_run"),
        ),
        migrations.AddIndex(
            model_name="ticket", index=models.Index(fields=["run"], name="ticket_run")
        ),
        migrations.AddIndex(
            model_name="ticket", index=models.Index(fields=["call"], name="ticket_call")
        ),
        migrations.AddIndex(
            model_name="toolcallrecord", index=models.Index(fields=["run"], name="call_run")
        ),
    ]
