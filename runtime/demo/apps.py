from django.apps import AppConfig


class DemoConfig(AppConfig):
    """The demo app. Its label, ``runtime_demo``, is in ``runtime.db.RUNTIME_APPS``: its
    ledger lives on the runtime's database (RUNTIME_DATABASE), where the demo's tools write it
    in the same transaction as the run's fence."""

    name = "runtime.demo"
    label = "runtime_demo"
    verbose_name = "Agent runtime demo"
    default_auto_field = "django.db.models.BigAutoField"
