"""The chaos run's short form (>= 60 s, >= 20 SIGKILLs), PostgreSQL only: all counts 0.

tests/chaos/chaos.py is the whole run and its report; by hand it runs longer.
"""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from django.db import connection

from tests.chaos.chaos import WORKER_ENV, Chaos
from tests.servers import serving

pytestmark = pytest.mark.django_db(transaction=True)

SECONDS = 60
MIN_KILLS = 20


def test_chaos_short(make_user, subprocess_env, tmp_path) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("chaos needs PostgreSQL: several worker processes write at once")
    _, token = make_user("chaos", "read", "resume", "operate")
    env = {**subprocess_env, **WORKER_ENV}
    with serving(env, tmp_path / "server.log") as base_url:
        report = Chaos(
            base_url=base_url, token=token, env=env, seconds=SECONDS, log_dir=tmp_path
        ).run()
    summary = json.dumps(asdict(report), indent=2)
    print(summary)  # the report, also when every count is 0 (pytest -s shows it)
    assert report.seconds >= SECONDS, summary
    assert report.kills >= MIN_KILLS, summary
    assert report.runs > 0 and report.reads > 0 and report.approvals > 0, summary
    assert report.failures() == {}, summary
