"""What a test needs to start real subprocesses (workers, daphne) on its own test database,
and the per-worker names of the shared services when pytest-xdist runs the suite.

Under xdist every worker process (``gw0``, ``gw1``, ...) has its own test database
(pytest-django adds the ``_gw0`` suffix: ``test_runtime_gw0`` on PostgreSQL,
``var/test.sqlite3_gw0`` on SQLite) and its own Redis database (``RUNTIME_TEST_REDIS_URL``'s
number plus the worker's index), so that no test sees another's rows, channel groups or
subprocesses. Subprocesses get both from here.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.db import connection

# Short leases so that a fresh worker takes over a crashed worker's run within a second.
FAST_WORKER_ENV = {
    "RUNTIME_LEASE_SECONDS": "1",
    "RUNTIME_HEARTBEAT_SECONDS": "0.3",
    "RUNTIME_IDLE_POLL_SECONDS": "0.05",
    "RUNTIME_MODEL_BACKOFF_SECONDS": "0.01",
}
# What the browser tests' server and workers use when RUNTIME_TEST_REDIS_URL is not set.
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/5"
REDIS_DATABASES = 16  # redis-server's default number of databases


def xdist_worker() -> str:
    """This process's pytest-xdist worker id (``gw0``, ``gw1``, ...), or "" without xdist."""
    return os.environ.get("PYTEST_XDIST_WORKER", "")


def worker_index(worker: str) -> int:
    """0 for ``gw0`` (and without xdist), 1 for ``gw1``, ..."""
    return int(worker[2:]) if worker.startswith("gw") and worker[2:].isdigit() else 0


def redis_url_of_worker(url: str, worker: str) -> str:
    """``url`` moved to the worker's own Redis database: its number plus the worker's index."""
    parts = urlsplit(url)
    path = parts.path.strip("/")
    base = int(path) if path.isdigit() else 0
    db = base + worker_index(worker)
    if db >= REDIS_DATABASES:
        raise ValueError(
            f"xdist worker {worker} would use Redis database {db} of {url}: start from a lower "
            f"number or run fewer workers (-n)"
        )
    return urlunsplit(parts._replace(path=f"/{db}"))


def redis_url_for_tests(default: str | None = None) -> str | None:
    """RUNTIME_TEST_REDIS_URL (else ``default``) for this process: its own database under xdist.

    None when neither is set (the tests that need a real Redis then skip or start their own).
    """
    url = os.environ.get("RUNTIME_TEST_REDIS_URL") or default
    return redis_url_of_worker(url, xdist_worker()) if url else None


def subprocess_database_url() -> str:
    """The DATABASE_URL of the database this test runs on (pytest-django's test database)."""
    settings = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{Path(settings['NAME']).resolve()}"
    user = settings.get("USER") or ""
    password = f":{settings['PASSWORD']}" if settings.get("PASSWORD") else ""
    auth = f"{user}{password}@" if user else ""
    port = f":{settings['PORT']}" if settings.get("PORT") else ""
    return f"postgres://{auth}{settings.get('HOST') or 'localhost'}{port}/{settings['NAME']}"
