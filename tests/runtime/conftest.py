"""Fixtures of the runtime tests: real worker subprocesses on the test database, run factories.

Worker and command subprocesses see the test database because the tests that use them run
with ``django_db(transaction=True)``: every commit of the test process is visible to them and
theirs to it. On SQLite the test database is a file (settings: DATABASES TEST NAME); on
PostgreSQL it is the database pytest-django created.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from runtime.operations import start_run
from runtime.worker import Worker
from tests.runtime.support import wait_for
from tests.subprocesses import FAST_WORKER_ENV, subprocess_database_url

ROOT = Path(__file__).resolve().parents[2]

WORKER_ENV = FAST_WORKER_ENV


@pytest.fixture
def subprocess_env(transactional_db: None) -> Callable[..., dict[str, str]]:
    """Return a function building the environment of a manage.py subprocess on the test DB."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("RUNTIME_CRASH_AT")}
    base.update(
        WORKER_ENV,
        DJANGO_SETTINGS_MODULE="console.settings",
        DATABASE_URL=subprocess_database_url(),
    )

    def build(**extra: str | None) -> dict[str, str]:
        env = dict(base)
        for key, value in extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        return env

    return build


class Spawned:
    """A manage.py subprocess started by a test; its output goes to files readable meanwhile."""

    def __init__(self, process: subprocess.Popen[bytes], out: Path, err: Path) -> None:
        self.process = process
        self.out, self.err = out, err

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait(self, timeout: float = 60) -> tuple[int, str]:
        """Wait for the exit; return (returncode, stderr). Fails the test on a timeout."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            pytest.fail(f"pid {self.pid} did not exit within {timeout}s:\n{self.stderr}")
        return self.process.returncode, self.stderr


@pytest.fixture
def manage(
    subprocess_env: Callable[..., dict[str, str]], tmp_path: Path
) -> Iterator[Callable[..., Spawned]]:
    """Return a function starting ``manage.py <args>`` on the test database (not waited for).

    Keyword arguments are extra environment variables (None removes one). Every process still
    running at teardown is killed, by its own pid.
    """
    started: list[Spawned] = []

    def spawn(*args: str, **env: str | None) -> Spawned:
        n = len(started)
        out, err = tmp_path / f"{n}.{args[0]}.out", tmp_path / f"{n}.{args[0]}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, "manage.py", *args],
                cwd=ROOT,
                env=subprocess_env(**env),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
            )
        started.append(Spawned(process, out, err))
        return started[-1]

    yield spawn
    for item in started:
        if item.process.poll() is None:
            item.process.kill()
            item.process.wait()


@pytest.fixture
def command(manage: Callable[..., Spawned]) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Return a function running ``manage.py <args>`` to its end: a CompletedProcess."""

    def run(*args: str, timeout: float = 60, **env: str | None) -> subprocess.CompletedProcess:
        spawned = manage(*args, **env)
        code, err = spawned.wait(timeout)
        return subprocess.CompletedProcess(args, code, spawned.stdout, err)

    return run


@pytest.fixture
def spawn_worker(manage: Callable[..., Spawned]) -> Callable[..., Spawned]:
    """Return a function starting ``manage.py runtime_worker`` (``--until-idle`` by default).

    ``crash_at`` sets RUNTIME_CRASH_AT; other keywords are extra environment variables.
    """

    def spawn(
        *,
        crash_at: str | None = None,
        until_idle: bool = True,
        worker_id: str | None = None,
        max_inflight: int = 1,
        **env: str | None,
    ) -> Spawned:
        args = ["runtime_worker", "--max-inflight", str(max_inflight)]
        if until_idle:
            args.append("--until-idle")
        if worker_id:
            args += ["--worker-id", worker_id]
        return manage(*args, RUNTIME_CRASH_AT=crash_at, **env)

    return spawn


@pytest.fixture
def crashers(spawn_worker: Callable[..., Spawned]) -> Callable[..., list[Spawned]]:
    """Return ``start(n, point, **env)``: n worker processes ``crasher-0`` ... that each die
    at their first ``point`` (RUNTIME_CRASH_AT), already up and polling when it returns.

    Start the runs they are to crash on after that, and each crasher claims one of them at
    once. A crasher still starting up (seconds, on a loaded machine) could instead claim a
    run whose first crasher's 1 s lease had already expired, and another run would never be
    claimed. They are not ``--until-idle``: one that finds no run waits for one.
    """

    def start(n: int, point: str, **env: str | None) -> list[Spawned]:
        spawned = [
            spawn_worker(crash_at=point, until_idle=False, worker_id=f"crasher-{i}", **env)
            for i in range(n)
        ]
        for crasher in spawned:
            wait_for(
                partial(_started_or_gone, crasher),
                timeout=120,
                what=f"worker {crasher.pid} to start",
            )
        return spawned

    return start


@pytest.fixture
def worker(spawn_worker: Callable[..., Spawned]) -> Callable[..., tuple[int, str]]:
    """Return a function running one worker subprocess to its exit: (returncode, stderr).

    Takes the keywords of ``spawn_worker`` and ``timeout`` (seconds, default 60). A worker
    that crashes at RUNTIME_CRASH_AT exits with 137.
    """

    def run(*, timeout: float = 60, **options: Any) -> tuple[int, str]:
        return spawn_worker(**options).wait(timeout)

    return run


@pytest.fixture
def start(transactional_db: None) -> Callable[..., str]:
    """Return a function starting a demo run with the given scripted responses: its run id."""

    def run(*steps: dict[str, Any], agent: str = "demo", input: str = "go", **metadata: Any) -> str:
        return start_run(
            agent=agent, input=input, metadata={"script": {"steps": list(steps)}, **metadata}
        )

    return run


@pytest.fixture
def work_inline(transactional_db: None, settings: Any) -> Callable[..., int]:
    """Return a function that drives every runnable run in this process (the real Worker's
    claim, lease, heartbeat and loop, without a subprocess); it returns how many claims it made.
    """
    settings.RUNTIME_MODEL_BACKOFF_SECONDS = 0.01
    settings.RUNTIME_IDLE_POLL_SECONDS = 0.05

    def run(worker_id: str = "inline", limit: int = 50) -> int:
        worker = Worker(worker_id=worker_id, until_idle=True)
        for claims in range(limit):
            if not worker.step():
                return claims
        pytest.fail(f"still claiming after {limit} claims")

    return run


def _started_or_gone(worker: Spawned) -> bool:
    return "started" in worker.stderr or worker.process.poll() is not None
