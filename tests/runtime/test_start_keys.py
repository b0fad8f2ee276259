"""Starts and forks with an idempotency key (issue 31, item 1): operations, the CLI, twins."""

from __future__ import annotations

import threading
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection, connections

from runtime import db
from runtime.errors import IdempotencyKeyReused, InvalidCommit
from runtime.models import Run, StartRecord
from runtime.operations import start_run
from tests.runtime.support import text_step, tool_step, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = (tool_step(("ledger_once", {"key": "a"})), text_step("done"))


def cli(*args: str) -> str:
    out = StringIO()
    call_command(*args, stdout=out)
    return out.getvalue().strip()


def test_runtime_start_with_an_idempotency_key_starts_once():
    command = ("runtime_start", "--agent", "demo", "--input", "hi", "--idempotency-key", "cli-1")
    first = cli(*command)
    assert cli(*command) == first
    assert list(Run.objects.values_list("id", flat=True)) == [first]
    with pytest.raises(Exception, match="idempotency_key_reused"):
        cli("runtime_start", "--agent", "demo", "--input", "bye", "--idempotency-key", "cli-1")
    assert Run.objects.count() == 1


def test_runtime_fork_with_an_idempotency_key_forks_once(start, work_inline):
    source = start(*SCRIPT)
    work_inline()
    command = ("runtime_fork", source, "--at-step", "1", "--idempotency-key", "fork-1")
    first = cli(*command)
    assert first != source and cli(*command) == first
    assert Run.objects.count() == 2


def test_an_idempotency_key_out_of_bounds_is_refused():
    with pytest.raises(InvalidCommit, match="1 to 200 characters"):
        start_run(agent="demo", input="hi", idempotency_key="k" * 201)
    assert not Run.objects.exists()


def test_a_key_reused_by_a_fork_of_another_step_is_refused(start, work_inline):
    from runtime.operations import fork_run

    source = start(*SCRIPT)
    work_inline()
    fork = fork_run(source, at_step=1, actor="olga", idempotency_key="f")
    assert fork_run(source, at_step=1, actor="olga", idempotency_key="f") == fork
    with pytest.raises(IdempotencyKeyReused):
        fork_run(source, at_step=2, actor="olga", idempotency_key="f")
    assert fork_run(source, at_step=2, actor="oscar", idempotency_key="f") != fork


def _waiting_on_a_lock(pid: int) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", [pid])
        return cursor.fetchone()[0] > 0


@pytest.mark.skipif("connection.vendor != 'postgresql'", reason="SQLite runs one writer at once")
def test_a_twin_start_waits_for_the_first_and_gets_its_run():
    """The twin waits on the first start's uncommitted writes (its key, its run count); once
    they commit, the twin's own run is undone with its failed insert of the key, and it
    answers the first one's run."""
    answers: dict[str, Any] = {}
    twin_pid: list[int] = []

    def twin() -> None:
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                twin_pid.append(cursor.fetchone()[0])
            answers["twin"] = start_run(agent="demo", input="hi", actor="o", idempotency_key="t")
        except Exception as exc:  # reported by the assertion below
            answers["twin"] = exc
        finally:
            connections.close_all()

    with db.atomic():
        first = start_run(agent="demo", input="hi", actor="o", idempotency_key="t")
        thread = threading.Thread(target=twin)
        thread.start()
        wait_for(lambda: bool(twin_pid) and _waiting_on_a_lock(twin_pid[0]), what="the twin")
    thread.join(timeout=30)
    assert answers["twin"] == first
    assert list(Run.objects.values_list("id", flat=True)) == [first]
    assert StartRecord.objects.get().run_id == first
