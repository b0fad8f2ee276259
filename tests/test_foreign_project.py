"""Issue 24, item 5: the wheel installs into a project the runtime never saw.

The test builds the wheel (``pip wheel --no-deps --no-build-isolation --no-index``: offline),
makes a project with ``django-admin startproject mysite``, gives it what an existing project
has (its own ``base.html``, ``403.html``, ``404.html``, a view, a group with permissions), then
follows the guide "Add it to your project" (docs/embedding.md) to the letter: the Python blocks
of that page are the code the project gets, its shell block the commands run. It migrates,
starts two runs of the project's own agent, runs them with ``runtime_worker --until-idle``,
approves one ticket in Chromium through the project's console URL and the other through the
project's API URL, runs the worker again, and checks that both runs ended with their tool's
result and that the project's templates, groups and settings are as they were.

The project gets a virtualenv of its own (``python -m venv --without-pip``) into which the
wheel is installed with ``--no-deps`` by the suite's pip (``pip --python``). Its dependencies
are the suite's installed ones, reached through a ``.pth`` line naming the suite's
site-packages: a plain path, so the ``.pth`` files in there (the editable install of this
repository) are not processed, and ``console`` and ``runtime`` can only come from the wheel
(asserted). Installing the dependencies again from the local index would only copy the same
versions, for tens of seconds. The database is SQLite, or a fresh PostgreSQL database on the
server of DATABASE_URL when the suite runs on PostgreSQL.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS, free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "embedding.md"  # the embedding guide this test follows
PASSWORD = "a-host-operator-password"

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def readme_section() -> str:
    """The text of the guide "Add it to your project" (docs/embedding.md), the whole page."""
    text = GUIDE.read_text()
    assert text.startswith("# Add it to your project\n"), "docs/embedding.md lost its title"
    return text


def readme_blocks(language: str) -> list[str]:
    """The fenced blocks of ``language`` in that section, dedented."""
    blocks = re.findall(rf"^( *)```{language}\n(.*?)^\1```", readme_section(), re.M | re.S)
    return [
        "\n".join(line[len(indent) :] for line in body.splitlines()) + "\n"
        for indent, body in blocks
    ]


def python_block(path: str) -> str:
    """The Python block of the section whose first line is ``# <path>``."""
    for block in readme_blocks("python"):
        if block.splitlines()[0] == f"# {path}":
            return block
    raise AssertionError(f"docs/embedding.md has no block for {path}")


class Host:
    """The foreign project: its folder, its virtualenv's Python and its environment."""

    def __init__(self, folder: Path, python: Path, env: dict[str, str]) -> None:
        self.folder, self.python, self.env = folder, python, env

    def run(self, *args: str, timeout: float = 120) -> str:
        done = subprocess.run(
            [str(self.python), *args],
            cwd=self.folder,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def manage(self, *args: str, timeout: float = 120) -> str:
        return self.run("manage.py", *args, timeout=timeout)


def build_wheel(into: Path) -> Path:
    """Build the wheel from a copy of what it is made of (a build in the worktree would
    leave build/ and egg-info there, shared by every xdist worker)."""
    source = into / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for package in ("runtime", "console"):
        shutil.copytree(ROOT / package, source / package, ignore=ignore)
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(into),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = into.glob("durable_agent_runtime-*.whl")
    return wheel


def make_venv(folder: Path, wheel: Path) -> Path:
    """A virtualenv holding the wheel, reaching the suite's dependencies by a path line."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    python = folder / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "suite-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return python


HOST_VIEWS = """
from django.shortcuts import render


def home(request):
    return render(request, "base.html", {"who": "host"})
"""

# What the project had before the runtime: its own templates and a view of its own.
HOST_TEMPLATES = {
    "base.html": "<!doctype html><title>Host</title><p>HOST BASE {{ who }}</p>\n",
    "403.html": "<p>HOST 403</p>\n",
    "404.html": "<p>HOST 404</p>\n",
}
HOST_SETTINGS = """
TEMPLATES[0]["DIRS"] = [BASE_DIR / "templates"]
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
"""

# After the runtime is installed: settings and groups are what the project set.
CHECK_HOST = r"""
import copy, importlib, json, os, sys
raw = importlib.import_module("mysite.settings")
before = {k: copy.deepcopy(getattr(raw, k)) for k in dir(raw) if k.isupper()}
import django
django.setup()
from django.conf import settings
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from runtime.models import Run
import console, runtime
Run.objects.count()  # a connection opened, every signal of the runtime's apps fired
def same(key, old, new):
    if key == "STATIC_URL":  # Django itself puts the script prefix before a relative one
        return new in (old, "/" + old)
    if key == "DATABASES":  # Django itself fills in its defaults; what the host gave stays
        return all(
            all(new[alias].get(k) == v for k, v in given.items())
            and new[alias].get("OPTIONS", {}) == given.get("OPTIONS", {})
            for alias, given in old.items()
        )
    return old == new
changed = [k for k, v in before.items() if not same(k, v, getattr(settings, k))]
groups = {g.name: sorted(p.codename for p in g.permissions.all()) for g in Group.objects.all()}
client = Client()
home = client.get("/").content.decode()
from django.test.utils import override_settings
with override_settings(DEBUG=False):  # the 404 page a visitor sees
    missing = client.get("/nothing-here/").content.decode()
login = client.get("/runtime/login/").content.decode()
print(json.dumps({"changed": changed, "groups": groups, "home": home, "missing": missing,
                  "login": login, "console": console.__file__, "runtime": runtime.__file__,
                  "wrappers": len(connection.execute_wrappers)}))
"""


def postgres_database(url: str) -> Iterator[str | None]:
    """A fresh PostgreSQL database on DATABASE_URL's server (dropped after), as the Python
    text of its DATABASES entry, or None."""
    if not url.startswith(("postgres://", "postgresql://")):
        yield None
        return
    import dj_database_url
    import psycopg

    config = dj_database_url.parse(url)
    name = f"rt_host_{uuid.uuid4().hex[:12]}"
    params: dict[str, Any] = {
        "host": config.get("HOST") or "127.0.0.1",
        "port": config.get("PORT") or 5432,
        "user": config.get("USER") or "postgres",
        "password": config.get("PASSWORD") or None,
    }
    with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield repr(
            {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": name,
                **{k.upper(): v for k, v in params.items()},
            }
        )
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **params) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a virtualenv holding the wheel (one for this module's tests)."""
    folder = tmp_path_factory.mktemp("foreign")
    return make_venv(folder / "venv", build_wheel(folder / "dist"))


@pytest.fixture
def host(tmp_path: Path, venv_python: Path) -> Iterator[Host]:
    """``django-admin startproject mysite`` with the runtime's wheel in its own virtualenv,
    and what a project has before it adds the runtime."""
    python = venv_python
    folder = tmp_path / "site"
    folder.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DJANGO_", "RUNTIME_", "DATABASE_URL"))
    }
    env.update(DJANGO_SETTINGS_MODULE="mysite.settings", PYTHONDONTWRITEBYTECODE="1")
    site = Host(folder, python, env)
    site.run("-m", "django", "startproject", "mysite", str(folder))
    (folder / "templates").mkdir()
    for name, text in HOST_TEMPLATES.items():
        (folder / "templates" / name).write_text(text)
    (folder / "mysite" / "views.py").write_text(HOST_VIEWS)
    settings = folder / "mysite" / "settings.py"
    extra = HOST_SETTINGS
    for database in postgres_database(os.environ.get("DATABASE_URL", "")):
        if database:
            extra += f"DATABASES = {{'default': {database}}}\n"
        settings.write_text(settings.read_text() + extra)
        urls = folder / "mysite" / "urls.py"
        urls.write_text(
            urls.read_text()
            .replace(
                "from django.urls import path",
                "from django.urls import include, path\n\nfrom mysite.views import home",
            )
            .replace("    path('admin/', admin.site.urls),", '    path("admin/", admin.site.urls),')
            .replace(
                '    path("admin/", admin.site.urls),',
                '    path("admin/", admin.site.urls),\n    path("", home),',
            )
        )
        site.manage("migrate", "-v0")
        site.manage(
            "shell",
            "-c",
            "from django.contrib.auth.models import Group, Permission; "
            "Group.objects.create(name='editors').permissions.set("
            "Permission.objects.filter(codename__in=['view_user', 'change_group']))",
        )
        yield site


def add_the_runtime(site: Host) -> None:
    """The guide "Add it to your project" (docs/embedding.md), steps 2 to 4, as written there."""
    package = site.folder / "mysite"
    settings = package / "settings.py"
    settings.write_text(settings.read_text() + python_block("mysite/settings.py"))
    urls = package / "urls.py"
    lines = python_block("mysite/urls.py").splitlines()[1:]
    text = urls.read_text()
    assert "from django.urls import include, path" in text
    urls.write_text(text.replace('    path("", home),', "\n".join(lines) + '\n    path("", home),'))
    (package / "asgi.py").write_text(python_block("mysite/asgi.py"))
    (package / "agents.py").write_text(python_block("mysite/agents.py"))


def readme_commands() -> list[list[str]]:
    """The ``python manage.py ...`` lines of the section's shell block, comments cut."""
    (shell,) = readme_blocks("sh")[1:2]
    commands = []
    for line in shell.splitlines():
        line = line.split("  #")[0].strip()
        if line.startswith("python manage.py "):
            commands.append(line.split()[2:])
    return commands


class Server:
    """``manage.py runserver`` of the project (daphne's: HTTP and WebSockets) on a free port."""

    def __init__(self, site: Host) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        # A file, not a pipe: nobody reads runserver's request log while it serves, and a
        # full pipe would stop the server mid-test.
        self.log = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self.process = subprocess.Popen(
            [str(site.python), "manage.py", "runserver", "--noreload", f"127.0.0.1:{self.port}"],
            cwd=site.folder,
            env=site.env,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.base + "/runtime/healthz", timeout=2):
                    return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError(f"runserver did not answer: {self.output()!r}") from None
                time.sleep(0.1)

    def output(self) -> bytes:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


def approve_in_chromium(base: str, ticket_id: str) -> None:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.set_default_timeout(20_000)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(base + "/runtime/inbox/")  # not signed in: the console's sign-in page
            page.wait_for_url(re.compile(r"/runtime/login/\?next="))
            page.fill("#id_username", "alice")
            page.fill("#id_password", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(base + "/runtime/inbox/")
            card = page.locator(f"#ticket-{ticket_id}")
            expect(card).to_contain_text("send_note")
            expect(card).to_contain_text("buy milk")
            card.get_by_role("button", name=re.compile(r"^Approve #")).click()
            expect(card.locator("[data-outcome]")).to_contain_text("Approved by alice")
            assert not errors, errors
        finally:
            browser.close()


def call_api(base: str, token: str, method: str, path: str, body: dict | None = None) -> dict:
    """One request to the project's API (under its ``runtime/api/`` prefix); its JSON."""
    request = urllib.request.Request(
        f"{base}/runtime/api/{path}",
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method=method,
    )
    with urllib.request.urlopen(request, timeout=20) as response:
        assert response.status in (200, 201), response.status
        return json.loads(response.read())


def open_ticket(base: str, token: str, run_id: str) -> str:
    """The id of the one open ticket of ``run_id`` (GET tickets)."""
    tickets = call_api(base, token, "GET", "tickets?state=open")["items"]
    (ticket,) = [t["id"] for t in tickets if t["run_id"] == run_id]
    return ticket


def test_the_wheel_installs_into_a_foreign_project_as_the_readme_says(host: Host):
    add_the_runtime(host)
    commands = readme_commands()
    assert commands[:3] == [
        ["migrate"],
        ["runtime_bootstrap", "--groups-only"],
        ["runtime_operator", "alice", "--password", '"choose-one"'],
    ]
    host.manage("migrate", "-v0")
    groups_after_migrate = json.loads(host.run("-c", CHECK_HOST))["groups"]
    assert list(groups_after_migrate) == ["editors"]  # no migration makes a group
    host.manage("runtime_bootstrap", "--groups-only")
    host.manage("runtime_operator", "alice", "--password", PASSWORD)

    state = json.loads(host.run("-c", CHECK_HOST))
    site_packages = str(host.python.parent.parent)
    assert state["console"].startswith(site_packages), state["console"]  # the wheel's, not ours
    assert state["runtime"].startswith(site_packages), state["runtime"]
    assert state["changed"] == [], state["changed"]
    assert state["groups"]["editors"] == ["change_group", "view_user"]
    assert set(state["groups"]) == {"editors", "viewers", "approvers", "operators"}
    assert "HOST BASE host" in state["home"]
    assert "HOST 404" in state["missing"]  # the host's 404 page stays the host's
    assert "Agent runtime" in state["login"] and "HOST" not in state["login"]

    # One run started by the guide's command, one through the API; the worker runs both
    # up to their approval tickets and stops.
    browser_run = host.manage("runtime_start", "--agent", "notes", "--input", "buy milk").strip()
    token = host.manage("runtime_token", "alice").strip()
    server = Server(host)
    try:
        api_run = call_api(
            server.base, token, "POST", "runs", {"agent": "notes", "input": "call Bob"}
        )["id"]
        host.manage("runtime_worker", "--until-idle", timeout=60)
        approve_in_chromium(server.base, open_ticket(server.base, token, browser_run))
        approval = {"kind": "approval", "decision": "approve"}
        ticket = open_ticket(server.base, token, api_run)
        call_api(
            server.base, token, "POST", f"runs/{api_run}/resume", {"ticket_id": ticket, **approval}
        )
        host.manage("runtime_worker", "--until-idle", timeout=60)
        for run_id, text in ((browser_run, "buy milk"), (api_run, "call Bob")):
            document = call_api(server.base, token, "GET", f"runs/{run_id}")
            assert (document["state"], document["end_cause"]) == ("ended", "natural"), document
            dumped = json.dumps(document)
            # the tool's result, in the committed tool message (JSON text in JSON)
            assert f'\\"sent\\": \\"{text}\\"' in dumped or f'"sent": "{text}"' in dumped
            assert "The note is sent." in dumped
    finally:
        server.stop()

    assert json.loads(host.run("-c", CHECK_HOST))["changed"] == []


# The settings a host sets for production, on top of startproject's.
HOST_DEPLOY_SETTINGS = """
from mysite.settings import *  # noqa: F403

DEBUG = False
SECRET_KEY = "h" * 30 + "-a-long-random-production-key-of-the-host-" + "q" * 30
ALLOWED_HOSTS = ["host.example.com"]
SECURE_SSL_REDIRECT = True
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_HSTS_SECONDS = 31_536_000
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# Django 6.1's startproject sends mail to the console, which --deploy refuses (mail.E001).
MAILERS = {"default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend"}}
"""


def test_check_deploy_is_clean_on_the_foreign_project(host: Host):
    add_the_runtime(host)
    (host.folder / "mysite" / "settings_deploy.py").write_text(HOST_DEPLOY_SETTINGS)
    host.env["DJANGO_SETTINGS_MODULE"] = "mysite.settings_deploy"
    out = host.manage("check", "--deploy", "--fail-level", "WARNING")
    assert "no issues" in out


# docs/configuration.md: the runtime's tables on a database of their own.
RUNTIME_ON_ITS_OWN_DATABASE = """
DATABASES["runtime"] = {runtime}
RUNTIME_DATABASE = "runtime"
DATABASE_ROUTERS = ["runtime.db.Router"]
"""

TABLES_BY_ALIAS = """
import json
from django.db import connections
print(json.dumps({a: connections[a].introspection.table_names() for a in ("default", "runtime")}))
"""


def test_the_runtime_keeps_its_tables_on_the_alias_runtime_database_names(host: Host):
    """RUNTIME_DATABASE: runs, their documents, search and forks read and write the second
    database; the host's database gets no runtime table and the host's tables stay on it."""
    add_the_runtime(host)
    settings = host.folder / "mysite" / "settings.py"
    for database in postgres_database(os.environ.get("DATABASE_URL", "")):
        runtime = database or repr(
            {"ENGINE": "django.db.backends.sqlite3", "NAME": str(host.folder / "runtime.db")}
        )
        settings.write_text(
            settings.read_text() + RUNTIME_ON_ITS_OWN_DATABASE.format(runtime=runtime)
        )
        host.manage("check", "--fail-level", "WARNING")
        host.manage("migrate", "-v0")
        host.manage("migrate", "--database", "runtime", "-v0")
        host.manage("runtime_operator", "alice", "--password", PASSWORD)
        run_id = host.manage("runtime_start", "--agent", "notes", "--input", "buy milk").strip()
        host.manage("runtime_worker", "--until-idle", timeout=60)
        token = host.manage("runtime_token", "alice").strip()
        server = Server(host)
        try:
            ticket = open_ticket(server.base, token, run_id)
            resume = {"ticket_id": ticket, "kind": "approval", "decision": "approve"}
            call_api(server.base, token, "POST", f"runs/{run_id}/resume", resume)
            host.manage("runtime_worker", "--until-idle", timeout=60)
            document = call_api(server.base, token, "GET", f"runs/{run_id}")
            assert (document["state"], document["end_cause"]) == ("ended", "natural"), document
            found = call_api(server.base, token, "GET", "runs?q=milk")["items"]
            assert [run["id"] for run in found] == [run_id]
            fork = call_api(server.base, token, "POST", f"runs/{run_id}/fork", {"at_step": 1})
            assert fork["metadata"]["forked_from"]["run_id"] == run_id, fork
        finally:
            server.stop()
        tables = json.loads(host.run("-c", "import django; django.setup()\n" + TABLES_BY_ALIAS))
        assert "runtime_run" in tables["runtime"], tables["runtime"]
        assert not [t for t in tables["default"] if t.startswith("runtime_")], tables["default"]
        assert "auth_user" in tables["default"]
