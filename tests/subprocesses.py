"""What a test needs to start real subprocesses (workers, daphne) on its own test database."""

from __future__ import annotations

from pathlib import Path

from django.db import connection

# Short leases so that a fresh worker takes over a crashed worker's run within a second.
FAST_WORKER_ENV = {
    "RUNTIME_LEASE_SECONDS": "1",
    "RUNTIME_HEARTBEAT_SECONDS": "0.3",
    "RUNTIME_IDLE_POLL_SECONDS": "0.05",
    "RUNTIME_MODEL_BACKOFF_SECONDS": "0.01",
}


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
