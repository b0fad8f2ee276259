"""Agents of the MCP tests: the scripted model with the effects server's tools.

The effects file comes from ``MCP_EFFECTS_DB`` (set by the test for itself and its worker
subprocesses). ``mcp_stdio`` starts the server over stdio; ``mcp_gated`` too, keeping the
approvals its annotations ask for; ``mcp_http`` reaches it at ``MCP_EFFECTS_URL`` with a header
read from ``MCP_EFFECTS_TOKEN``. ``MCP_EFFECTS_CALL_TIMEOUT`` (seconds) replaces the servers'
``call_timeout``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from runtime.agents import Agent
from runtime.domain.model import Effects, Permission, RecoveryPolicy
from runtime.mcp import HttpServer, StdioServer, ToolOverride

SERVER = Path(__file__).with_name("effects_server.py")

# upsert keeps its annotation-derived policy; lookup_effects is overridden to reconnect (asking
# find_effect by operation id), so the crash matrix covers all three policies. Its annotation
# says read-only, but it records an effect (that is what the tests count): its effects are
# declared "once", so an unclassified call is one to reconcile.
OVERRIDES = {
    "lookup_effects": ToolOverride(
        policy=RecoveryPolicy.RECONNECT, lookup="find_effect", effects=Effects.ONCE
    ),
}


def stdio_server() -> StdioServer:
    """The effects server as a stdio subprocess of the worker, with the worker's MCP_EFFECTS_*
    variables."""
    return StdioServer(
        name="effects",
        command=sys.executable,
        args=(str(SERVER),),
        env={k: v for k, v in os.environ.items() if k.startswith("MCP_EFFECTS_")},
        tools=OVERRIDES,
        connect_timeout=30,
        call_timeout=float(os.environ.get("MCP_EFFECTS_CALL_TIMEOUT", 300)),
    )


def mcp_stdio() -> Agent:
    """Every effects tool allowed (delete keeps its derived indeterminate policy)."""
    return Agent(
        name="mcp_stdio",
        instructions="Use the effects tools.",
        sources=(stdio_server(),),
        permissions={"effects__delete": Permission.ALLOW},
    )


def mcp_gated() -> Agent:
    """The effects tools as their annotations say: delete and mixed ask an operator first."""
    return Agent(name="mcp_gated", instructions="Use the effects tools.", sources=(stdio_server(),))


def mcp_http() -> Agent:
    return Agent(
        name="mcp_http",
        instructions="Use the effects tools.",
        sources=(
            HttpServer(
                name="effects",
                url=os.environ.get("MCP_EFFECTS_URL", "http://127.0.0.1:9/mcp"),
                headers_env={"X-Effects-Token": "MCP_EFFECTS_TOKEN"},
                tools=OVERRIDES,
                connect_timeout=90,  # a restarted server may be slow on a loaded machine
                call_timeout=float(os.environ.get("MCP_EFFECTS_CALL_TIMEOUT", 60)),
            ),
        ),
    )
