"""bench/compare.py still drives our runtime end to end (ours only, a few runs, one round).

A smoke test of the benchmark script, not of performance: it starts real worker processes on a
scratch database of its own (a SQLite file under tmp_path, or ``<database>_compare_smoke`` on
the PostgreSQL server of the test database, dropped afterwards) and checks that the report has
its figures. The peers (the ``bench`` extra) are not needed.
"""

from __future__ import annotations

import os
import re

import pytest
from django.db import connection

from tests.bench.support import run_bench
from tests.subprocesses import subprocess_database_url

TIMEOUT_SECONDS = 180  # a loaded 2-core machine: process start-up and migrations dominate


@pytest.mark.slow
def test_compare_runs_ours_and_counts_statements(tmp_path):
    env = {**os.environ, "RUNTIME_VAR_DIR": str(tmp_path)}
    args = ["--only", "ours, 1", "--rounds", "1", "--runs", "2", "--count-runs", "2"]
    args += ["--probes", "1"]
    database = ""
    if connection.vendor == "sqlite":
        env.pop("DATABASE_URL", None)
        args.append("--sqlite")
    else:
        env["DATABASE_URL"] = subprocess_database_url()
        database = f"{connection.settings_dict['NAME']}_compare_smoke"
        args += ["--database", database]
    drop = [database] if database else []
    done = run_bench("compare.py", args, env, timeout=TIMEOUT_SECONDS, drop=drop)
    assert done.returncode == 0, done.stderr[-3000:]
    assert re.search(r"^ours, 1 worker +\d+\.\d", done.stdout, re.MULTILINE), done.stdout
    counted = re.search(r"(\d+\.\d) SQL statements per run", done.stdout)
    assert counted and float(counted.group(1)) > 0, done.stdout
