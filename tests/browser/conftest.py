"""The browser tests' stack: the real ASGI server (daphne) and real worker processes on the
test database, sharing a Redis channel layer, driven by Debian's Chromium through Playwright.

Playwright never downloads a browser here: Chromium is ``/usr/bin/chromium`` (or
``RUNTIME_CHROMIUM``). Every test saves a screenshot under ``test-results/screenshots/``; with
``RUNTIME_UPDATE_SCREENSHOTS=1`` the page tour also refreshes ``docs/screenshots/``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.subprocesses import (
    DEFAULT_REDIS_URL,
    FAST_WORKER_ENV,
    redis_url_for_tests,
    subprocess_database_url,
    xdist_worker,
)

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("RUNTIME_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# This process's own Redis database: under xdist the workers' live groups never meet.
REDIS_URL = redis_url_for_tests(DEFAULT_REDIS_URL) or DEFAULT_REDIS_URL
RESULTS = ROOT / "test-results" / "screenshots"
DOCS = ROOT / "docs" / "screenshots"
STACK_ENV = {**FAST_WORKER_ENV, "DJANGO_DEBUG": "0"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """daphne on a free loopback port plus any worker processes a test starts."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.server = self._spawn(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "console.asgi:application",
            ],
            "daphne",
        )
        self._wait_ready()

    def _spawn(self, args: list[str], name: str, **extra: str) -> subprocess.Popen[bytes]:
        prefix = f"{xdist_worker()}-" if xdist_worker() else ""
        log = RESULTS.parent / f"{prefix}{name}-{len(self.processes)}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            process = subprocess.Popen(
                args, cwd=ROOT, env={**self.env, **extra}, stdout=out, stderr=subprocess.STDOUT
            )
        self.processes.append(process)
        self.logs.append(log)
        return process

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.server.poll() is not None:
                raise RuntimeError(f"daphne exited:\n{self.logs[0].read_text()}")
            try:
                with urllib.request.urlopen(self.base_url + "/login/", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"daphne did not answer within {timeout}s")

    def restart_server(self, downtime: float = 0) -> None:
        """Stop daphne and start it again on the same port (clients must reconnect)."""
        self.server.terminate()
        self.server.wait(timeout=10)
        time.sleep(downtime)
        self.server = self._spawn(
            [
                sys.executable,
                "-m",
                "daphne",
                "-b",
                "127.0.0.1",
                "-p",
                str(self.port),
                "console.asgi:application",
            ],
            "daphne",
        )
        self._wait_ready()

    def worker(self, *, worker_id: str = "browser-worker", **env: str) -> subprocess.Popen[bytes]:
        """Start ``manage.py runtime_worker`` (extra environment: e.g. RUNTIME_CRASH_AT)."""
        return self._spawn(
            [sys.executable, "manage.py", "runtime_worker", "--worker-id", worker_id],
            f"worker-{worker_id}",
            **env,
        )

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def stack(transactional_db: None) -> Iterator[Stack]:
    """The server and workers on the test database (visible both ways: transactional test)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_CRASH_AT")}
    env.update(
        STACK_ENV,
        DJANGO_SETTINGS_MODULE="console.settings",
        DATABASE_URL=subprocess_database_url(),
        REDIS_URL=REDIS_URL,
    )
    running = Stack(env)
    yield running
    running.stop()  # before the database is flushed


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        pytest.fail(
            f"{CHROMIUM} is missing: apt-get install -y chromium (never playwright install)"
        )
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, request, monkeypatch) -> Iterator[Any]:
    """A fresh 1280 px page; its screenshot is saved when the test ends (pass or fail)."""
    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between browser steps are plain synchronous calls and safe.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.js_errors = errors
    yield page
    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        page.screenshot(path=str(RESULTS / f"{request.node.name}.png"), full_page=True)
    finally:
        context.close()
    assert not errors, f"JavaScript errors: {errors}"


def off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` on another thread and return its result.

    Playwright's sync API runs an event loop in the test's thread, and the runtime's live
    fan-out (async_to_sync) refuses to run beside one; the thread's connections are closed.
    """
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connections

    def call() -> Any:
        try:
            return fn(*args, **kwargs)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(call).result()


def send_live(group: str, message: dict[str, Any]) -> None:
    """Send a message to a live group through the Redis layer the server listens on."""
    from asgiref.sync import async_to_sync
    from channels_redis.core import RedisChannelLayer

    def send() -> None:
        layer = RedisChannelLayer(hosts=[REDIS_URL])
        async_to_sync(layer.group_send)(group, message)

    off_loop(send)


@pytest.fixture
def operator_user(transactional_db: None) -> tuple[str, str]:
    from django.contrib.auth import get_user_model

    from console.management.groups import ensure_groups

    groups = ensure_groups()
    user = get_user_model().objects.create_user(username="olga", password="pw-olga-1234")
    user.groups.add(groups["operators"])
    return "olga", "pw-olga-1234"


@pytest.fixture
def sign_in(stack: Stack, operator_user: tuple[str, str]) -> Callable[[Any], None]:
    def login(page: Any, username: str | None = None, password: str | None = None) -> None:
        page.goto(stack.base_url + "/login/")
        page.fill("#id_username", username or operator_user[0])
        page.fill("#id_password", password or operator_user[1])
        page.click("button[type=submit]")
        page.wait_for_url(stack.base_url + "/")

    return login
