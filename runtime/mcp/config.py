"""How an agent names its MCP servers: a stdio command or a streamable HTTP URL, plus per-tool
overrides of the policy that the tool's annotations suggest.

Definitions are plain values, written in Python (``Agent(sources=(...))``) or read from
JSON (``RUNTIME_MCP_SERVERS`` for the ``assistant`` agent, see ``parse_servers``). Secrets never
sit in a definition: HTTP headers name environment variables, read when the worker connects.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
)

from runtime.domain.model import Effects, Permission, RecoveryPolicy
from runtime.errors import McpServerUnavailable

# Server names become part of the tool names offered to the model ("<server>__<tool>"), which
# OpenAI-compatible APIs restrict to [A-Za-z0-9_-].
NAME_PATTERN = r"^[A-Za-z0-9_-]{1,32}$"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolOverride:
    """The operator's word on one MCP tool, over what its annotations suggest.

    ``policy``/``permission``/``max_attempts`` replace the derived values when set; ``lookup``
    names a read-only tool of the same server that recovery calls with ``{"operation_id": ...}``
    (policy ``reconnect``): a result without content, or with structured content ``null`` or
    ``{"result": null}``, means the server never saw the operation. ``effects`` replaces the
    Effects the annotations declare (``none`` for a tool that changes nothing outside).
    """

    policy: RecoveryPolicy | None = None
    permission: Permission | None = None
    max_attempts: int | None = None
    lookup: str | None = None
    effects: Effects | None = None

    def __post_init__(self) -> None:
        if self.policy is RecoveryPolicy.RECONNECT and not self.lookup:
            raise ValueError("a reconnect policy needs the lookup tool that recovery asks")


@dataclass(frozen=True, slots=True, kw_only=True)
class StdioServer:
    """An MCP server the worker starts as a subprocess and talks to over stdin/stdout.

    ``env`` is added to a minimal default environment (the SDK's); ``connect_timeout`` and
    ``call_timeout`` are in seconds.
    """

    name: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    tools: Mapping[str, ToolOverride] = field(default_factory=dict)
    connect_timeout: float = 15.0
    call_timeout: float = 300.0

    @property
    def source_kind(self) -> str:
        """The tool source that serves this definition (``runtime.sources``)."""
        return "mcp"

    @property
    def transport(self) -> str:
        return "stdio"

    @property
    def target(self) -> str:
        """What identifies the server to an operator: the command line (no environment)."""
        return shlex.join((self.command, *self.args))


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpServer:
    """An MCP server reached over streamable HTTP at ``url``.

    ``headers_env`` maps a header name to the environment variable holding its value (e.g.
    ``{"Authorization": "TICKETS_AUTHORIZATION"}``), read at each connection.
    """

    name: str
    url: str
    headers_env: Mapping[str, str] = field(default_factory=dict)
    tools: Mapping[str, ToolOverride] = field(default_factory=dict)
    connect_timeout: float = 15.0
    call_timeout: float = 300.0

    @property
    def source_kind(self) -> str:
        """The tool source that serves this definition (``runtime.sources``)."""
        return "mcp"

    @property
    def transport(self) -> str:
        return "http"

    @property
    def target(self) -> str:
        """The URL without any user:password part (the target is pinned into the log)."""
        parts = urlsplit(self.url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit(parts._replace(netloc=host))

    def headers(self) -> dict[str, str]:
        """The headers' values from the environment; raise McpServerUnavailable when unset."""
        missing = [var for var in self.headers_env.values() if var not in os.environ]
        if missing:
            raise McpServerUnavailable(
                f"MCP server {self.name!r}: environment variable(s) {', '.join(missing)} unset",
                server=self.name,
            )
        return {header: os.environ[var] for header, var in self.headers_env.items()}


ServerConfig = StdioServer | HttpServer


class _Override(BaseModel):
    model_config = ConfigDict(extra="forbid")
    policy: RecoveryPolicy | None = None
    permission: Permission | None = None
    max_attempts: int | None = Field(default=None, ge=1, le=20)
    lookup: str | None = None
    effects: Effects | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=NAME_PATTERN)
    tools: dict[str, _Override] = {}
    connect_timeout: float = Field(default=15.0, gt=0)
    call_timeout: float = Field(default=300.0, gt=0)


class _Stdio(_Common):
    command: str = Field(min_length=1)
    args: list[str] = []
    env: dict[str, str] = {}
    cwd: str | None = None


class _Http(_Common):
    url: str = Field(pattern=r"^https?://")
    headers_env: dict[str, str] = {}


def _kind(item: Any) -> str:
    return "http" if isinstance(item, dict) and "url" in item else "stdio"


# An object with a "url" is an HTTP server, any other a stdio one (so errors name its fields).
_SERVERS = TypeAdapter(
    list[
        Annotated[
            Annotated[_Stdio, Tag("stdio")] | Annotated[_Http, Tag("http")], Discriminator(_kind)
        ]
    ]
)


def parse_servers(data: Any) -> tuple[ServerConfig, ...]:
    """Build server definitions from JSON data: a list of objects, each either
    ``{"name", "command", "args"?, "env"?, "cwd"?}`` or ``{"name", "url", "headers_env"?}``,
    with optional ``"tools": {tool: {"policy"?, "permission"?, "max_attempts"?, "lookup"?,
    "effects"?}}``,
    ``"connect_timeout"`` and ``"call_timeout"`` (seconds).

    Raises ValueError naming the first problem (the settings turn it into
    ImproperlyConfigured); duplicate names are refused.
    """
    try:
        items = _SERVERS.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "(root)"
        raise ValueError(f"MCP servers: {where}: {first['msg']}") from None
    names = [item.name for item in items]
    if len(set(names)) != len(names):
        raise ValueError(f"MCP servers: duplicate names in {names}")
    return tuple(_build(item) for item in items)


def _override(name: str, item: _Override) -> ToolOverride:
    try:
        return ToolOverride(**item.model_dump())
    except ValueError as exc:
        raise ValueError(f"MCP servers: tool {name!r}: {exc}") from None


def _build(item: _Stdio | _Http) -> ServerConfig:
    common: dict[str, Any] = {
        "name": item.name,
        "tools": {k: _override(k, v) for k, v in item.tools.items()},
        "connect_timeout": item.connect_timeout,
        "call_timeout": item.call_timeout,
    }
    if isinstance(item, _Stdio):
        return StdioServer(
            command=item.command, args=tuple(item.args), env=item.env, cwd=item.cwd, **common
        )
    return HttpServer(url=item.url, headers_env=item.headers_env, **common)
