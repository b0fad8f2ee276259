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


def mcp_servers() -> list:
    """The ``assistant`` demo agent's MCP servers as written (RUNTIME_MCP_SERVERS, default
    none): JSON-like data that runtime.mcp.config.parse_servers reads."""
    return list(_get("RUNTIME_MCP_SERVERS", []))


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
