"""whitenoise and dj-database-url are the repository project's, not the apps' (issue 24, item
2): the wheel's core does not depend on them, the ``project`` extra brings them (scripts/start
and scripts/test install it), a host project with its own DATABASES and static serving runs
the engine, the demo and the console without them, and this project's settings name the extra
when it is missing."""

from __future__ import annotations

import re
import sys
import tomllib

import pytest

from tests.hosts import (
    CONSOLE_APPS,
    MANAGE_WITHOUT,
    ROOT,
    Host,
    clean_env,
    fresh_database,
    ok,
    run,
)

__all__ = ["fresh_database"]  # the fixture, used by name

PROJECT_ONLY = ("whitenoise", "dj-database-url")

# A host's URLs: the console's pages and the API under its own prefixes.
HOST_URLS = """
from django.urls import include, path

urlpatterns = [
    path("ops/", include("console.views.urls")),
    path("ops/api/", include("console.api.urls")),
]
"""
CONSOLE_SETTINGS = {
    "MIDDLEWARE": [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "django_htmx.middleware.HtmxMiddleware",
    ],
    "TEMPLATES": [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ],
    "STATIC_URL": "/static/",
}


def _requirement_names(requirements: list[str]) -> set[str]:
    return {r.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip() for r in requirements}


def test_the_core_needs_neither_and_the_project_extra_brings_both():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert not _requirement_names(project["dependencies"]) & set(PROJECT_ONLY)
    assert _requirement_names(extras["project"]) == set(PROJECT_ONLY)
    assert "durable-agent-runtime[all,project]" in extras["test"]  # scripts/test
    # scripts/start (through scripts/_python.sh) installs the locked product set, which has it.
    start_lock = (ROOT / "requirements" / "start.txt").read_text()
    assert "--extra all --extra project" in (ROOT / "scripts" / "lock").read_text()
    for name in PROJECT_ONLY:
        assert re.search(rf"^{re.escape(name)}==", start_lock, re.MULTILINE | re.IGNORECASE), name


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_host_runs_the_apps_without_either(tmp_path, fresh_database):
    host = Host(
        tmp_path,
        fresh_database,
        *CONSOLE_APPS,
        urls=HOST_URLS,
        RUNTIME_AGENTS=["runtime.demo.agent.demo"],
        **CONSOLE_SETTINGS,
    )
    ok(host.manage("migrate", "--noinput"))
    checked = ok(host.manage("check"))
    assert "no issues" in checked
    # Every module a host's server and worker import, with neither importable.
    imported = host.python(
        "import django; django.setup()\n"
        "import console.views.urls, console.api.urls, runtime.demo.agent, runtime.worker\n"
    )
    ok(imported)


def test_the_project_settings_name_the_extra_when_one_is_missing(tmp_path):
    env = clean_env(tmp_path, DJANGO_SETTINGS_MODULE="console.settings")
    done = run([sys.executable, "-c", MANAGE_WITHOUT, "check"], env, ROOT)
    assert done.returncode != 0
    assert "durable-agent-runtime[project]" in done.stderr, done.stderr
    assert "console/settings.py" in done.stderr
