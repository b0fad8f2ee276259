"""The repository's own project settings (scripts/start, the tests), read from the environment.

Every knob has a safe default for a local run on the embedded default (SQLite file, in-memory
channel layer, in-process worker). A value that does not parse stops start-up with
ImproperlyConfigured that names the variable; the bounds of the RUNTIME_* settings are the
runtime's own (runtime.conf), checked by its system checks as in any host project. This module
imports no app code: the apps read it, never the other way round.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured

# This project's settings use two packages no app needs: a host project with its own DATABASES
# and static serving installs neither. They come with the "project" extra (scripts/start).
PROJECT_EXTRA = "pip install 'durable-agent-runtime[project]' (scripts/start installs it)"
try:
    import dj_database_url
    import whitenoise  # noqa: F401  (its middleware and storage are named below)
except ImportError as exc:
    raise ImproperlyConfigured(
        f"this project's settings (console/settings.py) need {exc.name}: {PROJECT_EXTRA}"
    ) from exc

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("RUNTIME_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    """Read a boolean variable: 1/true/yes/on or 0/false/no/off (any case)."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_list(name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list; blanks are dropped."""
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_number(
    name: str,
    default: float | None,
    *,
    minimum: float = 0,
    maximum: float | None = None,
    integer: bool = False,
):
    """Read a finite number (an int when ``integer``) from ``minimum`` to ``maximum``."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw) if integer else float(raw)
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise ImproperlyConfigured(f"{name} must be {kind}, got {raw!r}") from None
    if not math.isfinite(value):
        raise ImproperlyConfigured(f"{name} must be a finite number, got {raw!r}")
    if value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {raw!r}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, got {raw!r}")
    return value


def make_var_dir(path: Path) -> None:
    """Make ``path`` (under RUNTIME_VAR_DIR) if missing; ImproperlyConfigured if it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImproperlyConfigured(
            f"RUNTIME_VAR_DIR {path} cannot be made: {exc.strerror}"
        ) from exc


def env_mcp_servers(name: str) -> list:
    """Read MCP server definitions: JSON text (a list), or the path of a JSON file holding
    one; the shape is runtime.mcp.config.parse_servers', checked by the runtime.E004 check."""

    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return []
    if raw.startswith(("[", "{")):
        text, source = raw, "JSON text"
    else:
        try:
            text, source = Path(raw).read_text(), f"the file {raw}"
        except OSError as exc:
            raise ImproperlyConfigured(
                f"{name} is neither a JSON list nor a readable file: {exc.strerror}: {raw!r}"
            ) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} ({source}): {exc}") from None
    if not isinstance(data, list):
        raise ImproperlyConfigured(f"{name} ({source}): a list of servers is wanted")
    return data


def env_json_mapping(name: str) -> dict[str, Any] | None:
    """Read a JSON object (e.g. ``{"gemini": "myproject.models.GeminiProvider"}``), or None
    when unset."""
    raw = (os.environ.get(name) or "").strip()
    if not raw:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a JSON object: {exc}") from None
    if not isinstance(data, dict):
        raise ImproperlyConfigured(f"{name} must be a JSON object, got {raw!r}")
    return data


def logging_config(
    level: str, log_format: str, levels: dict[str, str] | None = None
) -> dict[str, Any]:
    """The LOGGING dict: every logger (runtime, console, django.request, django.channels,
    daphne, ...) reaches one stderr handler through the root logger at ``level``, with the
    runtime's log context on each line (runtime.logs, named by dotted path).

    ``level`` is a name from LEVELS; ``log_format`` "plain" or "json"; ``levels`` sets single
    loggers (and their children) apart from ``level``: ``{"runtime.worker": "DEBUG"}``
    (RUNTIME_LOG_LEVELS, read by ``log_levels``). The QUIET_LOGGERS are at WARNING unless
    ``levels`` names them.
    """
    formatter: dict[str, Any] = {
        "()": "runtime.logs.PlainFormatter",
        "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
    }
    if log_format == "json":
        formatter = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        }
    loggers: dict[str, dict[str, Any]] = {
        # Django's default config gives "django" its own console handler (DEBUG only) and
        # mail_admins; one stderr line per record is wanted, through the root.
        "django": {"handlers": [], "level": level, "propagate": True},
        **{name: {"level": "WARNING"} for name in QUIET_LOGGERS},
    }
    for name, name_level in (levels or {}).items():
        loggers[name] = {**loggers.get(name, {}), "level": name_level}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "runtime.logs.ContextFilter"}},
        "formatters": {"main": formatter},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "main",
                "filters": ["context"],
            }
        },
        "root": {"handlers": ["stderr"], "level": level},
        "loggers": loggers,
    }


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# The model SDKs and their HTTP clients (httpx, and httpx2 in the current SDKs) log every
# request at INFO: two lines per model call, most of a busy worker's log. WARNING unless
# RUNTIME_LOG_LEVELS names them (e.g. "httpx2=INFO" to see each request again).
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2", "openai", "anthropic")


def log_levels(name: str) -> dict[str, str]:
    """The per-logger levels of environment variable ``name``: ``logger=LEVEL`` pairs split
    by commas (``"httpx2=WARNING,runtime.worker=DEBUG"``; blank: none) -> ``{logger: LEVEL}``.

    Raises ImproperlyConfigured naming the variable for a pair without ``=``, an empty logger
    name, or a level not in LEVELS.
    """
    levels: dict[str, str] = {}
    for pair in os.environ.get(name, "").split(","):
        if not pair.strip():
            continue
        logger, sep, level = (part.strip() for part in pair.partition("="))
        if not sep or not logger or level.upper() not in LEVELS:
            raise ImproperlyConfigured(
                f"{name} must be logger=LEVEL pairs split by commas, LEVEL one of"
                f" {', '.join(LEVELS)}; got {pair.strip()!r}"
            )
        levels[logger] = level.upper()
    return levels


def env_database(name: str, default: str) -> dj_database_url.DBConfig:
    """Parse a database URL (sqlite:///path or postgres://...) into a DATABASES entry."""
    url = os.environ.get(name) or default
    try:
        config = dj_database_url.parse(url, conn_max_age=0)
    except (ValueError, KeyError) as exc:
        raise ImproperlyConfigured(
            f"{name} is not a database URL we can use: {url!r} ({exc})"
        ) from exc
    engine = config["ENGINE"]
    if engine == "django.db.backends.sqlite3":
        folder = Path(str(config["NAME"])).parent
        if str(config["NAME"]) != ":memory:" and not folder.is_dir():
            raise ImproperlyConfigured(f"{name}: the SQLite file's folder {folder} does not exist")
        # IMMEDIATE transactions take the write lock at BEGIN, so two writers queue on the busy
        # timeout instead of failing on a lock upgrade; WAL lets readers run beside a writer.
        config["OPTIONS"] = {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
        # Tests start real worker subprocesses, which cannot see an in-memory database.
        config["TEST"] = {"NAME": str(VAR_DIR / "test.sqlite3")}
    elif engine == "django.db.backends.postgresql":
        options: dict[str, Any] = {}
        # Parameters bound on the server let psycopg prepare a statement from its fifth run
        # on a connection (Django turns preparing off unless told), so the commit path's
        # statements are parsed and planned once per worker connection, not on every commit
        # (README, Performance). A pooler in transaction mode needs RUNTIME_DB_PREPARE=0.
        if env_bool("RUNTIME_DB_PREPARE", True):
            options.update(server_side_binding=True, prepare_threshold=5)
        if pool_size := env_number("RUNTIME_DB_POOL_SIZE", 16, maximum=1000, integer=True):
            # Every request (and each read of an open stream) gives its connection back at
            # the end: without a pool each one opened a new PostgreSQL session, which cost
            # the database more than the queries (issue 12, item 8). Django's pool
            # (psycopg_pool) lends connections instead; a request waits up to `timeout`
            # seconds when `max_size` are lent or the database cannot be reached, then is
            # answered 503 (issue 21: well below a proxy's timeout). A worker's threads keep
            # theirs for life, on room the worker adds (runtime.db.reserve_connections).
            wait = env_number("RUNTIME_DB_POOL_TIMEOUT", 5, minimum=0.1, maximum=300)
            options["pool"] = {
                "min_size": min(4, pool_size),
                "max_size": pool_size,
                "max_idle": 60,
                "timeout": wait,
                # psycopg_pool retries a failed connect with a doubling delay for this long
                # (5 minutes by default), and starts no other attempt meanwhile: after an
                # outage its next try could come minutes after the database is back. Giving
                # up after one wait lets the next request start a fresh attempt at once.
                "reconnect_timeout": wait,
            }
            config["CONN_HEALTH_CHECKS"] = True  # a lent connection is checked first
        if options:
            config["OPTIONS"] = options
    else:
        raise ImproperlyConfigured(f"{name} must point at SQLite or PostgreSQL, got {engine}")
    return config


DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not env_bool("RUNTIME_INSECURE_DEV_KEY", True):
        raise ImproperlyConfigured("DJANGO_SECRET_KEY must be set")
    # A fixed local key keeps sessions valid across restarts of a local, embedded run only.
    SECRET_KEY = "insecure-local-only-set-DJANGO_SECRET_KEY-in-production"
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    # Before staticfiles: its runserver (ASGI, WebSockets) wins. See the class for why not "daphne".
    "console.apps.DaphneConfig",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "django_prometheus",
    "ninja",
    "channels",
    "runtime",
    # The demo agent, its ledger and demo_ledger: this project's, not the engine's.
    "runtime.demo",
    "console",
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "console.middleware.request_id",
    # Bounds the request's database waits, the session's save on the way out included.
    "console.timeouts.web_timeouts",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.unavailable.DatabaseUnavailableMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

# The RUNTIME_* numbers are parsed here and bounded by runtime.conf (its runtime.E003 check);
# unset (None), the runtime's default applies.
UNBOUNDED: dict[str, Any] = {"minimum": -math.inf}
UNBOUNDED_INT: dict[str, Any] = {"minimum": -math.inf, "integer": True}

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
# Threads per server process that run requests' sync code (console.asgi); keep it no larger
# than RUNTIME_DB_POOL_SIZE, so that no request thread waits for a connection.
RUNTIME_REQUEST_THREADS = env_number("RUNTIME_REQUEST_THREADS", None, **UNBOUNDED_INT)
# A web request's bounds on PostgreSQL (console.timeouts; docs/performance.md).
RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS = env_number(
    "RUNTIME_WEB_STATEMENT_TIMEOUT_SECONDS", None, **UNBOUNDED
)
RUNTIME_WEB_LOCK_TIMEOUT_SECONDS = env_number("RUNTIME_WEB_LOCK_TIMEOUT_SECONDS", None, **UNBOUNDED)
# The largest WebSocket message a client may send (bytes; console.consumers refuses larger
# ones with 4400, and runtime_serve has daphne refuse them with 1009 before reading them).
# The live stream takes nothing from clients, so a small bound costs nothing.
RUNTIME_WS_MAX_MESSAGE_BYTES = env_number("RUNTIME_WS_MAX_MESSAGE_BYTES", None, **UNBOUNDED_INT)

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.views.tabs.tab_counts",
            ],
        },
    },
]

make_var_dir(VAR_DIR)
if not os.access(VAR_DIR, os.W_OK | os.X_OK):
    raise ImproperlyConfigured(f"RUNTIME_VAR_DIR {VAR_DIR} is not writable by this user")
DATABASES = {"default": env_database("DATABASE_URL", f"sqlite:///{VAR_DIR / 'runtime.sqlite3'}")}
if env_bool("RUNTIME_DB_METRICS", True):
    # django-prometheus's wrappers of the same backends count queries, errors and their time
    # per database (django_db_* metrics at /metrics); the vendor stays sqlite / postgresql.
    DATABASES["default"]["ENGINE"] = DATABASES["default"]["ENGINE"].replace(
        "django.db.backends.", "django_prometheus.db.backends."
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL", "")
if REDIS_URL:
    # redis-py 8 reads with a 5 s socket timeout by default, the same 5 s that channels_redis
    # blocks in BZPOPMIN: an idle receive() (a live viewer waiting for a token) would fail
    # with "Timeout reading from ...". Read for longer than that.
    REDIS_HOST: dict[str, Any] = {"address": REDIS_URL, "socket_timeout": 30}
    try:
        from redis.driver_info import DriverInfo
    except ImportError:  # a redis-py without it looks its version up its own way
        pass
    else:
        # Left to itself, redis-py reads its own version from the installed package's
        # metadata (files on disk) for every new connection; 50 streams opening at once open
        # as many, on the event loop (issue 12, item 8). The same name and version, read once.
        REDIS_HOST["driver_info"] = DriverInfo()
    CHANNEL_LAYERS: dict[str, dict[str, Any]] = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_HOST]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
# URL names, not paths: the console's pages are reversed wherever the URL map mounts them.
LOGIN_URL = "console:login"
LOGIN_REDIRECT_URL = "console:runs"
LOGOUT_REDIRECT_URL = "console:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# Behind a TLS-terminating reverse proxy (docs/deploy.md): DJANGO_HTTPS=1 redirects plain HTTP
# (but not the probes and /metrics a load balancer or Prometheus asks for on the inside),
# marks cookies secure, trusts the proxy's X-Forwarded-Proto and sends HSTS.
if env_bool("DJANGO_HTTPS", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = env_number("DJANGO_HSTS_SECONDS", 31_536_000, integer=True)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("DJANGO_HSTS_PRELOAD", True)

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
make_var_dir(STATIC_ROOT)
# Served by WhiteNoise straight from the finders, so a fresh clone needs no collectstatic. In
# production (RUNTIME_STATIC_MANIFEST=1, after `manage.py collectstatic`) files get hashed,
# compressed names and are cached for ever by browsers and proxies.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
if env_bool("RUNTIME_STATIC_MANIFEST", False):
    STORAGES = {
        "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }

LOG_LEVEL = (os.environ.get("LOG_LEVEL") or os.environ.get("RUNTIME_LOG_LEVEL") or "INFO").upper()
if LOG_LEVEL not in LEVELS:
    raise ImproperlyConfigured(f"LOG_LEVEL must be one of {', '.join(LEVELS)}, got {LOG_LEVEL!r}")
LOG_FORMAT = os.environ.get("LOG_FORMAT", "plain").strip().lower()
if LOG_FORMAT not in ("plain", "json"):
    raise ImproperlyConfigured(f"LOG_FORMAT must be plain or json, got {LOG_FORMAT!r}")
# Single loggers apart from LOG_LEVEL, e.g. RUNTIME_LOG_LEVELS="httpx2=INFO,runtime.worker=DEBUG".
LOGGING = logging_config(LOG_LEVEL, LOG_FORMAT, log_levels("RUNTIME_LOG_LEVELS"))

# /metrics (console.health): loopback (default), open or off (checked by runtime.E004); a
# token guards it from anywhere.
RUNTIME_METRICS = os.environ.get("RUNTIME_METRICS", "loopback").strip().lower()
RUNTIME_METRICS_TOKEN = os.environ.get("RUNTIME_METRICS_TOKEN", "")

# A trace viewer's URL with {trace_id}: the run page links traced runs (runtime.tracing).
RUNTIME_TRACE_URL = os.environ.get("RUNTIME_TRACE_URL", "")

# The runtime's own knobs, read through runtime.conf (defaults, bounds and system checks there).
# This project keeps its demo and tests as they were: the demo agents, scripted runs allowed
# (a library's defaults are no agent and no scripts).
RUNTIME_AGENTS = env_list(
    "RUNTIME_AGENTS", ["runtime.demo.agent.demo", "runtime.demo.agent.assistant"]
)
RUNTIME_ALLOW_SCRIPTED = env_bool("RUNTIME_ALLOW_SCRIPTED", True)
RUNTIME_DATABASE = os.environ.get("RUNTIME_DATABASE", "default")
RUNTIME_PROVIDERS = env_json_mapping("RUNTIME_PROVIDERS")
RUNTIME_TOOL_SOURCES = env_json_mapping("RUNTIME_TOOL_SOURCES")
RUNTIME_LEASE_SECONDS = env_number("RUNTIME_LEASE_SECONDS", None, **UNBOUNDED)
# Unset: a third of the lease (runtime.conf), so that setting the lease alone keeps the rule.
RUNTIME_HEARTBEAT_SECONDS = env_number("RUNTIME_HEARTBEAT_SECONDS", None, **UNBOUNDED)
# A run of a version no live worker carries: "drain" or "pinned" (docs/agent-changes.md).
RUNTIME_AGENT_VERSION_ROUTING = os.environ.get("RUNTIME_AGENT_VERSION_ROUTING", "drain")
# Silent worker rows holding no run are deleted after this long (0: never; runtime.registry).
RUNTIME_WORKER_FORGET_SECONDS = env_number("RUNTIME_WORKER_FORGET_SECONDS", None, **UNBOUNDED)
RUNTIME_POISON_CLAIMS = env_number("RUNTIME_POISON_CLAIMS", None, **UNBOUNDED_INT)
RUNTIME_POISON_DEATHS = env_number("RUNTIME_POISON_DEATHS", None, **UNBOUNDED_INT)
RUNTIME_MODEL_RETRIES = env_number("RUNTIME_MODEL_RETRIES", None, **UNBOUNDED_INT)
RUNTIME_MODEL_BACKOFF_SECONDS = env_number("RUNTIME_MODEL_BACKOFF_SECONDS", None, **UNBOUNDED)
RUNTIME_MODEL_OUTAGE_SECONDS = env_number("RUNTIME_MODEL_OUTAGE_SECONDS", None, **UNBOUNDED)
RUNTIME_IDLE_POLL_SECONDS = env_number("RUNTIME_IDLE_POLL_SECONDS", None, **UNBOUNDED)
# A worker's database and tool threads, each keeping one connection (runtime/worker.py).
RUNTIME_WORKER_DB_CONNECTIONS = env_number("RUNTIME_WORKER_DB_CONNECTIONS", None, **UNBOUNDED_INT)
RUNTIME_WORKER_TOOL_THREADS = env_number("RUNTIME_WORKER_TOOL_THREADS", None, **UNBOUNDED_INT)
# The `assistant` agent's MCP servers (docs/real-models.md).
RUNTIME_MCP_SERVERS = env_mcp_servers("RUNTIME_MCP_SERVERS")
# Limits on what runs at once (README "Limits"), checked by runtime.checks:
# {"agent": {"runs": 5, "key": "customer", "per_key": 1}} and
# {"model": {"concurrency": 2, "per_minute": 60}}.
RUNTIME_RUN_LIMITS = env_json_mapping("RUNTIME_RUN_LIMITS")
RUNTIME_MODEL_LIMITS = env_json_mapping("RUNTIME_MODEL_LIMITS")
RUNTIME_DELEGATION_MAX_DEPTH = env_number("RUNTIME_DELEGATION_MAX_DEPTH", None, **UNBOUNDED_INT)
RUNTIME_DELEGATION_MAX_CHILDREN = env_number(
    "RUNTIME_DELEGATION_MAX_CHILDREN", None, **UNBOUNDED_INT
)
# Outgoing webhooks (runtime.webhooks): links in their bodies, and how deliveries retry.
RUNTIME_CONSOLE_URL = os.environ.get("RUNTIME_CONSOLE_URL", "http://127.0.0.1:8000")
RUNTIME_WEBHOOK_TIMEOUT_SECONDS = env_number("RUNTIME_WEBHOOK_TIMEOUT_SECONDS", None, **UNBOUNDED)
RUNTIME_WEBHOOK_BACKOFF_SECONDS = env_number("RUNTIME_WEBHOOK_BACKOFF_SECONDS", None, **UNBOUNDED)
RUNTIME_WEBHOOK_BACKOFF_MAX_SECONDS = env_number(
    "RUNTIME_WEBHOOK_BACKOFF_MAX_SECONDS", None, **UNBOUNDED
)
RUNTIME_WEBHOOK_MAX_ATTEMPTS = env_number("RUNTIME_WEBHOOK_MAX_ATTEMPTS", None, **UNBOUNDED_INT)
RUNTIME_WEBHOOK_CONCURRENCY = env_number("RUNTIME_WEBHOOK_CONCURRENCY", None, **UNBOUNDED_INT)
RUNTIME_WEBHOOK_ENDPOINT_CONCURRENCY = env_number(
    "RUNTIME_WEBHOOK_ENDPOINT_CONCURRENCY", None, **UNBOUNDED_INT
)
# Internal hosts webhooks may reach (comma-separated names and CIDRs; default none).
RUNTIME_WEBHOOK_ALLOW_HOSTS = env_list("RUNTIME_WEBHOOK_ALLOW_HOSTS", [])
RUNTIME_LIMIT_POLL_SECONDS = env_number("RUNTIME_LIMIT_POLL_SECONDS", None, **UNBOUNDED)
