"""Create the viewers, approvers and operators groups with the console's permissions."""

from django.db import migrations

GROUPS = {
    "viewers": ("read_runs",),
    "approvers": ("read_runs", "resume_runs"),
    "operators": ("read_runs", "resume_runs", "operate_runs"),
}
PERMISSIONS = {
    "read_runs": "Can read runs, tickets and the log",
    "resume_runs": "Can approve, deny and give input to tickets",
    "operate_runs": "Can start and cancel runs and reconcile tool calls",
}


def create_groups(apps, schema_editor):
    ContentType = apps.get_model("contenttypes", "ContentType")
    Permission = apps.get_model("auth", "Permission")
    Group = apps.get_model("auth", "Group")
    content_type, _ = ContentType.objects.get_or_create(app_label="console", model="access")
    perms = {}
    for codename, name in PERMISSIONS.items():
        perms[codename], _ = Permission.objects.get_or_create(
            content_type=content_type, codename=codename, defaults={"name": name}
        )
    for group_name, codenames in GROUPS.items():
        group, _ = Group.objects.get_or_create(name=group_name)
        group.permissions.add(*(perms[c] for c in codenames))


class Migration(migrations.Migration):
    dependencies = [
        ("console", "0001_initial"),
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
    ]

    operations = [migrations.RunPython(create_groups, migrations.RunPython.noop)]
