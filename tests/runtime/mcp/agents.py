"""Agents of the MCP tests: the scripted model with the effects server's tools.

The effects file comes from ``MCP_EFFECTS_DB`` (set by the test for itself and its worker
subprocesses). ``mcp_stdio`` starts the server over stdio; ``mcp_http`` reaches it at
``MCP_EFFECTS_URL`` with a header read from ``MCP_EFFECTS_TOKEN``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runtime.agents import Agent
from runtime.domain.model import RecoveryPolicy
from runtime.mcp import HttpServer, StdioServer, ToolOverride

SERVER = Path(__file__).with_name("effects_server.py")

# upsert keeps its annotation-derived policy; lookup_effects is overridden to reconnect (asking
# find_effect by operation id), so the crash matrix covers all three policies.
OVERRIDES = {
    "lookup_effects": ToolOverride(policy=RecoveryPolicy.RECONNECT, lookup="find_effect"),
}


def stdio_server(**env: str) -> StdioServer:
    """The effects server as a stdio subprocess of the worker (extra ``env`` for it)."""
    return StdioServer(
        name="effects",
        command=sys.executable,
        args=(str(SERVER),),
        env={"MCP_EFFECTS_DB": os.environ.get("MCP_EFFECTS_DB", ""), **env},
        tools=OVERRIDES,
        connect_timeout=30,
    )


def mcp_stdio() -> Agent:
    return Agent(
        name="mcp_stdio",
        instructions="Use the effects tools.",
        mcp_servers=(stdio_server(MCP_EFFECTS_HOLD=os.environ.get("MCP_EFFECTS_HOLD", "")),),
    )


def mcp_http() -> Agent:
    return Agent(
        name="mcp_http",
        instructions="Use the effects tools.",
        mcp_servers=(
            HttpServer(
                name="effects",
                url=os.environ.get("MCP_EFFECTS_URL", "http://127.0.0.1:9/mcp"),
                headers_env={"X-Effects-Token": "MCP_EFFECTS_TOKEN"},
                tools=OVERRIDES,
                connect_timeout=20,
                call_timeout=60,
            ),
        ),
    )
