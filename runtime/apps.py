from django.apps import AppConfig
from django.db.backends.signals import connection_created


class RuntimeConfig(AppConfig):
    name = "runtime"
    verbose_name = "Agent runtime"

    def ready(self) -> None:
        from runtime import checks  # noqa: F401  (registers the system checks)
        from runtime.signals import commit_announced

        commit_announced.connect(forward_commits, weak=False, dispatch_uid="runtime.live.forward")
        connection_created.connect(replan_after_schema_change, dispatch_uid="runtime.db.replan")
        connection_created.connect(check_pool_together, dispatch_uid="runtime.db.pool_check")


def replan_after_schema_change(sender, connection, **kwargs) -> None:
    """Give every PostgreSQL connection the wrapper that re-prepares its statements after a
    column changed type under them (runtime.db.replan_stale)."""
    from runtime.db import replan_stale

    if connection.vendor == "postgresql" and replan_stale not in connection.execute_wrappers:
        connection.execute_wrappers.append(replan_stale)


def check_pool_together(sender, connection, **kwargs) -> None:
    """Have the connection's pool drop every dead idle connection at the first one it finds
    (runtime.db.check_idle_together)."""
    from runtime.db import check_idle_together

    check_idle_together(connection)


def forward_commits(sender, notice, **kwargs) -> None:
    """Tell live viewers of every commit (best-effort; see runtime.live)."""
    from runtime import live

    live.publish_commit(notice)
