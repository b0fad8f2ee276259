"""Once created the viewers, approvers and operators groups in the host's auth tables.

Groups are no migration's side effect any more: ``manage.py runtime_bootstrap`` creates them
when asked (scripts/start runs it), so a host project that installs the console gets no group
it did not ask for. The migration stays, empty, so that databases that applied it keep their
migration history.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = []
