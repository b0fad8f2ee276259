"""Tool sources: where an agent's tools come from besides its own Python tools (MCP servers
today, ``runtime.mcp``), so that ``Agent`` and the loop name no source.

An agent lists source definitions in ``Agent.sources`` (e.g. ``runtime.mcp.StdioServer``);
each definition's ``source_kind`` names the ``ToolSource`` that serves it. A source registers
itself when its module is imported (``register``), and is otherwise found by kind in the
``RUNTIME_TOOL_SOURCES`` setting, the ``durable_agent_runtime.tool_sources`` entry points or
the built-in defaults (``runtime.plugins``): a call pinned by a source the agent no longer
lists is still recovered by it.

Every tool a source offers pins ``{"kind": <source kind>, ...}`` into its calls
(``Tool.source``); Python tools pin ``{"kind": "python"}``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from runtime import plugins

if TYPE_CHECKING:
    from runtime.agents import Agent
    from runtime.domain.model import ToolCall
    from runtime.tools import Tool

SETTING = "RUNTIME_TOOL_SOURCES"
ENTRY_POINTS = "durable_agent_runtime.tool_sources"
BUILT_IN = {"mcp": "runtime.mcp.tools.SOURCE"}
PYTHON = "python"  # the kind of an agent's own tools, served by the agent itself


class ToolSource(Protocol):
    """A source of tools.

    ``attach(agent, definitions)`` opens what the agent's ``definitions`` of this kind need
    for one claim and yields ``(tools, state)``: the tools offered beside the agent's own, and
    the claim's state that ``pinned_tool`` is given (closed when the block ends). It raises a
    RuntimeFault (which fails the run's step) when a definition cannot be served.
    ``pinned_tool(call, state)`` is the tool that executes, looks up and recovers ``call``
    from what the call pinned; ``state`` is None when the agent no longer lists the source.
    """

    kind: str

    def attach(
        self, agent: Agent, definitions: Sequence[Any]
    ) -> AbstractAsyncContextManager[tuple[Sequence[Tool], Any]]: ...

    def pinned_tool(self, call: ToolCall, state: Any) -> Tool: ...


_registered: dict[str, ToolSource] = {}


def register(source: ToolSource) -> ToolSource:
    """Make ``source`` serve its ``kind`` in this process (the last registration wins)."""
    _registered[source.kind] = source
    return source


def get(kind: str) -> ToolSource:
    """The source of ``kind``: registered, else loaded by kind (``runtime.plugins``); raises
    ImproperlyConfigured naming RUNTIME_TOOL_SOURCES when there is none."""
    if kind not in _registered:
        register(plugins.load(SETTING, ENTRY_POINTS, BUILT_IN, kind))
    return _registered[kind]


@asynccontextmanager
async def attached(agent: Agent) -> AsyncIterator[Agent]:
    """Attach every source the agent lists for one claim; yield the agent with their tools
    beside its own and their states in ``Agent.attached``. Whatever a source opened is
    closed when the block ends; a source's RuntimeFault propagates before the yield."""
    if not agent.sources:
        yield agent
        return
    by_kind: dict[str, list[Any]] = defaultdict(list)
    for definition in agent.sources:
        by_kind[definition.source_kind].append(definition)
    async with AsyncExitStack() as stack:
        tools: list[Tool] = []
        states: dict[str, Any] = {}
        for kind, definitions in by_kind.items():
            offered, states[kind] = await stack.enter_async_context(
                get(kind).attach(agent, definitions)
            )
            tools.extend(offered)
        yield replace(agent, tools=agent.tools + tuple(tools), attached=MappingProxyType(states))


def pinned_tool(agent: Agent, call: ToolCall) -> Tool | None:
    """The tool that executes ``call``: the agent's own of its name for a Python call, else
    the one its source rebuilds from what the call pinned (None: no such own tool)."""
    kind = call.source.get("kind", PYTHON)
    if kind == PYTHON:
        return agent.tool(call.name)
    return get(kind).pinned_tool(call, agent.attached.get(kind))
