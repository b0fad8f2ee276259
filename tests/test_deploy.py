"""The production settings of docs/deploy.md: ``check --deploy`` is clean with them, WhiteNoise
serves hashed static files after collectstatic, and the admin shows the runtime read only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from runtime.models import Run
from tests.servers import free_port, serving

ROOT = Path(__file__).resolve().parents[1]

# The environment docs/deploy.md documents (deploy/runtime.env), on a throwaway var dir.
DEPLOY_ENV = {
    "DJANGO_SECRET_KEY": "k" * 20 + "-a-long-random-production-key-" + "z" * 20,
    "RUNTIME_INSECURE_DEV_KEY": "0",
    "DJANGO_DEBUG": "0",
    "DJANGO_HTTPS": "1",
    "DJANGO_ALLOWED_HOSTS": "runtime.example.com",
    "DJANGO_CSRF_TRUSTED_ORIGINS": "https://runtime.example.com",
    "RUNTIME_STATIC_MANIFEST": "1",
    "RUNTIME_ALLOW_SCRIPTED": "0",
}

# Fetch the sign-in page over "HTTPS" (the proxy's header), then the stylesheet it links.
FETCH_STATIC = """
import re
from django.test import Client
client = Client(HTTP_X_FORWARDED_PROTO="https", HTTP_HOST="runtime.example.com")
page = client.get("/login/").content.decode()
href = re.search(r'href="(/static/console/console\\.[0-9a-f]{12}\\.css)"', page).group(1)
css = client.get(href)
assert css.status_code == 200, css.status_code
assert "max-age=315360000" in css["Cache-Control"], css["Cache-Control"]
print("served", href)
"""


def _manage(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "RUNTIME_"))}
    env.update(DEPLOY_ENV, RUNTIME_VAR_DIR=str(tmp_path), DATABASE_URL="")
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_check_deploy_is_clean_with_the_documented_settings(tmp_path):
    done = _manage("check", "--deploy", "--fail-level", "WARNING", tmp_path=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues" in done.stdout


@pytest.mark.slow
def test_whitenoise_serves_hashed_static_files_after_collectstatic(tmp_path):
    done = _manage("collectstatic", "--noinput", "-v0", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "static" / "console").glob("console.*.css.gz"))
    done = _manage("shell", "-c", FETCH_STATIC, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "served /static/console/console." in done.stdout


@pytest.mark.django_db
def test_the_bootstrap_operator_manages_groups_and_sees_the_runtime_read_only(start_demo):
    call_command("runtime_bootstrap", "--password", "pw-bootstrap-1", stdout=StringIO())
    user = get_user_model().objects.get(username="operator")
    assert user.is_staff and not user.is_superuser
    client = Client()
    client.force_login(user)
    assert client.get("/admin/auth/group/").status_code == 200
    assert client.get("/admin/auth/group/add/").status_code == 200
    run_id = start_demo()
    assert client.get("/admin/runtime/run/").status_code == 200
    page = client.get(f"/admin/runtime/run/{run_id}/change/")
    assert page.status_code == 200
    assert 'type="submit"' not in page.content.decode().split('id="content-main"')[1]
    assert client.get("/admin/runtime/run/add/").status_code == 403
    assert client.post(f"/admin/runtime/run/{run_id}/delete/").status_code == 403
    edit = client.post(f"/admin/runtime/run/{run_id}/change/", {"state": "ended"})
    assert edit.status_code == 403
    assert Run.objects.get(id=run_id).state == "running"


@pytest.fixture
def start_demo():
    from runtime.operations import start_run

    return lambda: start_run(agent="demo", input="hello", actor="t")


def _start_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "RUNTIME_"))}
    env.update(RUNTIME_VAR_DIR=str(tmp_path), **extra)
    return env


def _psql(sql: str) -> subprocess.CompletedProcess[str]:
    command = [
        "psql",
        "-X",
        "-q",
        "-t",
        "-A",
        "-h",
        "127.0.0.1",
        "-U",
        "postgres",
        "-d",
        "postgres",
    ]
    return subprocess.run([*command, "-c", sql], capture_output=True, text=True, timeout=30)


@pytest.mark.slow
def test_start_names_an_unreachable_postgres_server_in_one_line(tmp_path):
    port = free_port()  # nothing listens there
    url = f"postgres://rt:s3cret@127.0.0.1:{port}/rt_x"
    done = subprocess.run(
        ["scripts/start"],
        cwd=ROOT,
        env=_start_env(tmp_path, DATABASE_URL=url, PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: cannot reach PostgreSQL at postgres://rt:***@127.0.0.1:{port}/rt_x"
        " (DATABASE_URL); start the server or fix the URL"
    ], done.stderr
    assert "Traceback" not in done.stderr
    assert "s3cret" not in done.stdout + done.stderr


@pytest.mark.slow
def test_start_creates_a_missing_postgres_database(tmp_path):
    if shutil.which("psql") is None or _psql("SELECT 1").returncode != 0:
        pytest.skip("no PostgreSQL at 127.0.0.1:5432 (user postgres)")
    name = f"rt_start_{uuid.uuid4().hex[:12]}"
    port = free_port()
    env = _start_env(
        tmp_path, DATABASE_URL=f"postgres://postgres@127.0.0.1:5432/{name}", PORT=str(port)
    )
    try:
        with serving(
            env, tmp_path / "start.log", command=["scripts/start"], port=port, timeout=120
        ):
            assert (
                _psql(f"SELECT 1 FROM pg_database WHERE datname = '{name}'").stdout.strip() == "1"
            )
        assert f"creating PostgreSQL database {name}" in (tmp_path / "start.log").read_text()
    finally:
        _psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
