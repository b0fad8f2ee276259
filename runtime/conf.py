"""The runtime's settings: every ``RUNTIME_*`` setting the runtime and its console read, with
its type, default and bounds, read from Django settings when asked (never at import time).

Defaults are safe for a library installed into a host project: no agent is registered
(``RUNTIME_AGENTS = []``) and no API caller may send a script (``RUNTIME_ALLOW_SCRIPTED =
False``); the repository's own project (``console/settings.py``) sets both for its demo and
tests. A setting left unset, or set to None, takes its default.

Bounds are checked by the system checks (``runtime.checks``, run by ``manage.py check`` and by
every command that serves or works): the message names the setting, its bound and the value.
An accessor given a value out of bounds raises ImproperlyConfigured with the same message, so
a process that skipped the checks cannot run on it either.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from runtime.domain.versions import Routing

DAY = 86_400


@dataclass(frozen=True, slots=True)
class Number:
    """A numeric setting: its default (a number, or a function of the other settings) and
    its bounds (``maximum`` None: none). Durations have upper bounds too: a lease or heartbeat
    of 1e13 s overflows the dates it is added to (issue 21)."""

    name: str
    default: float | Callable[[], float]
    minimum: float
    maximum: float | None = None
    integer: bool = False
    doc: str = ""


def _third_of_the_lease() -> float:
    return lease_ttl().total_seconds() / HEARTBEATS_PER_LEASE


NUMBERS = {
    n.name: n
    for n in (
        Number("RUNTIME_LEASE_SECONDS", 15, 0.2, DAY, doc="a claim's lease without heartbeat"),
        Number(
            "RUNTIME_HEARTBEAT_SECONDS",
            _third_of_the_lease,
            0.1,
            DAY,
            doc="how often an owner renews its lease (default: a third of the lease)",
        ),
        Number("RUNTIME_WORKER_FORGET_SECONDS", 3600, 0, 365 * DAY),
        Number("RUNTIME_POISON_CLAIMS", 3, 1, 1000, integer=True),
        Number("RUNTIME_POISON_DEATHS", 20, 1, 1000, integer=True),
        Number("RUNTIME_MODEL_RETRIES", 4, 0, 100, integer=True),
        Number("RUNTIME_MODEL_BACKOFF_SECONDS", 0.5, 0, 3600),
        Number(
            "RUNTIME_MODEL_OUTAGE_SECONDS",
            900,
            0,
            30 * DAY,
            doc="how long a run waits for a model that keeps failing retryably before it fails",
        ),
        Number("RUNTIME_IDLE_POLL_SECONDS", 0.5, 0.01, 60),
        Number("RUNTIME_WORKER_DB_CONNECTIONS", 4, 1, 100, integer=True),
        Number("RUNTIME_WORKER_TOOL_THREADS", 4, 1, 1000, integer=True),
        Number("RUNTIME_DELEGATION_MAX_DEPTH", 3, 0, 100, integer=True),
        Number("RUNTIME_DELEGATION_MAX_CHILDREN", 4, 0, 1000, integer=True),
        Number("RUNTIME_REQUEST_THREADS", 8, 1, 256, integer=True),
        Number(
            "RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS",
            10,
            0,
            3600,
            doc="a web request's statement is cancelled past this (PostgreSQL; 0: no bound)",
        ),
        Number(
            "RUNTIME_WEB_LOCK_TIMEOUT_SECONDS",
            2,
            0,
            3600,
            doc="a web request's wait for a lock is cancelled past this (PostgreSQL; 0: none)",
        ),
        Number("RUNTIME_WS_MAX_MESSAGE_BYTES", 65_536, 1024, 64 * 1024 * 1024, integer=True),
        Number("RUNTIME_LIMIT_POLL_SECONDS", 0.5, 0.01, 60),
        Number("RUNTIME_WEBHOOK_TIMEOUT_SECONDS", 10, 0.1, 300),
        Number("RUNTIME_WEBHOOK_BACKOFF_SECONDS", 5, 0, DAY),
        Number("RUNTIME_WEBHOOK_BACKOFF_MAX_SECONDS", 3600, 0, 7 * DAY),
        Number("RUNTIME_WEBHOOK_MAX_ATTEMPTS", 15, 1, 100, integer=True),
        Number("RUNTIME_WEBHOOK_CONCURRENCY", 10, 1, 1000, integer=True),
        Number(
            "RUNTIME_WEBHOOK_ENDPOINT_CONCURRENCY",
            2,
            1,
            1000,
            integer=True,
            doc="deliveries to one endpoint one worker has in flight at once",
        ),
    )
}

METRICS_ACCESS = ("loopback", "open", "off")


def _get(name: str, default: Any) -> Any:
    value = getattr(settings, name, None)
    return default if value is None else value


def number_problem(spec: Number, value: Any) -> str | None:
    """Why ``value`` cannot be the setting ``spec`` (one line naming it and its bound), or
    None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "a whole number" if spec.integer else "a number"
        return f"{spec.name} must be {kind}, got {value!r}"
    if spec.integer and value != int(value):
        return f"{spec.name} must be a whole number, got {value!r}"
    if not math.isfinite(value):
        return f"{spec.name} must be a finite number, got {value!r}"
    if value < spec.minimum:
        return f"{spec.name} must be at least {spec.minimum:g}, got {value!r}"
    if spec.maximum is not None and value > spec.maximum:
        return f"{spec.name} must be at most {spec.maximum:g}, got {value!r}"
    return None


def raw(name: str) -> Any:
    """The value of numeric setting ``name`` as given, or its default."""
    spec = NUMBERS[name]
    default = spec.default() if callable(spec.default) else spec.default
    return _get(name, default)


def number(name: str) -> float:
    """The numeric setting ``name`` (a float, or an int for whole-number settings); raises
    ImproperlyConfigured naming it and its bound when out of bounds."""
    spec, value = NUMBERS[name], raw(name)
    if problem := number_problem(spec, value):
        raise ImproperlyConfigured(problem)
    return int(value) if spec.integer else float(value)


def number_problems() -> Iterator[str]:
    """Every numeric setting out of its bounds, as ``number_problem`` says it."""
    for spec in NUMBERS.values():
        try:
            value = raw(spec.name)
        except ImproperlyConfigured:  # a default computed from a bad setting, said there
            continue
        if problem := number_problem(spec, value):
            yield problem


def web_statement_timeout() -> float:
    """Seconds a web request's statement may run before PostgreSQL cancels it
    (RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS, default 10; 0: no bound). Workers keep theirs."""
    return number("RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS")


def web_lock_timeout() -> float:
    """Seconds a web request's statement may wait for a lock before PostgreSQL cancels it
    (RUNTIME_WEB_LOCK_TIMEOUT_SECONDS, default 2; 0: no bound). Workers keep theirs."""
    return number("RUNTIME_WEB_LOCK_TIMEOUT_SECONDS")


def agent_paths() -> list[str]:
    """The dotted paths of the registered agents (RUNTIME_AGENTS, default none)."""
    return list(_get("RUNTIME_AGENTS", []))


def allow_scripted() -> bool:
    """Whether a run may carry a script for the scripted provider (RUNTIME_ALLOW_SCRIPTED,
    default False: any API caller could otherwise make a run say and call what it likes)."""
    return bool(_get("RUNTIME_ALLOW_SCRIPTED", False))


def database() -> str:
    """The database alias the runtime's writes, worker and fsck use (RUNTIME_DATABASE,
    default "default"); another alias needs ``runtime.db.Router`` in DATABASE_ROUTERS so that
    the runtime's models are read, written and migrated there (README, Configuration)."""
    return str(_get("RUNTIME_DATABASE", "default"))


def lease_ttl() -> timedelta:
    """How long a claim lasts without a heartbeat (RUNTIME_LEASE_SECONDS, default 15 s)."""
    return timedelta(seconds=number("RUNTIME_LEASE_SECONDS"))


def heartbeat_seconds() -> float:
    """How often an owner renews its lease (RUNTIME_HEARTBEAT_SECONDS, default a third of
    the lease: 5 s)."""
    return number("RUNTIME_HEARTBEAT_SECONDS")


HEARTBEATS_PER_LEASE = 3  # a lease outlives a missed heartbeat (etcd renews at a third of a TTL)


def heartbeat_problem(heartbeat: float, lease: float) -> str | None:
    """Say why a heartbeat of ``heartbeat`` seconds cannot keep a lease of ``lease`` seconds
    (one line naming both settings), or return None.

    The rule: at most a third of the lease. A renewal that comes later than the lease lasts
    lets another worker take a live owner's run over (issue 21, as with Celery's visibility
    timeout); a third leaves room for a missed or late renewal. The ``runtime.E002`` check
    reports such values.
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
    return number("RUNTIME_WORKER_FORGET_SECONDS")


def poison_claims() -> int:
    """Failed drivings (the driver raised) without any commit before a run is ended as
    indeterminate (default 3)."""
    return int(number("RUNTIME_POISON_CLAIMS"))


def poison_deaths() -> int:
    """Claims lost with their worker, without any commit, before a run is ended as
    indeterminate (default 20): a run that keeps killing workers still ends."""
    return int(number("RUNTIME_POISON_DEATHS"))


def worker_db_connections() -> int:
    """The database threads of a worker process, each keeping one connection: all its
    statements run there, however many runs it has in flight (RUNTIME_WORKER_DB_CONNECTIONS,
    default 4)."""
    return int(number("RUNTIME_WORKER_DB_CONNECTIONS"))


def worker_tool_threads() -> int:
    """The threads a worker process runs ``def`` tools on, so at most that many at once
    (``async def`` tools run on its event loop, unbounded); each keeps a connection once a
    tool used the database (RUNTIME_WORKER_TOOL_THREADS, default 4)."""
    return int(number("RUNTIME_WORKER_TOOL_THREADS"))


def idle_poll_seconds() -> float:
    """The longest a worker sleeps between looks when nothing wakes it (default 0.5 s)."""
    return number("RUNTIME_IDLE_POLL_SECONDS")


def mcp_servers() -> list:
    """The ``assistant`` demo agent's MCP servers as written (RUNTIME_MCP_SERVERS, default
    none): JSON-like data that runtime.mcp.config.parse_servers reads."""
    return list(_get("RUNTIME_MCP_SERVERS", []))


def model_retries() -> int:
    """Quick retries of a retryable inference failure, by the worker that holds the run,
    before it lets the run go to wait for the model (``model_outage``; default 4)."""
    return int(number("RUNTIME_MODEL_RETRIES"))


def model_backoff_seconds() -> float:
    """The first backoff between inference retries, doubled each time (default 0.5 s)."""
    return number("RUNTIME_MODEL_BACKOFF_SECONDS")


def model_outage() -> timedelta:
    """How long a step's model may keep failing retryably, counted from its first failure,
    before the run fails (default 15 minutes; issue 31, item 6). Past the quick retries
    (``model_retries``) the worker releases the run to wait, and tries again later."""
    return timedelta(seconds=number("RUNTIME_MODEL_OUTAGE_SECONDS"))


def delegation_max_depth() -> int:
    """How deep child runs may nest (RUNTIME_DELEGATION_MAX_DEPTH, default 3; a top-level
    run has depth 0, its children depth 1)."""
    return int(number("RUNTIME_DELEGATION_MAX_DEPTH"))


def delegation_max_children() -> int:
    """Delegate calls one batch may run (RUNTIME_DELEGATION_MAX_CHILDREN, default 4)."""
    return int(number("RUNTIME_DELEGATION_MAX_CHILDREN"))


def request_threads() -> int:
    """Threads per server process that run requests' sync code (RUNTIME_REQUEST_THREADS,
    default 8); keep it no larger than the database pool."""
    return int(number("RUNTIME_REQUEST_THREADS"))


def ws_max_message_bytes() -> int:
    """The largest WebSocket message a client may send (RUNTIME_WS_MAX_MESSAGE_BYTES,
    default 64 KiB)."""
    return int(number("RUNTIME_WS_MAX_MESSAGE_BYTES"))


def agent_version_routing() -> Routing:
    """What happens to a run whose agent's version no live worker carries
    (RUNTIME_AGENT_VERSION_ROUTING): "drain" (default: a worker of another version of its
    agent takes it over) or "pinned" (it waits for a worker of its own version). Raises
    ImproperlyConfigured for another value (the runtime.E004 check reports it at start)."""
    value = str(_get("RUNTIME_AGENT_VERSION_ROUTING", Routing.DRAIN)).strip().lower()
    try:
        return Routing(value)
    except ValueError:
        raise ImproperlyConfigured(
            f"RUNTIME_AGENT_VERSION_ROUTING must be one of {', '.join(Routing)}, got {value!r}"
        ) from None


def metrics_access() -> str:
    """Who may read /metrics: "loopback" (default), "open" or "off" (RUNTIME_METRICS)."""
    return str(_get("RUNTIME_METRICS", "loopback")).strip().lower()


def metrics_token() -> str:
    """A bearer token that opens /metrics from anywhere (RUNTIME_METRICS_TOKEN, default
    none)."""
    return str(_get("RUNTIME_METRICS_TOKEN", ""))


def trace_url() -> str:
    """A trace viewer's URL with ``{trace_id}`` (RUNTIME_TRACE_URL, default none)."""
    return str(_get("RUNTIME_TRACE_URL", ""))


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
    return float(number("RUNTIME_LIMIT_POLL_SECONDS"))


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
    return float(number("RUNTIME_WEBHOOK_TIMEOUT_SECONDS"))


def webhook_lease() -> timedelta:
    """How long a worker's claim on a delivery lasts: its request's timeout and 5 s more;
    a worker that died with it leaves it to another worker after that."""
    return timedelta(seconds=webhook_timeout_seconds() + 5)


def webhook_backoff_seconds() -> float:
    """The first retry's backoff, doubled each attempt with jitter
    (RUNTIME_WEBHOOK_BACKOFF_SECONDS, default 5 s)."""
    return float(number("RUNTIME_WEBHOOK_BACKOFF_SECONDS"))


def webhook_backoff_max_seconds() -> float:
    """The longest backoff between two attempts (RUNTIME_WEBHOOK_BACKOFF_MAX_SECONDS,
    default 3600 s)."""
    return float(number("RUNTIME_WEBHOOK_BACKOFF_MAX_SECONDS"))


def webhook_max_attempts() -> int:
    """Attempts before a delivery is failed (RUNTIME_WEBHOOK_MAX_ATTEMPTS, default 15:
    three to six hours at the default backoffs)."""
    return int(number("RUNTIME_WEBHOOK_MAX_ATTEMPTS"))


def webhook_concurrency() -> int:
    """Deliveries one worker process has in flight at once (RUNTIME_WEBHOOK_CONCURRENCY,
    default 10)."""
    return int(number("RUNTIME_WEBHOOK_CONCURRENCY"))


def webhook_endpoint_concurrency() -> int:
    """Deliveries to one endpoint one worker process has in flight at once
    (RUNTIME_WEBHOOK_ENDPOINT_CONCURRENCY, default 2): an endpoint that hangs holds at most
    this many of the worker's RUNTIME_WEBHOOK_CONCURRENCY, the rest go to other endpoints."""
    return int(number("RUNTIME_WEBHOOK_ENDPOINT_CONCURRENCY"))


def webhook_allow_hosts() -> list[str]:
    """Host names and IP addresses or CIDRs webhooks may reach although they are internal
    (RUNTIME_WEBHOOK_ALLOW_HOSTS, default none: loopback, private, link-local, CGNAT,
    multicast and reserved addresses are refused; ``runtime.domain.webhooks.internal``)."""
    value = _get("RUNTIME_WEBHOOK_ALLOW_HOSTS", [])
    return [value] if isinstance(value, str) else list(value)
