"""Fixtures of the MCP tests: the effects server's counts, and its agents registered."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import agents
from tests.runtime.mcp.support import MCP_AGENTS, Effects, register_effects


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
