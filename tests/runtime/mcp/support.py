"""What the MCP tests share: the effects server's counts and the test agents' dotted paths."""

from __future__ import annotations

import socket
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

MCP_AGENTS = ",".join(
    ["runtime.demo.agent.demo"]
    + [f"tests.runtime.mcp.agents.{name}" for name in ("mcp_stdio", "mcp_gated", "mcp_http")]
)


TOKEN = "s3cret-token"  # the X-Effects-Token the HTTP effects server asks for


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accepts(port: int) -> bool:
    """Whether something listens on ``port`` of loopback."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
    except OSError:
        return False
    return True


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


def register_effects(tmp_path: Path, monkeypatch: Any, settings: Any) -> Effects:
    """Name a fresh effects file in MCP_EFFECTS_DB and register the MCP test agents, for this
    process (settings, rebuilt registry) and the subprocesses started after it (environment).
    """
    from runtime import agents

    path = tmp_path / "effects.sqlite3"
    monkeypatch.setenv("MCP_EFFECTS_DB", str(path))
    monkeypatch.setenv("RUNTIME_AGENTS", MCP_AGENTS)
    settings.RUNTIME_AGENTS = MCP_AGENTS.split(",")
    agents._registry.cache_clear()
    return Effects(path)
