"""Fixtures of the MCP tests: the effects server's counts, and its agents registered."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from runtime import agents

MCP_AGENTS = ",".join(
    ["runtime.demo.agent.demo"]
    + [f"tests.runtime.mcp.agents.{name}" for name in ("mcp_stdio", "mcp_gated", "mcp_http")]
)


class Effects:
    """The effects server's SQLite file, read from the test: applications by operation id."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def rows(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        with closing(sqlite3.connect(self.path, timeout=30)) as db:
            try:
                found = db.execute(
                    "select operation_id, tool, key, applied from effects"
                ).fetchall()
            except sqlite3.OperationalError:  # the server has not created its table yet
                return {}
        return {op: {"tool": tool, "key": key, "applied": n} for op, tool, key, n in found}

    def applied(self, operation_id: str) -> int:
        return self.rows().get(operation_id, {}).get("applied", 0)


@pytest.fixture
def effects(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any) -> Effects:
    """A fresh effects file, named in MCP_EFFECTS_DB for this process and its children, with
    the MCP test agents registered (the registry is rebuilt for this test's environment)."""
    path = tmp_path / "effects.sqlite3"
    monkeypatch.setenv("MCP_EFFECTS_DB", str(path))
    monkeypatch.setenv("RUNTIME_AGENTS", MCP_AGENTS)
    settings.RUNTIME_AGENTS = MCP_AGENTS.split(",")
    agents._registry.cache_clear()
    yield Effects(path)
    agents._registry.cache_clear()


@pytest.fixture
def mcp_env(effects: Effects) -> Callable[..., dict[str, str]]:
    """Return a function building the extra environment of a worker subprocess."""

    def build(**extra: str) -> dict[str, str]:
        return {"MCP_EFFECTS_DB": str(effects.path), "RUNTIME_AGENTS": MCP_AGENTS, **extra}

    return build
