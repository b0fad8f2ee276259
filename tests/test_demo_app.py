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

import pytest
from django.db import connection

from runtime.demo.models import LedgerEffect
from tests.hosts import Host, Project, fresh_database, ok

__all__ = ["fresh_database"]  # the fixture, used by name

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "runtime_ledgereffect"
BEFORE_THE_MOVE = "0015_webhooks"  # the runtime's last migration that held the ledger

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


def _tables(site: Project | Host) -> set[str]:
    code = (
        "import django, json; django.setup(); from django.db import connection;"
        "print(json.dumps(connection.introspection.table_names()))"
    )
    return set(json.loads(ok(site.python(code))))


def test_a_fresh_database_has_the_ledger_table_under_its_old_name():
    assert LedgerEffect._meta.app_label == "runtime_demo"
    assert LedgerEffect._meta.db_table == TABLE
    assert TABLE in connection.introspection.table_names()
    LedgerEffect.objects.create(operation_id="op-1", key="k", tool="ledger_once", run_id="r")
    assert LedgerEffect.objects.get(operation_id="op-1").applied == 1


@pytest.mark.slow
def test_a_ledger_migrated_before_the_move_keeps_its_rows(tmp_path, fresh_database):
    project = Project(tmp_path, fresh_database)
    ok(project.manage("migrate", "runtime", BEFORE_THE_MOVE, "--noinput"))
    ok(project.python(INSERT))

    ok(project.manage("migrate", "--noinput"))

    ledger = json.loads(ok(project.manage("demo_ledger", "--json")))
    assert ledger == [
        {
            "operation_id": "op-before-the-move",
            "key": "invoice-7",
            "tool": "ledger_once",
            "run_id": "r1",
            "applied": 2,
        }
    ]
    ok(project.manage("migrate", "--check"))  # nothing left unapplied
    ok(project.manage("makemigrations", "--check", "--dry-run"))  # state matches the models


@pytest.mark.slow
def test_a_host_without_the_demo_gets_no_ledger_and_is_told_what_to_install(
    tmp_path, fresh_database
):
    host = Host(tmp_path, fresh_database, "runtime")
    ok(host.manage("migrate", "--noinput"))
    assert "runtime_run" in _tables(host) and TABLE not in _tables(host)

    listing_the_demo = Host(
        tmp_path, fresh_database, "runtime", RUNTIME_AGENTS=["runtime.demo.agent.demo"]
    )
    checked = listing_the_demo.manage("check")
    assert checked.returncode != 0
    assert "runtime.E001" in checked.stderr
    assert 'add "runtime.demo" to INSTALLED_APPS' in checked.stderr

    # Asking for the demo later: its migration makes the table.
    with_demo = Host(tmp_path, fresh_database, "runtime", "runtime.demo")
    ok(with_demo.manage("migrate", "--noinput"))
    assert TABLE in _tables(with_demo)
    assert json.loads(ok(with_demo.manage("demo_ledger", "--json"))) == []


@pytest.mark.slow
def test_a_host_without_the_demo_keeps_a_ledger_that_holds_rows(tmp_path, fresh_database):
    host = Host(tmp_path, fresh_database, "runtime")
    ok(host.manage("migrate", "runtime", BEFORE_THE_MOVE, "--noinput"))
    ok(host.python(INSERT))

    ok(host.manage("migrate", "--noinput"))

    assert TABLE in _tables(host)  # never dropped while it holds rows
    with_demo = Host(tmp_path, fresh_database, "runtime", "runtime.demo")
    ok(with_demo.manage("migrate", "--noinput"))
    ledger = json.loads(ok(with_demo.manage("demo_ledger", "--json")))
    assert [e["operation_id"] for e in ledger] == ["op-before-the-move"]
