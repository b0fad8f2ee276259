"""Tools from MCP servers (the official ``mcp`` SDK), with recovery policies pinned per call.

An agent names its servers (``StdioServer``, ``HttpServer``, with per-tool ``ToolOverride``);
``runtime.mcp.tools`` lists their tools at each claim and executes calls from what each call
pinned; ``runtime.mcp.policy`` derives a tool's default policy from its annotations.
"""

from runtime.mcp.config import HttpServer, StdioServer, ToolOverride, parse_servers
from runtime.mcp.tools import OPERATION_ID_META_KEY

__all__ = ["OPERATION_ID_META_KEY", "HttpServer", "StdioServer", "ToolOverride", "parse_servers"]
