"""MCP tools as ordinary ``Tool`` values, and the claim-long attachment of an agent's servers.

The tool source of kind "mcp" (``SOURCE``, registered with ``runtime.sources`` on import): at
a claim, ``attached(definitions)`` opens a session to each of the agent's servers, lists their
tools and offers them beside the agent's own, named ``<server>__<tool>``. Each
offered tool carries its ``source``: server identity (name, transport, target, the server's
own name and version), the tool's input schema and annotations, and the lookup tool, which
the loop pins into every call together with the derived policy (``runtime.mcp.policy``).

A call is executed, looked up and recovered from what it pinned (``pinned_tool``), never from
what the server lists now: a server that changed a tool between a crash and the recovery
does not change what recovery does, and a server whose identity changed is not called.

The operation id travels in the request's ``_meta`` as ``io.durable-runtime/operation_id``
(with the attempt number as ``io.durable-runtime/attempt``), so a server can deduplicate.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from runtime import extras, sources
from runtime.domain.model import ToolCall
from runtime.errors import McpServerUnavailable
from runtime.mcp import OPERATION_ID_META_KEY
from runtime.mcp.config import ServerConfig
from runtime.mcp.policy import derive
from runtime.mcp.results import looked_up, result_text
from runtime.mcp.sessions import Connection, ConnectionLost, Listing, McpSessions
from runtime.tools import Tool, ToolArgumentsError, ToolContext, ToolError
from runtime.untrusted import UntrustedJSONError, answer_problem, parse_object

if TYPE_CHECKING:
    from runtime.agents import Agent

log = logging.getLogger("runtime.mcp")

ATTEMPT_META_KEY = "io.durable-runtime/attempt"

# JSON-RPC errors that prove the server refused the request without running the tool (parse
# error, invalid request, method not found, invalid params): the model is told. Any other error
# (internal error, timeout, closed connection) leaves the outcome unclassified.
REFUSALS = frozenset({-32700, -32600, -32601, -32602})


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("an MCP tool runs through its server, never a Python function")


@dataclass(frozen=True)
class McpTool(Tool):
    """A tool of an MCP server: ``source`` holds what the call pins (see the module)."""

    connection: Connection | None = None
    unavailable: str = ""  # why ``connection`` is None, for the failure the policy classifies

    @property
    def parameters(self) -> dict[str, Any]:
        return dict(self.source["input_schema"])

    def parse(self, arguments_text: str) -> dict[str, Any]:
        """Parse the model's arguments and check them against the pinned input schema."""
        try:
            arguments = parse_object(arguments_text)
        except UntrustedJSONError as exc:
            raise ToolArgumentsError(str(exc)) from exc
        problem = answer_problem(arguments, self.parameters)
        if problem is not None:
            message, path = problem
            where = ".".join(map(str, path)) or "(root)"
            raise ToolArgumentsError(f"invalid arguments for {self.name}: {where}: {message}")
        return arguments

    @property
    def is_async(self) -> bool:
        return True  # the session lives on the driver's event loop

    async def arun(self, ctx: ToolContext, arguments: dict[str, Any]) -> str:
        """Call the tool on its server; return its result text.

        Raises ToolError for an ``isError`` result or a refused request (the model sees it),
        ConnectionLost or McpServerUnavailable when the outcome is unknown (the pinned policy
        decides).
        """
        result = await self._call(self.source["tool"], arguments, ctx)
        text = result_text(result)
        if result.is_error:
            raise ToolError(text)
        return text

    async def lookup_operation(self, ctx: ToolContext) -> str | None:
        """Ask the pinned lookup tool about ``ctx.operation_id``; None: never seen."""
        result = await self._call(self.source["lookup"], {"operation_id": ctx.operation_id}, ctx)
        return looked_up(result)

    async def _call(self, tool: str, arguments: dict[str, Any], ctx: ToolContext) -> Any:
        from mcp import MCPError

        if self.connection is None:
            raise ConnectionLost(self.unavailable or "the server is not connected")
        meta = {OPERATION_ID_META_KEY: ctx.operation_id, ATTEMPT_META_KEY: ctx.attempt}
        timeout = self.connection.config.call_timeout + 5  # the SDK's own timeout fires first

        async def call(client: Any) -> Any:
            return await client.call_tool(tool, arguments, meta=meta)

        try:
            return await self.connection.request(call, timeout)
        except MCPError as exc:
            if exc.code in REFUSALS:
                raise ToolError(f"the MCP server refused the call: {exc}") from exc
            raise


def exposed_name(server: str, tool: str) -> str:
    """The name the model sees: ``<server>__<tool>``, limited to [A-Za-z0-9_-]{1,64}."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{tool}")[:64]


def offered_tools(connection: Connection, listing: Listing) -> tuple[McpTool, ...]:
    """The server's listed tools as McpTools with their derived, overridden policies."""
    config = connection.config
    listed = {tool.name for tool in listing.tools}
    for name in set(config.tools) - listed:
        log.warning("MCP server %s lists no tool %r (named in its overrides)", config.name, name)
    return tuple(_offered(connection, listing, tool) for tool in listing.tools)


def _offered(connection: Connection, listing: Listing, tool: Any) -> McpTool:
    config = connection.config
    pinned = derive(tool.annotations, config.tools.get(tool.name))
    annotations = (
        tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
        if tool.annotations
        else None
    )
    source = {
        "kind": "mcp",
        "server": config.name,
        "tool": tool.name,
        "transport": config.transport,
        "target": config.target,
        "server_info": listing.server_info,
        "input_schema": tool.input_schema,
        "annotations": annotations,
        "lookup": pinned.lookup,
    }
    return _tool(
        exposed_name(config.name, tool.name),
        tool.description or "",
        source,
        connection,
        policy=pinned.policy,
        permission=pinned.permission,
        max_attempts=pinned.max_attempts,
        effects=pinned.effects,
    )


def _tool(
    name: str, description: str, source: dict[str, Any], connection: Any, **pins: Any
) -> McpTool:
    tool = McpTool(
        name=name,
        description=description,
        fn=_never,
        arguments_model=None,
        source=source,
        connection=connection,
        **pins,
    )
    if source.get("lookup"):
        tool = replace(tool, lookup=tool.lookup_operation)
    return tool


def pinned_tool(call: ToolCall, connection: Connection | None) -> McpTool:
    """The tool that executes, looks up and recovers ``call``, from what the call pinned.

    ``connection`` is the claim's session to the server of that name (None when the agent no
    longer has it); it is used only while its transport and target are still the pinned ones.
    """
    source = call.source
    reason = ""
    if connection is None:
        reason = f"the agent has no MCP server {source['server']!r} any more"
    elif (connection.config.transport, connection.config.target) != (
        source["transport"],
        source["target"],
    ):
        reason = f"MCP server {source['server']!r} is no longer {source['target']}"
        connection = None
    tool = _tool(
        call.name,
        "",
        dict(source),
        connection,
        policy=call.policy,
        permission=call.permission,
        max_attempts=call.max_attempts,
        effects=call.effects,
    )
    return replace(tool, unavailable=reason)


@asynccontextmanager
async def attached(
    servers: Sequence[ServerConfig],
) -> AsyncIterator[tuple[tuple[McpTool, ...], Mapping[str, Connection]]]:
    """Open ``servers`` for a claim; yield their tools and the open connections by name.

    Raises McpServerUnavailable (before yielding) when a server cannot be started or reached
    within its ``connect_timeout``. Every session is closed, and every stdio server stopped,
    when the block ends.
    """
    sessions = McpSessions(tuple(servers))
    try:
        offered: list[McpTool] = []
        for connection in sessions.connections.values():
            offered.extend(offered_tools(connection, await connection.open()))
        yield tuple(offered), MappingProxyType(dict(sessions.connections))
    finally:
        await sessions.close()


class McpSource:
    """MCP servers as a tool source (``runtime.sources.ToolSource``); the claim's state is
    the open connections by server name."""

    kind = "mcp"
    extra = "mcp"  # the package extra the SDK comes with (runtime.extras)

    def attach(
        self, agent: Agent, definitions: Sequence[ServerConfig]
    ) -> AbstractAsyncContextManager[tuple[tuple[McpTool, ...], Mapping[str, Connection]]]:
        """Raises McpServerUnavailable naming the extra when the SDK is not installed."""
        if extras.missing(self.extra):
            raise McpServerUnavailable(
                f"agent {agent.name!r} names MCP servers: {extras.hint(self.extra)}"
            )
        return attached(definitions)

    def pinned_tool(self, call: ToolCall, state: Mapping[str, Connection] | None) -> McpTool:
        return pinned_tool(call, (state or {}).get(call.source["server"]))


SOURCE = sources.register(McpSource())
