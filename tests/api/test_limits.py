"""``GET /limits`` and the run document's ``waiting`` (issue 23, item 2): each limit's use,
read from the database, in the OpenAPI schema; a run held back says why."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from console.api.api import api as ninja_api
from runtime.models import Run
from runtime.operations import start_run

AGENTS = ["runtime.demo.agent.demo"]


def test_limits_and_their_use_and_why_a_run_waits(api, settings):
    settings.RUNTIME_AGENTS = AGENTS
    settings.RUNTIME_RUN_LIMITS = {"demo": {"runs": 1, "key": "customer", "per_key": 1}}
    settings.RUNTIME_MODEL_LIMITS = {"scripted": {"concurrency": 2, "per_minute": 30}}
    first = start_run(agent="demo", input="a", metadata={"customer": "acme"})
    second = start_run(agent="demo", input="b", metadata={"customer": "zeta"})
    Run.objects.filter(id=first).update(
        lease_owner="w", lease_epoch=1, lease_expires_at=timezone.now() + timedelta(seconds=30)
    )
    body = api.get("/limits").json()
    assert body["runs"] == [
        {
            "agent": "demo",
            "runs": 1,
            "running": 1,
            "waiting": 1,
            "key": "customer",
            "per_key": 1,
            "busiest_key": "acme",
            "busiest_running": 1,
        }
    ]
    (model,) = body["models"]
    assert (model["model"], model["concurrency"], model["in_flight"], model["tokens"]) == (
        "scripted",
        2,
        0,
        30,
    )
    assert api.get(f"/runs/{second}").json()["waiting"] == (
        "waiting for a slot: agent demo, 1 of 1 running"
    )
    assert api.get(f"/runs/{first}").json()["waiting"] is None


def test_limits_are_in_the_openapi_schema():
    schema = ninja_api.get_openapi_schema()
    assert "/api/v1/limits" in schema["paths"]
    assert "waiting" in schema["components"]["schemas"]["RunOut"]["properties"]
