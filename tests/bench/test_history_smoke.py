"""bench/history.py still builds a history whose copies are fsck-clean.

A smoke test of the benchmark script, not of performance: a template of one round (about 20
runs: forks, delegations, timers, approvals, pauses among them) multiplied into 3 copies, on a
scratch database of its own (``<test database>_hist_smoke_60`` on the PostgreSQL server of the
test database, dropped afterwards). Every thread of the template and of one whole copy (each
kind of thread the template has) must pass ``runtime.fsck``. PostgreSQL only, like the script.
"""

from __future__ import annotations

import json
import os

import pytest
from django.db import connection

from tests.bench.support import run_bench
from tests.subprocesses import subprocess_database_url

TIMEOUT_SECONDS = 180  # a loaded 2-core machine: process start-up and migrations dominate


@pytest.mark.slow
def test_history_copies_every_kind_of_thread_fsck_clean(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("bench/history.py is PostgreSQL only")
    prefix = f"{connection.settings_dict['NAME']}_hist_smoke"
    report = tmp_path / "history.json"
    args = ["--runs", "60", "--build", "--template-scale", "1", "--database-prefix", prefix]
    args += ["--fsck-sample", "5", "--fsck-copies", "1", "--json", str(report)]
    args += ["--database-url", subprocess_database_url()]
    env = {**os.environ, "RUNTIME_VAR_DIR": str(tmp_path)}
    done = run_bench("history.py", args, env, timeout=TIMEOUT_SECONDS, drop=[f"{prefix}_60"])
    assert done.returncode == 0, done.stderr[-3000:]
    build = json.loads(report.read_text())["builds"]["60"]
    assert build["copies"] >= 1, build
    fsck = build["fsck_sample"]
    assert fsck["failed"] == [], fsck["failed"]
    kinds = set(fsck["kinds"])
    assert {"fork", "fork+forked", "delegate", "child", "timer_open", "pause"} <= kinds, kinds
