"""Fixtures of the API tests: users with tokens, an authenticated client, runs in given states,
and (for the subprocess tests) the environment that points a worker or daphne at the test
database.

Factories are fixtures that return functions. In-process helpers drive runs only to a wait
(gates and tickets run no tool thread), so they work inside a test's transaction; anything
that executes tools runs the real worker as a subprocess on a transactional test database.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from console.models import ApiToken
from runtime.commits import commit
from runtime.coordinator import read_head, read_run
from runtime.domain.commit import CommitDraft
from runtime.domain.events import CallExecuting
from runtime.domain.model import Disposition
from runtime.loop import drive_inline
from runtime.models import ThreadCommit
from runtime.worker import claim
from tests.servers import serving
from tests.subprocesses import subprocess_database_url

ROOT = Path(__file__).resolve().parents[2]
BASE = "/api/v1"

APPROVAL = {"tool_calls": [{"name": "ledger_approval", "arguments": {"key": "b"}}]}
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}
INPUT = {
    "tool_calls": [
        {
            "name": "ask_input",
            "arguments": {"question": "How many?", "answer_schema": ANSWER_SCHEMA},
        }
    ]
}
# The issue's scenario: a completes, b waits for approval, c runs after it, then text.
SCENARIO = {
    "steps": [
        {
            "tool_calls": [
                {"name": "ledger_once", "arguments": {"key": "a"}},
                {"name": "ledger_approval", "arguments": {"key": "b"}},
                {"name": "ledger_replay", "arguments": {"key": "c"}},
            ]
        },
        {"text": "done"},
    ]
}

PERMS = {"read": "read_runs", "resume": "resume_runs", "operate": "operate_runs"}


class Api:
    """A Django test client that sends a bearer token and JSON."""

    def __init__(self, client: Client, token: str | None) -> None:
        self.client = client
        self.token = token

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return {**headers, **(extra or {})}

    def get(self, path: str, headers: dict[str, str] | None = None, **params: Any):
        return self.client.get(BASE + path, params, headers=self.headers(headers))

    def post(self, path: str, body: Any = None, headers: dict[str, str] | None = None):
        data = "" if body is None else json.dumps(body)
        return self.client.post(
            BASE + path, data, content_type="application/json", headers=self.headers(headers)
        )


@pytest.fixture
def make_user(django_user_model) -> Callable[..., tuple[Any, str]]:
    """make_user(username, *"read"|"resume"|"operate", superuser=False) -> (user, token)."""

    def make(username: str, *perms: str, superuser: bool = False, active: bool = True):
        if superuser:
            user = django_user_model.objects.create_superuser(username, password=None)
        else:
            user = django_user_model.objects.create_user(username, password=None)
        if perms:
            user.user_permissions.add(
                *Permission.objects.filter(
                    content_type__app_label="console", codename__in=[PERMS[p] for p in perms]
                )
            )
        if not active:
            user.is_active = False
            user.save(update_fields=["is_active"])
        _, token = ApiToken.issue(user, name="tests")
        return get_user_model().objects.get(pk=user.pk), token

    return make


@pytest.fixture
def api_as(make_user, client) -> Callable[..., Api]:
    """api_as(username, *perms) -> Api authenticated as a new user with those permissions."""

    def make(username: str, *perms: str, **kwargs: Any) -> Api:
        _, token = make_user(username, *perms, **kwargs)
        return Api(Client(), token)

    return make


@pytest.fixture
def api(api_as) -> Api:
    """An operator: may read, resume and operate."""
    return api_as("olivia", "read", "resume", "operate")


@pytest.fixture
def start(api) -> Callable[..., dict[str, Any]]:
    """start(*steps, thread=None) -> the run document of a new demo run with that script."""

    def make(*steps: dict[str, Any], thread: str | None = None, text: str = "go"):
        body = {"agent": "demo", "input": text, "metadata": {"script": {"steps": list(steps)}}}
        path = f"/threads/{thread}/runs" if thread else "/runs"
        response = api.post(path, body)
        assert response.status_code == 201, response.content
        return response.json()

    return make


def drive() -> None:
    """Drive every runnable run in this process until it waits or ends (no tool threads)."""
    while (taken := claim("api-tests")) is not None:
        drive_inline(taken.run_id, lease=taken.lease)


@pytest.fixture
def awaiting(start) -> Callable[..., dict[str, Any]]:
    """awaiting("approval"|"input") -> the document of a run awaiting that kind of ticket."""

    def make(kind: str = "approval", thread: str | None = None) -> dict[str, Any]:
        run = start(APPROVAL if kind == "approval" else INPUT, {"text": "done"}, thread=thread)
        drive()
        from runtime.documents import run_document

        document = run_document(run["id"])
        assert document["state"] == "awaiting", document
        assert document["ticket"]["kind"] == kind
        return document

    return make


def commit_executing(run_id: str, call_id: str, attempt: int = 1) -> None:
    """Commit an executor attempt, as a worker does just before a tool's effect starts."""
    run = read_run(run_id)
    assert run is not None
    commit(
        CommitDraft(
            thread_id=run.thread_id,
            run_id=run_id,
            expected_version=read_head(run.thread_id).version,
            disposition=Disposition.running(),
            events=(CallExecuting(call_id=call_id, attempt=attempt, worker="api-tests"),),
        )
    )


def commit_count(run_id: str | None = None) -> int:
    rows = ThreadCommit.objects.all()
    return (rows.filter(run_id=run_id) if run_id else rows).count()


def error_of(response) -> dict[str, Any]:
    """The error object of an error response, checking the one error shape on the way."""
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "detail"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["detail"], dict)
    return body["error"]


# -- subprocesses: the worker and daphne on the test database ---------------------------------


shared_database_url = subprocess_database_url


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """The environment of a worker or server subprocess that shares this test's database."""
    env = dict(os.environ)
    env["DATABASE_URL"] = shared_database_url()
    env["DJANGO_SETTINGS_MODULE"] = "console.settings"
    env.setdefault("RUNTIME_LOG_LEVEL", "WARNING")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def worker_available() -> bool:
    return (ROOT / "runtime" / "management" / "commands" / "runtime_worker.py").exists()


@pytest.fixture
def run_worker(subprocess_env) -> Callable[[], subprocess.CompletedProcess]:
    """run_worker() runs ``manage.py runtime_worker --until-idle`` to completion (exit 0)."""
    if not worker_available():
        pytest.skip("runtime_worker is not there yet")

    def run() -> subprocess.CompletedProcess:
        done = subprocess.run(
            [sys.executable, "manage.py", "runtime_worker", "--until-idle"],
            cwd=ROOT,
            env=subprocess_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    return run


@pytest.fixture
def daphne(subprocess_env, tmp_path) -> Iterator[str]:
    """Serve console.asgi with daphne on a free loopback port; yield its base URL."""
    with serving(subprocess_env, tmp_path / "daphne.log") as url:
        yield url
