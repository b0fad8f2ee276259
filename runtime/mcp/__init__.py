"""Tools from MCP servers (the official ``mcp`` SDK, the ``mcp`` extra), with recovery
policies pinned per call.

An agent names its servers in ``Agent.sources`` (``StdioServer``, ``HttpServer``, with per-tool
``ToolOverride``); ``runtime.mcp.tools`` is the tool source of kind "mcp" (``runtime.sources``):
it lists their tools at each claim and executes calls from what each call pinned;
``runtime.mcp.policy`` derives a tool's default policy from its annotations.

Definitions import without the SDK; the SDK is imported when a server is first attached.
"""

from runtime.mcp.config import HttpServer, StdioServer, ToolOverride, parse_servers

OPERATION_ID_META_KEY = "io.durable-runtime/operation_id"

__all__ = ["OPERATION_ID_META_KEY", "HttpServer", "StdioServer", "ToolOverride", "parse_servers"]
