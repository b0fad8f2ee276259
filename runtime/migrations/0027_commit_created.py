"""An index of commits by time: ``runtime_fsck --since`` reads the threads with a recent
commit from it instead of walking every thread (issue 28, item 6). A plain CREATE INDEX in
the migration's transaction: it blocks commits while it builds (see docs/performance.md)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runtime', '0026_reconciliation_recent'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='threadcommit',
            index=models.Index(fields=['created_at'], name='commit_created'),
        ),
    ]
