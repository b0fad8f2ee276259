"""``/healthz`` and ``/readyz``: what a load balancer asks, without signing in."""

from __future__ import annotations

import json
import os
import time

import pytest
from asgiref.testing import ApplicationCommunicator
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.test import Client
from psycopg_pool import ConnectionPool

from console import health
from tests.subprocesses import redis_url_for_tests

pytestmark = pytest.mark.django_db


def _redis_layer(url: str) -> dict:
    return {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [url]},
        }
    }


async def _healthz(method: str) -> tuple[dict, dict]:
    from console.asgi import application

    scope = {"type": "http", "method": method, "path": "/healthz", "headers": []}
    app = ApplicationCommunicator(application, scope)
    await app.send_input({"type": "http.request", "body": b""})
    start, body = await app.receive_output(5), await app.receive_output(5)
    await app.wait(5)
    return start, body


@pytest.mark.asyncio
async def test_healthz_answers_without_signing_in_and_without_django():
    """Answered on the event loop, so nothing that holds the request threads delays it."""
    start, body = await _healthz("GET")
    assert (start["status"], json.loads(body["body"])) == (200, {"status": "ok"})
    assert b"no-cache" in dict(start["headers"])[b"cache-control"]
    start, body = await _healthz("POST")
    assert (start["status"], dict(start["headers"])[b"allow"]) == (405, b"GET, HEAD")


def test_readyz_checks_database_migrations_and_channel_layer():
    response = Client().get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "status": "ready",
        "checks": {
            "database": "ok",
            "pool": "ok",
            "runs_table": "ok",
            "migrations": "ok",
            "channel_layer": "ok",
            "static_files": "ok",
            "worker": "ok",
        },
    }


def test_readyz_says_why_the_in_process_worker_cannot_work(monkeypatch):
    """A worker serving in this process (runtime_serve's) that cannot reach the database makes
    the process unready, naming the worker and the reason; it is ready again once it works."""
    from django.db import OperationalError

    from runtime import worker as worker_module

    worker = worker_module.Worker(worker_id="in-process")
    monkeypatch.setattr(worker_module, "SERVING", {worker})
    lost = OperationalError("connection to server at 127.0.0.1 failed: Connection refused")
    assert worker.observe(lost)
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["worker"] == (
        "in-process: the database cannot be reached: "
        "connection to server at 127.0.0.1 failed: Connection refused"
    )
    assert not worker.observe(None)
    assert Client().get("/readyz").status_code == 200


def test_readyz_names_an_unapplied_migration():
    # The runtime app's latest migration: unapplying an earlier one leaves the plan empty.
    (latest,) = [n for app, n in MigrationLoader(None).graph.leaf_nodes() if app == "runtime"]
    MigrationRecorder.Migration.objects.filter(app="runtime", name=latest).delete()
    response = Client().get("/readyz")
    assert response.status_code == 503
    unapplied = f"RuntimeError: 1 unapplied: runtime.{latest}"
    assert response.json()["checks"]["migrations"] == unapplied
    assert response.json()["checks"]["database"] == "ok"


def test_readyz_fails_when_static_files_were_not_collected(settings, tmp_path):
    """With the manifest storage of production and no collectstatic, every console page is
    a 500: the process is not ready."""
    settings.STATIC_ROOT = tmp_path
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
    }
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert "console/console.css" in response.json()["checks"]["static_files"]


def test_readyz_fails_when_redis_is_unreachable(settings):
    settings.CHANNEL_LAYERS = _redis_layer("redis://127.0.0.1:1/0")
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "unready"
    assert "onnect" in response.json()["checks"]["channel_layer"]


@pytest.mark.skipif(
    not os.environ.get("RUNTIME_TEST_REDIS_URL"), reason="RUNTIME_TEST_REDIS_URL is not set"
)
def test_readyz_round_trips_through_redis(settings):
    settings.CHANNEL_LAYERS = _redis_layer(redis_url_for_tests())
    response = Client().get("/readyz")
    assert response.status_code == 200, response.json()


def test_the_database_probe_names_an_unreachable_database_within_a_second():
    """A pool whose database cannot be reached: the probe gives up after its own short wait
    (not the pool's timeout) and names the database, not the pool (psycopg_pool counts the
    connections it is trying to make in its size: it looked full, "exhausted")."""
    pool = ConnectionPool(
        "postgresql://127.0.0.1:1/nothing", min_size=1, max_size=2, open=False, timeout=30
    )
    found = {"database": "ok", "pool": "ok", "runs_table": "ok"}
    started = time.monotonic()
    try:
        health._probe_pooled(pool, found)
    finally:
        pool.close()
    assert time.monotonic() - started < 1.5
    assert found["database"].startswith("no connection within 0.25 s"), found
    assert found["pool"] == "ok"
    assert found["runs_table"].startswith("not checked"), found
