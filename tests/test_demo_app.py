"""The demo is a Django app of its own (``runtime.demo``, label ``runtime_demo``; issue 24,
item 2): its ledger moved out of the runtime's migrations without losing a row, a fresh
database gets its table, and a host project that does not install it gets no ledger table and
is told what to add when it lists the demo's agents anyway.

Every migration here runs in a subprocess (``manage.py`` for this repository's project, or a
host project's settings written to a temporary folder) on a fresh database beside the test
database: SQLite or PostgreSQL, as the suite runs.
"""

from __future__ import annotations

import json
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

from runtime.demo.models import LedgerEffect
from tests.subprocesses import subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[1]
TABLE = "runtime_ledgereffect"
BEFORE_THE_MOVE = "0015_webhooks"  # the runtime's last migration that held the ledger

# A host project's settings: only what the engine needs, its own DATABASES (no URL parser).
HOST_SETTINGS = """
SECRET_KEY = "a-host-project-of-its-own"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "runtime", *EXTRA_APPS]
DATABASES = {"default": DATABASE}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
"""

# Runs django-admin with the packages a host need not have made unimportable: the engine (and
# the demo) must import neither (issue 24, item 2: they are the repository project's).
NOT_INSTALLED = ("whitenoise", "dj_database_url")
HOST_MANAGE = f"""
import sys
for name in {NOT_INSTALLED!r}:
    sys.modules[name] = None  # import raises ImportError
from django.core.management import execute_from_command_line
execute_from_command_line(["django-admin", *sys.argv[1:]])
"""

INSERT = f"""
import django
django.setup()
from django.db import connection
with connection.cursor() as cursor:
    cursor.execute(
        "INSERT INTO {TABLE} (operation_id, key, tool, run_id, applied, created_at)"
        " VALUES ('op-before-the-move', 'invoice-7', 'ledger_once', 'r1', 2, '2026-01-02')"
    )
"""


@dataclass(frozen=True)
class FreshDatabase:
    """An empty database beside the test database: its URL (for this project's settings) and
    its DATABASES entry (for a host's)."""

    url: str
    settings: dict[str, Any]


@pytest.fixture
def fresh_database(tmp_path) -> Iterator[FreshDatabase]:
    if connection.vendor == "sqlite":
        path = tmp_path / "fresh.sqlite3"
        yield FreshDatabase(
            f"sqlite:///{path}", {"ENGINE": "django.db.backends.sqlite3", "NAME": str(path)}
        )
        return
    name = f"{connection.settings_dict['NAME']}_demo_{uuid.uuid4().hex[:8]}"
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


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "RUNTIME_"))}
    env.update(RUNTIME_VAR_DIR=str(tmp_path), **extra)
    return env


def _run(command: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return done


def _ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


class Project:
    """This repository's project (console.settings, with the demo) on a fresh database."""

    def __init__(self, tmp_path: Path, database: FreshDatabase) -> None:
        self.env = _env(tmp_path, DATABASE_URL=database.url)

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return _run([sys.executable, "manage.py", *args], self.env, ROOT)

    def python(self, code: str) -> subprocess.CompletedProcess:
        env = {**self.env, "DJANGO_SETTINGS_MODULE": "console.settings"}
        return _run([sys.executable, "-c", code], env, ROOT)


class Host:
    """A host project of its own (settings in a temporary folder, no whitenoise and no
    dj-database-url importable) on a fresh database; ``apps`` are added to the engine."""

    def __init__(self, tmp_path: Path, database: FreshDatabase, *apps: str, **settings) -> None:
        folder = tmp_path / f"host_{uuid.uuid4().hex[:8]}"
        folder.mkdir()
        extra = "".join(f"{k} = {v!r}\n" for k, v in settings.items())
        (folder / "host_settings.py").write_text(
            f"EXTRA_APPS = {list(apps)!r}\nDATABASE = {database.settings!r}\n"
            + HOST_SETTINGS
            + extra
        )
        self.folder = folder
        self.env = _env(
            tmp_path,
            DJANGO_SETTINGS_MODULE="host_settings",
            PYTHONPATH=os.pathsep.join([str(folder), str(ROOT)]),
        )

    def manage(self, *args: str) -> subprocess.CompletedProcess:
        return _run([sys.executable, "-c", HOST_MANAGE, *args], self.env, self.folder)

    def python(self, code: str) -> subprocess.CompletedProcess:
        return _run([sys.executable, "-c", code], self.env, self.folder)


def _tables(site: Project | Host) -> set[str]:
    code = (
        "import django, json; django.setup(); from django.db import connection;"
        "print(json.dumps(connection.introspection.table_names()))"
    )
    return set(json.loads(_ok(site.python(code))))


def test_a_fresh_database_has_the_ledger_table_under_its_old_name():
    assert LedgerEffect._meta.app_label == "runtime_demo"
    assert LedgerEffect._meta.db_table == TABLE
    assert TABLE in connection.introspection.table_names()
    LedgerEffect.objects.create(operation_id="op-1", key="k", tool="ledger_once", run_id="r")
    assert LedgerEffect.objects.get(operation_id="op-1").applied == 1


@pytest.mark.slow
def test_a_ledger_migrated_before_the_move_keeps_its_rows(tmp_path, fresh_database):
    project = Project(tmp_path, fresh_database)
    _ok(project.manage("migrate", "runtime", BEFORE_THE_MOVE, "--noinput"))
    _ok(project.python(INSERT))

    _ok(project.manage("migrate", "--noinput"))

    ledger = json.loads(_ok(project.manage("demo_ledger", "--json")))
    assert ledger == [
        {
            "operation_id": "op-before-the-move",
            "key": "invoice-7",
            "tool": "ledger_once",
            "run_id": "r1",
            "applied": 2,
        }
    ]
    _ok(project.manage("migrate", "--check"))  # nothing left unapplied
    _ok(project.manage("makemigrations", "--check", "--dry-run"))  # state matches the models


@pytest.mark.slow
def test_a_host_without_the_demo_gets_no_ledger_and_is_told_what_to_install(
    tmp_path, fresh_database
):
    host = Host(tmp_path, fresh_database)
    _ok(host.manage("migrate", "--noinput"))
    assert "runtime_run" in _tables(host) and TABLE not in _tables(host)

    listing_the_demo = Host(tmp_path, fresh_database, RUNTIME_AGENTS=["runtime.demo.agent.demo"])
    checked = listing_the_demo.manage("check")
    assert checked.returncode != 0
    assert "runtime.E001" in checked.stderr
    assert 'add "runtime.demo" to INSTALLED_APPS' in checked.stderr

    # Asking for the demo later: its migration makes the table.
    with_demo = Host(tmp_path, fresh_database, "runtime.demo")
    _ok(with_demo.manage("migrate", "--noinput"))
    assert TABLE in _tables(with_demo)
    assert json.loads(_ok(with_demo.manage("demo_ledger", "--json"))) == []


@pytest.mark.slow
def test_a_host_without_the_demo_keeps_a_ledger_that_holds_rows(tmp_path, fresh_database):
    host = Host(tmp_path, fresh_database)
    _ok(host.manage("migrate", "runtime", BEFORE_THE_MOVE, "--noinput"))
    _ok(host.python(INSERT))

    _ok(host.manage("migrate", "--noinput"))

    assert TABLE in _tables(host)  # never dropped while it holds rows
    with_demo = Host(tmp_path, fresh_database, "runtime.demo")
    _ok(with_demo.manage("migrate", "--noinput"))
    ledger = json.loads(_ok(with_demo.manage("demo_ledger", "--json")))
    assert [e["operation_id"] for e in ledger] == ["op-before-the-move"]
