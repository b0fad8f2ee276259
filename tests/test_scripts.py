"""``scripts/test``: what its output promises (README, "./scripts/test")."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.servers import ROOT

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("workers", "quiet"),
    [("2", ["-q"]), ("0", ["-qq"]), ("0", [])],
    ids=["q-xdist", "qq", "plain"],
)
def test_the_first_lines_name_the_test_database_and_redis(workers, quiet) -> None:
    """Issue 21, item 7: with -q the header, and the lines in it, were not printed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RUNTIME_TEST_"))}
    done = subprocess.run(
        ["scripts/test", "-n", workers, *quiet, "--collect-only", "-p", "no:cacheprovider"]
        + ["tests/test_settings.py", "-k", "env_bool"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith(("test ", "xdist"))]
    assert lines[0].startswith("test database: "), done.stdout[:2000]
    assert lines[1].startswith("test Redis: "), done.stdout[:2000]
    if quiet:  # before anything else
        assert done.stdout.splitlines()[:2] == lines[:2], done.stdout[:2000]


def test_no_header_asks_for_none() -> None:
    done = subprocess.run(
        ["scripts/test", "-n", "0", "-q", "--no-header", "--collect-only"]
        + ["-p", "no:cacheprovider", "tests/test_settings.py", "-k", "env_bool"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "test database: " not in done.stdout
