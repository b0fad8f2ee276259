"""The runtime's knobs, read from Django settings when asked (never at import time)."""

from __future__ import annotations

import math
from datetime import timedelta

from django.conf import settings


def _get(name: str, default):
    return getattr(settings, name, default)


def agent_paths() -> list[str]:
    return list(_get("RUNTIME_AGENTS", ["runtime.demo.agent.demo"]))


def allow_scripted() -> bool:
    return bool(_get("RUNTIME_ALLOW_SCRIPTED", True))


def lease_ttl() -> timedelta:
    """How long a claim lasts without a heartbeat (RUNTIME_LEASE_SECONDS, default 15 s)."""
    return timedelta(seconds=float(_get("RUNTIME_LEASE_SECONDS", 15)))


def heartbeat_seconds() -> float:
    """How often an owner renews its lease (RUNTIME_HEARTBEAT_SECONDS, default a third of
    the lease: 5 s)."""
    return float(_get("RUNTIME_HEARTBEAT_SECONDS", lease_ttl().total_seconds() / 3))


HEARTBEATS_PER_LEASE = 3  # a lease outlives a missed heartbeat (etcd renews at a third of a TTL)


def heartbeat_problem(heartbeat: float, lease: float) -> str | None:
    """Say why a heartbeat of ``heartbeat`` seconds cannot keep a lease of ``lease`` seconds
    (one line naming both settings), or return None.

    The rule: at most a third of the lease. A renewal that comes later than the lease lasts
    lets another worker take a live owner's run over (issue 21, as with Celery's visibility
    timeout); a third leaves room for a missed or late renewal. The settings module refuses
    such values at start-up and the ``runtime.E002`` check reports them.
    """
    if heartbeat * HEARTBEATS_PER_LEASE <= lease or math.isclose(
        heartbeat * HEARTBEATS_PER_LEASE, lease
    ):
        return None
    return (
        f"RUNTIME_HEARTBEAT_SECONDS ({heartbeat:g}) must be at most a third of"
        f" RUNTIME_LEASE_SECONDS ({lease:g}): a lease that lapses between two heartbeats"
        " hands a live worker's runs to another worker"
    )


def worker_forget_seconds() -> float:
    """How long after its last heartbeat a stale or stopped worker's row, holding no run, is
    deleted by any live worker (RUNTIME_WORKER_FORGET_SECONDS, default 3600 s; 0: never)."""
    return float(_get("RUNTIME_WORKER_FORGET_SECONDS", 3600))


def poison_claims() -> int:
    """Failed drivings (the driver raised) without any commit before a run is ended as
    indeterminate (default 3)."""
    return int(_get("RUNTIME_POISON_CLAIMS", 3))


def poison_deaths() -> int:
    """Claims lost with their worker, without any commit, before a run is ended as
    indeterminate (default 20): a run that keeps killing workers still ends."""
    return int(_get("RUNTIME_POISON_DEATHS", 20))


def worker_db_connections() -> int:
    """The database threads of a worker process, each keeping one connection: all its
    statements run there, however many runs it has in flight (RUNTIME_WORKER_DB_CONNECTIONS,
    default 4)."""
    return int(_get("RUNTIME_WORKER_DB_CONNECTIONS", 4))


def worker_tool_threads() -> int:
    """The threads a worker process runs ``def`` tools on, so at most that many at once
    (``async def`` tools run on its event loop, unbounded); each keeps a connection once a
    tool used the database (RUNTIME_WORKER_TOOL_THREADS, default 4)."""
    return int(_get("RUNTIME_WORKER_TOOL_THREADS", 4))


def idle_poll_seconds() -> float:
    """The longest a worker sleeps between looks when nothing wakes it (default 0.5 s)."""
    return float(_get("RUNTIME_IDLE_POLL_SECONDS", 0.5))


def mcp_servers() -> tuple:
    """The ``assistant`` agent's MCP servers (RUNTIME_MCP_SERVERS, default none), as
    runtime.mcp.config definitions."""
    from runtime.mcp.config import parse_servers

    return parse_servers(_get("RUNTIME_MCP_SERVERS", []))


def model_retries() -> int:
    """Retryable inference failures tolerated per step before the run fails (default 4)."""
    return int(_get("RUNTIME_MODEL_RETRIES", 4))


def model_backoff_seconds() -> float:
    """The first backoff between inference retries, doubled each time (default 0.5 s)."""
    return float(_get("RUNTIME_MODEL_BACKOFF_SECONDS", 0.5))


def delegation_max_depth() -> int:
    """How deep child runs may nest (RUNTIME_DELEGATION_MAX_DEPTH, default 3; a top-level
    run has depth 0, its children depth 1)."""
    return int(_get("RUNTIME_DELEGATION_MAX_DEPTH", 3))


def delegation_max_children() -> int:
    """Delegate calls one batch may run (RUNTIME_DELEGATION_MAX_CHILDREN, default 4)."""
    return int(_get("RUNTIME_DELEGATION_MAX_CHILDREN", 4))


def _parse_limits(data: object, make: type, fields: tuple[str, ...], what: str) -> dict:
    from runtime.errors import InvalidLimit

    if not isinstance(data, dict):
        raise ValueError(f"{what} must be a JSON object by name, got {type(data).__name__}")
    parsed = {}
    for name, entry in data.items():
        if not isinstance(entry, dict) or set(entry) - set(fields):
            raise ValueError(f"{what} {name!r}: an object with only {', '.join(fields)}")
        try:
            parsed[str(name)] = make(**entry)
        except (InvalidLimit, TypeError) as exc:
            raise ValueError(f"{what} {name!r}: {exc}") from None
    return parsed


def parse_run_limits(data: object) -> dict:
    """RunLimit values by agent name from ``{"agent": {"runs", "key", "per_key"}}``; raises
    ValueError naming the entry that is malformed."""
    from runtime.domain.limits import RunLimit

    return _parse_limits(data, RunLimit, ("runs", "key", "per_key"), "run limit")


def parse_model_limits(data: object) -> dict:
    """ModelLimit values by model name from ``{"model": {"concurrency", "per_minute"}}``;
    raises ValueError naming the entry that is malformed."""
    from runtime.domain.limits import ModelLimit

    return _parse_limits(data, ModelLimit, ("concurrency", "per_minute"), "model limit")


def run_limits() -> dict:
    """RUNTIME_RUN_LIMITS as RunLimit values by agent name (default none)."""
    return parse_run_limits(_get("RUNTIME_RUN_LIMITS", {}))


def model_limits() -> dict:
    """RUNTIME_MODEL_LIMITS as ModelLimit values by model name (default none)."""
    return parse_model_limits(_get("RUNTIME_MODEL_LIMITS", {}))


def limit_poll_seconds() -> float:
    """How long a run refused by a model's concurrency waits, released, before a worker
    tries it again (RUNTIME_LIMIT_POLL_SECONDS, default 0.5 s)."""
    return float(_get("RUNTIME_LIMIT_POLL_SECONDS", 0.5))


def console_url() -> str:
    """The console's public base URL, for links sent outside (RUNTIME_CONSOLE_URL, default
    ``http://127.0.0.1:8000``), without a trailing slash."""
    return str(_get("RUNTIME_CONSOLE_URL", "http://127.0.0.1:8000")).rstrip("/")


def run_url(run_id: str) -> str:
    """The console page of a run (the path of ``console:run``)."""
    return f"{console_url()}/runs/{run_id}/"


def webhook_timeout_seconds() -> float:
    """The longest one webhook request may take, connect to last byte
    (RUNTIME_WEBHOOK_TIMEOUT_SECONDS, default 10 s)."""
    return float(_get("RUNTIME_WEBHOOK_TIMEOUT_SECONDS", 10))


def webhook_lease() -> timedelta:
    """How long a worker's claim on a delivery lasts: its request's timeout and 5 s more;
    a worker that died with it leaves it to another worker after that."""
    return timedelta(seconds=webhook_timeout_seconds() + 5)


def webhook_backoff_seconds() -> float:
    """The first retry's backoff, doubled each attempt with jitter
    (RUNTIME_WEBHOOK_BACKOFF_SECONDS, default 5 s)."""
    return float(_get("RUNTIME_WEBHOOK_BACKOFF_SECONDS", 5))


def webhook_backoff_max_seconds() -> float:
    """The longest backoff between two attempts (RUNTIME_WEBHOOK_BACKOFF_MAX_SECONDS,
    default 3600 s)."""
    return float(_get("RUNTIME_WEBHOOK_BACKOFF_MAX_SECONDS", 3600))


def webhook_max_attempts() -> int:
    """Attempts before a delivery is failed (RUNTIME_WEBHOOK_MAX_ATTEMPTS, default 15:
    three to six hours at the default backoffs)."""
    return int(_get("RUNTIME_WEBHOOK_MAX_ATTEMPTS", 15))


def webhook_concurrency() -> int:
    """Deliveries one worker process has in flight at once (RUNTIME_WEBHOOK_CONCURRENCY,
    default 10)."""
    return int(_get("RUNTIME_WEBHOOK_CONCURRENCY", 10))
