"""Indexes so every history read is bounded by its page (issue 28).

- ``Run.forked_from``: the fork relation as an indexed column, backfilled from
  ``metadata.forked_from.run_id`` (the run page found forks by scanning every run's metadata);
- ``run_held`` (workers page), ``run_cancelled_recent`` (audit's cancels), ``run_ended_order``
  (prune's batches), ``ticket_created`` (the tickets API's keyset pages),
  ``ticket_closed_recent`` (recently closed tickets: inbox and audit);
- on PostgreSQL only, a GIN index on ``runtime_run.metadata`` (jsonb_ops: serves both
  ``metadata ? key`` and ``metadata @> {...}``, runtime.search's metadata filter).

Plain ``CREATE INDEX`` (not CONCURRENTLY): it locks writes to the table while it builds, so
on a large database run it in a maintenance window (docs/performance.md).
"""

from django.db import migrations, models
from django.db.models.fields.json import KT

GIN = "run_metadata_gin"


def backfill_forked_from(apps, schema_editor):
    Run = apps.get_model("runtime", "Run")
    Run.objects.using(schema_editor.connection.alias).filter(
        metadata__forked_from__run_id__isnull=False
    ).update(forked_from=KT("metadata__forked_from__run_id"))


def create_gin(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"CREATE INDEX IF NOT EXISTS {GIN} ON runtime_run USING gin (metadata)"
    )


def drop_gin(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(f"DROP INDEX IF EXISTS {GIN}")


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0016_ledger_to_demo'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='forked_from',
            field=models.CharField(blank=True, max_length=32, null=True),
        ),
        migrations.RunPython(backfill_forked_from, migrations.RunPython.noop, elidable=False),
        migrations.RunPython(create_gin, drop_gin, elidable=False),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('forked_from__isnull', False)), fields=['forked_from', 'created_at', 'id'], name='run_forks'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('state', 'running')), fields=['lease_owner', 'committed_at'], name='run_held'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('end_cause', 'cancelled')), fields=['-committed_at'], name='run_cancelled_recent'),
        ),
        migrations.AddIndex(
            model_name='run',
            index=models.Index(condition=models.Q(('state', 'ended')), fields=['committed_at', 'id'], name='run_ended_order'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(fields=['created_at', 'id'], name='ticket_created'),
        ),
        migrations.AddIndex(
            model_name='ticket',
            index=models.Index(condition=models.Q(('state', 'open'), _negated=True), fields=['-closed_at'], name='ticket_closed_recent'),
        ),
    ]
