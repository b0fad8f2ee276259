"""What each app needs of a host project (issue 24; README, Configuration, "What each app
needs"): the runtime's migrations and models name no other app; the console's pages run
without the API mounted; the API runs without what the pages need; and a host missing what the
pages need is told by ``manage.py check`` (console.E001-E003) before a page fails."""

from __future__ import annotations

import pytest
from django.db.migrations.loader import MigrationLoader

from runtime.demo.models import LedgerEffect
from tests.hosts import CONSOLE_APPS, ROOT, FreshDatabase, Host, fresh_database, ok
from tests.test_project_extra import CONSOLE_SETTINGS

__all__ = ["fresh_database"]  # the fixture, used by name

UI_ONLY = """
from django.urls import include, path

urlpatterns = [path("ops/", include("console.views.urls"))]
"""
API_ONLY = """
from django.urls import include, path

urlpatterns = [path("ops/api/", include("console.api.urls"))]
"""

# Signs an operator in with the Django test client and prints each page's status.
VISIT = """
import django
django.setup()
from django.contrib.auth.models import Permission, User
from django.test import Client
from runtime.operations import start_run

user = User.objects.create_user("op", password="pw")
user.user_permissions.add(*Permission.objects.filter(content_type__app_label="console"))
client = Client()
client.force_login(user)
run_id = start_run(agent="demo", input="hello", actor="op")
for page in ("/ops/", "/ops/inbox/", "/ops/workers/", "/ops/tokens/", f"/ops/runs/{run_id}/"):
    print(page.replace(run_id, "RUN"), client.get(page).status_code)
"""


@pytest.mark.django_db
def test_the_runtimes_migrations_and_models_name_no_other_app():
    loader = MigrationLoader(None, ignore_no_migrations=True)
    allowed = {"runtime": {"runtime"}, "runtime_demo": {"runtime", "runtime_demo"}}
    for (app, name), migration in loader.disk_migrations.items():
        if app in allowed:
            assert {a for a, _ in migration.dependencies} <= allowed[app], (app, name)
    for label in allowed:
        for model in loader.project_state().apps.get_app_config(label).get_models():
            for field in model._meta.get_fields():
                if field.related_model is not None:
                    assert field.related_model._meta.app_label in allowed[label], field
    assert LedgerEffect._meta.app_label == "runtime_demo"


def _console_host(tmp_path, database, urls: str, **settings) -> Host:
    console = {**CONSOLE_SETTINGS, **settings}
    # The pages' templates, wherever the repository keeps them (its templates/ folder or the
    # console app's own).
    console["TEMPLATES"] = [{**console["TEMPLATES"][0], "DIRS": [str(ROOT / "templates")]}]
    return Host(
        tmp_path,
        database,
        *CONSOLE_APPS,
        urls=urls,
        RUNTIME_AGENTS=["runtime.demo.agent.demo"],
        ALLOWED_HOSTS=["testserver"],
        **console,
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_console_pages_run_without_the_api(tmp_path, fresh_database):
    host = _console_host(tmp_path, fresh_database, UI_ONLY)
    ok(host.manage("migrate", "--noinput"))
    assert "no issues" in ok(host.manage("check"))
    assert ok(host.python(VISIT)).split("\n")[:-1] == [
        "/ops/ 200",
        "/ops/inbox/ 200",
        "/ops/workers/ 200",
        "/ops/tokens/ 200",
        "/ops/runs/RUN/ 200",
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_api_alone_needs_nothing_of_the_pages(tmp_path, fresh_database):
    host = Host(
        tmp_path,
        fresh_database,
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "django.contrib.sessions",
        "runtime",
        "console",
        urls=API_ONLY,
        ALLOWED_HOSTS=["testserver"],
        MIDDLEWARE=[],  # no htmx, messages or sessions middleware: the API needs none
    )
    ok(host.manage("migrate", "--noinput"))
    checked = host.manage("check")
    assert checked.returncode == 0 and "console.E" not in checked.stdout + checked.stderr
    answered = ok(
        host.python(
            "import django; django.setup()\n"
            "from django.test import Client\n"
            "r = Client().get('/ops/api/runs')\n"
            "print(r.status_code, r['Content-Type'])\n"
        )
    )
    assert answered.strip() == "401 application/json"


@pytest.mark.slow
def test_a_host_missing_what_the_pages_need_is_told(tmp_path):
    never_opened = FreshDatabase("", {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"})
    host = Host(
        tmp_path,
        never_opened,
        "django.contrib.contenttypes",
        "django.contrib.auth",
        "django.contrib.sessions",
        "runtime",
        "console",
        urls=UI_ONLY,
        MIDDLEWARE=[],
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates"}],
    )
    checked = host.manage("check")
    assert checked.returncode != 0
    said = checked.stderr
    for needed in ("django.contrib.messages", "django.contrib.staticfiles", "django_htmx"):
        assert f"(console.E001) the console needs {needed!r} in INSTALLED_APPS" in said
    for needed in ("AuthenticationMiddleware", "MessageMiddleware", "HtmxMiddleware"):
        assert f"{needed}' in MIDDLEWARE" in said
    assert "(console.E003) the console's pages need the context processor" in said
    assert 'HINT: add "django_htmx" to INSTALLED_APPS' in said
