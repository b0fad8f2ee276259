"""Audit's reconciliation entries read newest first through an index (issue 28): without it
the page sorted every reconciliation record joined to its call."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("runtime", "0025_lean_indexes")]

    operations = [
        migrations.AddIndex(
            model_name="reconciliationrecord",
            index=models.Index(fields=["-created_at"], name="reconciliation_recent"),
        ),
    ]
