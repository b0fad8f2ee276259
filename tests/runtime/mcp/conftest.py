"""Fixtures of the MCP tests: the effects server's counts, its agents registered, and the
server over HTTP."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import agents
from tests.runtime.mcp.agents import SERVER
from tests.runtime.mcp.support import MCP_AGENTS, TOKEN, Effects, accepts, register_effects
from tests.runtime.support import wait_for


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any) -> Iterator[Effects]:
    """A fresh effects file, named in MCP_EFFECTS_DB for this process and its children, with
    the MCP test agents registered (the registry is rebuilt for this test's environment)."""
    yield register_effects(tmp_path, monkeypatch, settings)
    agents._registry.cache_clear()


@pytest.fixture
def mcp_env(effects: Effects) -> Callable[..., dict[str, str]]:
    """Return a function building the extra environment of a worker subprocess."""

    def build(**extra: str) -> dict[str, str]:
        return {"MCP_EFFECTS_DB": str(effects.path), "RUNTIME_AGENTS": MCP_AGENTS, **extra}

    return build


@pytest.fixture
def http_server(effects: Effects, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Return ``start(port, **env)``: the effects server over HTTP on loopback (holding the
    first application of upsert and delete, extra environment in ``env``), listening when
    returned. Every server still running at teardown is killed, by its own pid."""
    started: list[subprocess.Popen] = []

    def start(port: int, **extra: str) -> subprocess.Popen:
        env = dict(
            os.environ,
            MCP_EFFECTS_DB=str(effects.path),
            MCP_EFFECTS_HOLD="upsert,delete",
            MCP_EFFECTS_TOKEN=TOKEN,
            **extra,
        )
        with (tmp_path / f"server-{len(started)}.log").open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, str(SERVER), "http", str(port)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        started.append(process)
        wait_for(
            lambda: accepts(port) or process.poll() is not None,
            timeout=90,
            what="the HTTP server",
        )
        assert process.poll() is None, "the MCP server did not start"
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
