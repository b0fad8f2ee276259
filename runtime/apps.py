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


def _the_runtimes(connection) -> bool:
    """Whether ``connection`` is to the runtime's own database (RUNTIME_DATABASE): the
    runtime changes nothing on a host's other connections."""
    from runtime.db import alias

    return connection.alias == alias()


def replan_after_schema_change(sender, connection, **kwargs) -> None:
    """Give the runtime's PostgreSQL connections that prepare statements (the OPTIONS
    ``prepare_threshold`` that RUNTIME_DB_PREPARE sets) the wrapper that re-prepares them
    after a column changed type under them (runtime.db.replan_stale). Its ``DEALLOCATE ALL``
    is sent only on those connections, never on a host's other databases."""
    from runtime.db import replan_stale

    prepares = connection.settings_dict.get("OPTIONS", {}).get("prepare_threshold") is not None
    if (
        connection.vendor == "postgresql"
        and prepares
        and _the_runtimes(connection)
        and replan_stale not in connection.execute_wrappers
    ):
        connection.execute_wrappers.append(replan_stale)


def check_pool_together(sender, connection, **kwargs) -> None:
    """Have the pool of the runtime's database drop every dead idle connection at the first
    one it finds (runtime.db.check_idle_together)."""
    from runtime.db import check_idle_together

    if _the_runtimes(connection):
        check_idle_together(connection)


def forward_commits(sender, notice, **kwargs) -> None:
    """Tell live viewers of every commit (best-effort; see runtime.live)."""
    from runtime import live

    live.publish_commit(notice)
