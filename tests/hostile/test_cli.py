"""The hostile corpus through the management commands: a clear error, no traceback, no write."""

from __future__ import annotations

import subprocess

import pytest

from tests.hostile.corpus import ARGUMENT_TEXTS
from tests.hostile.test_surfaces import counts

pytestmark = pytest.mark.django_db(transaction=True)

METADATA = {
    "nul": '{"note": "a\\u0000b"}',
    "surrogate": '{"note": "a\\ud800b"}',
    "deep": ARGUMENT_TEXTS["deep"],
    "huge_int": ARGUMENT_TEXTS["huge_int"],
    "nan": '{"n": NaN}',
    "invalid": "{nope",
}
ODD_IDS = ["~x~", "a" * 100, "\u00e9"]


def refused_cleanly(done) -> None:
    assert done.returncode not in (0, 137), done
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip(), "a refusal says why"


@pytest.mark.parametrize("name", sorted(METADATA))
def test_runtime_start_refuses_hostile_metadata(command, name) -> None:
    before = counts()
    done = command(
        "runtime_start", "--agent", "demo", "--input", "go", "--metadata", METADATA[name]
    )
    refused_cleanly(done)
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
