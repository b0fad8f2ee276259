"""The hostile corpus through the management commands: a clear error, no traceback, no write."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from tests.hostile.corpus import ARGUMENT_TEXTS
from tests.hostile.test_surfaces import counts
from tests.servers import ROOT
from tests.subprocesses import subprocess_database_url

pytestmark = pytest.mark.django_db(transaction=True)

METADATA = {
    "nul": '{"note": "a\\u0000b"}',
    "surrogate": '{"note": "a\\ud800b"}',
    "deep": ARGUMENT_TEXTS["deep"],
    "huge_int": ARGUMENT_TEXTS["huge_int"],
    "nan": '{"n": NaN}',
    "invalid": "{nope",
    "not_object": "[1, 2]",
}
ODD_IDS = ["~x~", "a" * 100, "\u00e9"]


def refused_cleanly(done) -> None:
    """Every command-line refusal: exit 1 or 2, and one line on stderr saying why."""
    assert done.returncode in (1, 2), done
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip(), "a refusal says why"
    assert done.stderr.count("\n") == 1, done.stderr[-2000:]


@pytest.mark.parametrize("name", sorted(METADATA))
def test_runtime_start_refuses_hostile_metadata(command, name) -> None:
    before = counts()
    done = command(
        "runtime_start", "--agent", "demo", "--input", "go", "--metadata", METADATA[name]
    )
    refused_cleanly(done)
    assert done.returncode == 2, done  # a refused argument (README: 2 for arguments)
    assert "--metadata" in done.stderr, done.stderr
    assert counts() == before


@pytest.mark.parametrize("run_id", ODD_IDS)
def test_commands_refuse_odd_ids(manage, run_id) -> None:
    before = counts()
    commands = [
        ("runtime_show", run_id, "--json"),
        ("runtime_cancel", run_id),
        ("runtime_resume", run_id, "--ticket", run_id, "--approve"),
        ("runtime_start", "--agent", "demo", "--input", "go", "--thread", run_id),
    ]
    # The four run at once: each refuses on its own, and what the test holds them to (no row
    # written by any) is counted after the last one. Their start-up is most of their time.
    spawned = [manage(*args) for args in commands]
    for args, process in zip(commands, spawned, strict=True):
        code, err = process.wait()
        refused_cleanly(subprocess.CompletedProcess(args, code, process.stdout, err))
    assert counts() == before


# -- issue 21, item 5: one line on stderr, exit 1 or 2, whatever reaches a command ------------

# Bytes that are not UTF-8 reach Python's argv as lone surrogates (os.fsencode writes them back).
NOT_UTF8 = {
    "token_user": (("runtime_token", "\udcff"), "USERNAME is not valid UTF-8 text"),
    "token_name": (("runtime_token", "alice", "--name", "\udcff\udcfe"), "--name is not valid"),
    "operator": (("runtime_operator", "bad\udcffname"), "USERNAME is not valid UTF-8 text"),
    "input": (("runtime_start", "--agent", "demo", "--input", "\udcff"), "--input is not valid"),
    "show": (("runtime_show", "\udcff"), "RUN_ID is not valid UTF-8 text"),
}


def one_line_refusal(done, code: int, said: str) -> None:
    """The command exited ``code`` with exactly one line on stderr, containing ``said``."""
    assert done.returncode == code, done
    assert done.stderr.count("\n") == 1 and done.stderr.endswith("\n"), done.stderr[-2000:]
    assert said in done.stderr, done.stderr


@pytest.mark.parametrize("name", sorted(NOT_UTF8))
def test_arguments_that_are_not_utf8_are_refused_in_one_line(command, name) -> None:
    get_user_model().objects.create_user("alice")
    args, said = NOT_UTF8[name]
    before = counts()
    one_line_refusal(command(*args), 2, said)
    assert counts() == before


@pytest.mark.parametrize(
    "username", ["<img src=x onerror=alert(1)>", "a b", "x" * 151, " ", "tab\there"]
)
def test_runtime_operator_holds_usernames_to_djangos_validator(command, username) -> None:
    done = command("runtime_operator", username)
    one_line_refusal(done, 2, "USERNAME: ")
    assert not get_user_model().objects.exists()


def test_runtime_bootstrap_holds_its_username_to_djangos_validator(command) -> None:
    done = command("runtime_bootstrap", "--username", "<img src=x onerror=alert(1)>")
    one_line_refusal(done, 2, "--username: Enter a valid username.")
    assert not get_user_model().objects.exists()


@pytest.mark.parametrize(
    ("content", "code", "said"),
    [
        ("[" * 100_000 + "]" * 100_000, 1, "not imported: line 1 is not JSON we read: nested"),
        ("9" * 5_000, 1, "not imported: line 1 is not JSON: Exceeds the limit"),
        (b"\xff\xfe{}", 2, "not UTF-8 text"),
    ],
    ids=["deep", "huge_int", "not_utf8"],
)
def test_runtime_import_refuses_what_it_cannot_read_in_one_line(
    command, tmp_path, content, code, said
) -> None:
    path = tmp_path / "export.jsonl"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    before = counts()
    one_line_refusal(command("runtime_import", str(path)), code, said)
    assert counts() == before


@pytest.fixture
def unmigrated_database_url(tmp_path) -> Iterator[str]:
    """The URL of an empty database beside the test database (nothing migrated)."""
    if connection.vendor == "sqlite":
        yield f"sqlite:///{tmp_path / 'unmigrated.sqlite3'}"
        return
    name = f"{connection.settings_dict['NAME']}_unmigrated"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {name}")
        cursor.execute(f"CREATE DATABASE {name}")
    try:
        yield subprocess_database_url().rsplit("/", 1)[0] + f"/{name}"
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_commands_on_an_unmigrated_database_say_so_in_one_line(
    command, start, work_inline, tmp_path, unmigrated_database_url
) -> None:
    run_id = start({"text": "done"})
    work_inline()
    export = tmp_path / "export.jsonl"
    assert command("runtime_export", run_id, "--output", str(export)).returncode == 0
    for args in [("runtime_import", str(export)), ("runtime_show", run_id)]:
        done = command(*args, DATABASE_URL=unmigrated_database_url)
        one_line_refusal(done, 1, "CommandError: database error: ")
        assert "the database is not migrated" in done.stderr
        assert "run manage.py migrate first" in done.stderr


@pytest.mark.parametrize(
    "args",
    [("runtime_show", "{run}", "--json"), ("runtime_show", "{run}"), ("runtime_export", "{run}")],
    ids=["show_json", "show", "export"],
)
def test_a_closed_stdout_ends_a_command_quietly(subprocess_env, start, work_inline, args) -> None:
    """``runtime_show RUN | head -1``: the reader is gone before the output is written."""
    run_id = start({"text": "done"})
    work_inline()
    read, write = os.pipe()
    os.close(read)  # no reader at all: every write to the pipe fails with EPIPE
    try:
        process = subprocess.Popen(
            [sys.executable, "manage.py", *(a.format(run=run_id) for a in args)],
            cwd=ROOT,
            env=subprocess_env(),
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
        )
    finally:
        os.close(write)
    _, err = process.communicate(timeout=60)
    assert err == "", err
    assert process.returncode == 1


def test_runtime_start_names_the_known_agents_and_the_setting(command) -> None:
    """Issue 21, item 7: an agent missing from RUNTIME_AGENTS is said to be missing there."""
    done = command("runtime_start", "--agent", "fx", "--input", "go")
    one_line_refusal(done, 1, "unknown agent 'fx'; the known agents are assistant, demo.")
    assert "RUNTIME_AGENTS" in done.stderr
