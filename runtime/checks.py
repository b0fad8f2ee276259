"""System checks (``manage.py check``, and every command that serves or works): settings that
parse but cannot work together, found before a run meets them."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from runtime import conf


@checks.register()
def agents_load(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """runtime.E001: RUNTIME_AGENTS names at least one agent, each path loads to an Agent,
    and no two share a name (runtime.agents.registry)."""
    from runtime.agents import registry

    if not conf.agent_paths():
        return [checks.Error("RUNTIME_AGENTS names no agent", id="runtime.E001")]
    try:
        registry()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="runtime.E001")]
    return []


@checks.register()
def heartbeat_within_lease(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """runtime.E002: a heartbeat longer than a third of the lease lets a live owner's lease
    lapse, and another worker takes its run over (``conf.heartbeat_problem``). This project's
    settings module refuses such values before any check runs; the check keeps the rule for
    a project that sets them some other way."""
    problem = conf.heartbeat_problem(conf.heartbeat_seconds(), conf.lease_ttl().total_seconds())
    return [] if problem is None else [checks.Error(problem, id="runtime.E002")]


@checks.register()
def request_threads_within_pool(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """runtime.W002: more request threads than pooled connections make requests wait for a
    connection instead of for a thread (console.asgi)."""
    pool = settings.DATABASES["default"].get("OPTIONS", {}).get("pool")
    threads = getattr(settings, "RUNTIME_REQUEST_THREADS", 1)
    if not pool or threads <= pool["max_size"]:
        return []
    return [
        checks.Warning(
            f"RUNTIME_REQUEST_THREADS ({threads}) exceeds RUNTIME_DB_POOL_SIZE"
            f" ({pool['max_size']})",
            hint="requests beyond the pool's size wait up to 30 s for a connection, then fail:"
            " raise RUNTIME_DB_POOL_SIZE or lower RUNTIME_REQUEST_THREADS",
            id="runtime.W002",
        )
    ]
