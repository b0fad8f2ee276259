"""Projects in subprocesses on a fresh database beside the test database (SQLite or PostgreSQL,
as the suite runs): this repository's project (``manage.py``, console.settings) and a host
project of its own (settings written to a temporary folder) that installs only the apps it
names, has its own DATABASES, and cannot import whitenoise or dj-database-url (issue 24: the
apps need neither; they are the repository project's, its ``project`` extra).

``fresh_database`` is a fixture: a test module imports it by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from tests.subprocesses import subprocess_database_url

ROOT = Path(__file__).resolve().parents[1]

# The packages of the repository project's settings that a host need not have.
NOT_INSTALLED = ("whitenoise", "dj_database_url")
# Makes NOT_INSTALLED unimportable (``sys.modules[name] = None``: import raises ImportError).
WITHOUT = f"""
import sys
for name in {NOT_INSTALLED!r}:
    sys.modules[name] = None
"""
# django-admin without NOT_INSTALLED.
MANAGE_WITHOUT = (
    WITHOUT
    + """
from django.core.management import execute_from_command_line
execute_from_command_line(["django-admin", *sys.argv[1:]])
"""
)

# What a host that serves the console's pages, the API and the demo installs.
CONSOLE_APPS = (
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "runtime",
    "runtime.demo",
    "console",
)

HOST_SETTINGS = """
SECRET_KEY = "a-host-project-of-its-own-" + "k" * 30
INSTALLED_APPS = APPS
DATABASES = {"default": DATABASE}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""


@dataclass(frozen=True)
class FreshDatabase:
    """An empty database: its URL (for this project's settings) and its DATABASES entry (for a
    host's)."""

    url: str
    settings: dict[str, Any]


@pytest.fixture
def fresh_database(tmp_path) -> Iterator[FreshDatabase]:
    """An empty database on the test database's server (a file in ``tmp_path`` on SQLite),
    dropped afterwards. Needs a transactional test (CREATE DATABASE)."""
    if connection.vendor == "sqlite":
        path = tmp_path / "fresh.sqlite3"
        yield FreshDatabase(
            f"sqlite:///{path}", {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}
        )
        return
    name = f"{connection.settings_dict['NAME']}_host_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name}")
    server = {k: connection.settings_dict.get(k) or "" for k in ("USER", "PASSWORD", "HOST")}
    try:
        yield FreshDatabase(
            subprocess_database_url().rsplit("/", 1)[0] + f"/{name}",
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": name,
                "PORT": connection.settings_dict.get("PORT") or "",
                **server,
            },
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without DJANGO_* and RUNTIME_* (the test's own), plus
    ``extra``; var files under ``tmp_path``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "RUNTIME_"))}
    env.update(RUNTIME_VAR_DIR=str(tmp_path), **extra)
    return env


def run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def ok(done: subprocess.CompletedProcess) -> str:
    """The stdout of a command that must have succeeded (else its output, in the failure)."""
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


class Project:
    """This repository's project (console.settings, with the demo) on ``database``."""

    def __init__(self, tmp_path: Path, database: FreshDatabase) -> None:
        self.env = clean_env(tmp_path, DATABASE_URL=database.url)

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return run([sys.executable, "manage.py", *args], self.env, ROOT)

    def python(self, code: str) -> subprocess.CompletedProcess:
        env = {**self.env, "DJANGO_SETTINGS_MODULE": "console.settings"}
        return run([sys.executable, "-c", code], env, ROOT)


class Host:
    """A host project of its own on ``database``: only ``apps`` installed,
    ``settings`` added (``urls``: the text of its ROOT_URLCONF module), NOT_INSTALLED
    unimportable."""

    def __init__(
        self,
        tmp_path: Path,
        database: FreshDatabase,
        *apps: str,
        urls: str | None = None,
        **settings: Any,
    ) -> None:
        folder = tmp_path / f"host_{uuid.uuid4().hex[:8]}"
        folder.mkdir()
        if urls is not None:
            (folder / "host_urls.py").write_text(urls)
            settings["ROOT_URLCONF"] = "host_urls"
        extra = "".join(f"{k} = {v!r}\n" for k, v in settings.items())
        (folder / "host_settings.py").write_text(
            f"APPS = {list(apps)!r}\nDATABASE = {database.settings!r}\n" + HOST_SETTINGS + extra
        )
        self.folder = folder
        self.env = clean_env(
            tmp_path,
            DJANGO_SETTINGS_MODULE="host_settings",
            PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]),
        )

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return run([sys.executable, "-c", MANAGE_WITHOUT, *args], self.env, self.folder)

    def python(self, code: str) -> subprocess.CompletedProcess:
        return run([sys.executable, "-c", WITHOUT + code], self.env, self.folder)
