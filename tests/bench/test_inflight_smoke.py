"""bench/inflight.py still drives our runtime (and LangGraph, when installed) end to end.

A smoke test of the benchmark script, not of performance: 5 runs, one round, a model that
answers after 0.05 s, on scratch databases of its own (``<test database>_inflight_smoke_*`` on
the PostgreSQL server of the test database, dropped afterwards). It checks that the report
has its figures. The model server needs uvicorn (the ``bench`` extra); LangGraph is measured
only when it is installed. PostgreSQL only: the benchmark counts PostgreSQL's connections.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re

import pytest
from django.db import connection

from tests.bench.support import run_bench
from tests.subprocesses import redis_url_for_tests, subprocess_database_url

TIMEOUT_SECONDS = 300  # a loaded 2-core machine: process start-up and migrations dominate


@pytest.mark.slow
def test_inflight_measures_ours_against_a_streaming_model(tmp_path):
    if connection.vendor != "postgresql":
        pytest.skip("bench/inflight.py measures PostgreSQL connections")
    pytest.importorskip("uvicorn", reason="the model server needs the bench extra")
    systems = ["ours-1"]
    if importlib.util.find_spec("langgraph") is not None:
        systems.append("langgraph")
    prefix = f"{connection.settings_dict['NAME']}_inflight_smoke"
    redis = redis_url_for_tests() or ""
    report = tmp_path / "inflight.json"
    args = ["--levels", "5", "--systems", *systems, "--latency", "0.05", "--tokens", "4"]
    args += ["--token-delay", "0.01", "--database-prefix", prefix, "--redis-url", redis]
    args += ["--delta-sample", "2", "--json", str(report)]
    env = {**os.environ, "RUNTIME_VAR_DIR": str(tmp_path)}
    env["DATABASE_URL"] = subprocess_database_url()
    drop = [f"{prefix}_{system}" for system in ("ours", "langgraph")]
    done = run_bench("inflight.py", args, env, timeout=TIMEOUT_SECONDS, drop=drop)
    log = (tmp_path / "inflight.log").read_text() if (tmp_path / "inflight.log").exists() else ""
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:] + log[-3000:]
    assert re.search(
        r"^\| ours, 1 worker \| 5 \| 5 \| \d+\.\d\d \|.*\| clean \|$", done.stdout, re.M
    )

    results = {r["system"]: r for r in json.loads(report.read_text())["results"]}
    assert set(results) == set(systems)
    for system, figures in results.items():
        assert not figures["error"], (system, figures["error"])
        assert figures["wall_seconds"] > figures["ideal_seconds"] > 0
        assert figures["model_requests"] == 2 * 5  # a tool-call answer, then text, per run
        assert len(figures["step_overheads_ms"]) == 5  # one gap between them per run
        assert figures["overhead_p50_ms"] > 0 and not math.isnan(figures["overhead_p99_ms"])
        assert figures["peak_connections"] > 0 and figures["peak_rss_mib"] > 0
    assert results["ours-1"]["fsck"] == "clean"
    if redis:  # every text token of the sampled runs reached the subscriber
        assert len(results["ours-1"]["delta_latencies_ms"]) == 2 * 4
        assert results["ours-1"]["delta_p99_ms"] > 0
