"""Running a bench script as a process from a smoke test, on scratch databases it drops."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from django.db import connection

ROOT = Path(__file__).resolve().parents[2]


def drop_database(database: str) -> None:
    """Drop ``database`` on the test database's PostgreSQL server, its sessions ended."""
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(
        dbname="postgres",
        host=settings.get("HOST") or None,
        port=settings.get("PORT") or None,
        user=settings.get("USER") or None,
        password=settings.get("PASSWORD") or None,
        autocommit=True,
    ) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def run_bench(
    script: str, args: list[str], env: dict[str, str], *, timeout: float, drop: Iterable[str] = ()
) -> subprocess.CompletedProcess[str]:
    """Run ``bench/<script>`` with ``args`` from the repository's root (output captured as
    text, never raising on its exit code), then drop the databases ``drop`` names whatever
    happened; raises subprocess.TimeoutExpired past ``timeout`` seconds."""
    try:
        return subprocess.run(
            [sys.executable, f"bench/{script}", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    finally:
        for database in drop:
            drop_database(database)
