"""System checks (``manage.py check``, and every command that serves or works): settings that
are out of bounds, or parse but cannot work together, found before a run meets them. Each
message names the setting (``runtime.conf`` holds the defaults and bounds)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from runtime import conf, extras

# The tag of the runtime's own checks: ``runtime_worker`` runs these alone at its start
# (``requires_system_checks``), not the URL map's and the models' (which import the API, the
# console and the model SDKs: half of a worker process's start, and a worker serves no URL).
TAG = "runtime"


@checks.register(TAG)
def agents_load(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """runtime.E001: each RUNTIME_AGENTS path loads to an Agent, no two share a name
    (runtime.agents.registry), and each agent's provider kind loads (RUNTIME_PROVIDERS, the
    extra it needs installed), as do its tool sources (RUNTIME_TOOL_SOURCES). runtime.W001: no
    agent is registered, so no run can start."""
    from runtime import sources
    from runtime.agents import registry
    from runtime.providers import factory

    if not conf.agent_paths():
        return [
            checks.Warning(
                "RUNTIME_AGENTS names no agent: no run can start",
                hint="list your agents by dotted path, e.g. RUNTIME_AGENTS ="
                ' ["myproject.agents.support"]',
                id="runtime.W001",
            )
        ]
    try:
        agents = registry()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="runtime.E001")]
    errors: list[checks.CheckMessage] = []
    for name, agent in sorted(agents.items()):
        try:
            factory(agent.provider.kind)
            for kind in {definition.source_kind for definition in agent.sources}:
                extra = getattr(sources.get(kind), "extra", None)
                if extra and extras.missing(extra):
                    raise ImproperlyConfigured(f"its {kind} tools need {extras.hint(extra)}")
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(f"agent {name!r}: {exc}", id="runtime.E001"))
    return errors


@checks.register(TAG)
def numbers_within_bounds(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """runtime.E003: every numeric RUNTIME_* setting is a finite number within its bounds
    (``runtime.conf.NUMBERS``); the message names the setting, its bound and the value."""
    return [checks.Error(problem, id="runtime.E003") for problem in conf.number_problems()]


@checks.register(TAG)
def heartbeat_within_lease(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """runtime.E002: a heartbeat longer than a third of the lease lets a live owner's lease
    lapse, and another worker takes its run over (``conf.heartbeat_problem``)."""
    if any(True for _ in conf.number_problems()):
        return []  # runtime.E003 says what is wrong with them
    problem = conf.heartbeat_problem(conf.heartbeat_seconds(), conf.lease_ttl().total_seconds())
    return [] if problem is None else [checks.Error(problem, id="runtime.E002")]


@checks.register(TAG)
def choices_and_shapes(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """runtime.E004: RUNTIME_METRICS and RUNTIME_AGENT_VERSION_ROUTING are each one of
    their choices; RUNTIME_PROVIDERS and RUNTIME_TOOL_SOURCES map kinds to dotted paths;
    RUNTIME_MCP_SERVERS, RUNTIME_RUN_LIMITS and RUNTIME_MODEL_LIMITS parse (README "Limits");
    RUNTIME_WEBHOOK_ALLOW_HOSTS holds host names and CIDRs (README "Webhooks")."""
    from runtime import plugins, providers, sources

    errors: list[checks.CheckMessage] = []
    if conf.metrics_access() not in conf.METRICS_ACCESS:
        errors.append(
            checks.Error(
                f"RUNTIME_METRICS must be one of {', '.join(conf.METRICS_ACCESS)},"
                f" got {conf.metrics_access()!r}",
                id="runtime.E004",
            )
        )
    try:
        conf.agent_version_routing()
    except ImproperlyConfigured as exc:
        errors.append(checks.Error(str(exc), id="runtime.E004"))
    for module in (providers, sources):
        try:
            plugins.paths(module.SETTING, module.ENTRY_POINTS, module.BUILT_IN)
        except ImproperlyConfigured as exc:
            errors.append(checks.Error(str(exc), id="runtime.E004"))
    if conf.mcp_servers():
        from runtime.mcp.config import parse_servers

        try:
            parse_servers(conf.mcp_servers())
        except ValueError as exc:
            errors.append(checks.Error(f"RUNTIME_MCP_SERVERS: {exc}", id="runtime.E004"))
    for name, read in (
        ("RUNTIME_RUN_LIMITS", conf.run_limits),
        ("RUNTIME_MODEL_LIMITS", conf.model_limits),
        ("RUNTIME_WEBHOOK_ALLOW_HOSTS", _webhook_allow_list),
    ):
        try:
            read()
        except ValueError as exc:
            errors.append(checks.Error(f"{name}: {exc}", id="runtime.E004"))
    return errors


@checks.register(checks.Tags.database, TAG)
def database_alias(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """runtime.E005: RUNTIME_DATABASE names a database of DATABASES, and another alias than
    "default" is routed to by ``runtime.db.Router`` (DATABASE_ROUTERS)."""
    problem = database_problem(conf.database(), settings.DATABASES, settings.DATABASE_ROUTERS)
    return [] if problem is None else [checks.Error(problem, id="runtime.E005")]


def database_problem(alias: str, databases: Any, routers: Any) -> str | None:
    """Why the runtime cannot use database ``alias`` with these DATABASES and
    DATABASE_ROUTERS (one line naming RUNTIME_DATABASE), or None."""
    if alias not in databases:
        return f"RUNTIME_DATABASE ({alias!r}) is no database of DATABASES ({', '.join(databases)})"
    names = [
        r if isinstance(r, str) else f"{type(r).__module__}.{type(r).__name__}" for r in routers
    ]
    if alias != "default" and "runtime.db.Router" not in names:
        return (
            f"RUNTIME_DATABASE is {alias!r}: add 'runtime.db.Router' to DATABASE_ROUTERS so"
            " that the runtime's tables are read, written and migrated there"
        )
    return None


@checks.register(TAG)
def extras_installed(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """runtime.E006: a setting that needs an optional extra finds it installed: a Redis
    channel layer needs ``redis``, MCP servers need ``mcp``, an OTLP exporter needs ``otel``
    (each message says what to pip install)."""
    from runtime import tracing

    needs: list[tuple[str, str]] = []
    layers = getattr(settings, "CHANNEL_LAYERS", {}) or {}
    if any("channels_redis" in str(layer.get("BACKEND", "")) for layer in layers.values()):
        needs.append(("redis", "CHANNEL_LAYERS (a Redis channel layer)"))
    if conf.mcp_servers():
        needs.append(("mcp", "RUNTIME_MCP_SERVERS"))
    if (variable := tracing.switched_on_by()) is not None:
        needs.append(("otel", f"OpenTelemetry tracing ({variable} in the environment)"))
    return [
        checks.Error(f"{what} needs the {extra!r} extra: {extras.hint(extra)}", id="runtime.E006")
        for extra, what in needs
        if extras.missing(extra)
    ]


@checks.register(TAG)
def request_threads_within_pool(
    app_configs: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """runtime.W002: more request threads than pooled connections make requests wait for a
    connection instead of for a thread (console.asgi)."""
    database = settings.DATABASES.get(conf.database(), {})
    pool = database.get("OPTIONS", {}).get("pool")
    try:
        threads = conf.request_threads()
    except ImproperlyConfigured:
        return []  # runtime.E003
    if not pool or not isinstance(pool, dict) or threads <= pool["max_size"]:
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


def _webhook_allow_list() -> Any:
    from runtime.domain.webhooks import AllowList

    try:
        return AllowList.parse(conf.webhook_allow_hosts())
    except TypeError as exc:  # not a list
        raise ValueError(str(exc)) from None
