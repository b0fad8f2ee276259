"""A real MCP server for the tests, written with the SDK's server side (MCPServer).

Every tool application is counted by operation id (the ``io.durable-runtime/operation_id`` key
of the request's ``_meta``) in a SQLite file named by ``MCP_EFFECTS_DB``, so "applied twice" is
countable from the test process. Tools: ``lookup_effects`` (read-only), ``upsert`` (idempotent),
``delete`` (destructive), ``fail`` (answers an error result), ``find_effect`` (read-only: what
a reconnect lookup asks), ``mixed`` (text, image and structured content in one result).

``MCP_EFFECTS_HOLD`` (comma-separated tool names) makes the first application of those tools
hang after its effect is recorded, so that a test can kill the server mid-call;
``MCP_EFFECTS_CHANGED`` makes ``upsert`` say it is destructive; ``MCP_EFFECTS_LOOKUP_FAILS``
makes ``find_effect`` unable to answer (``error``: an error result; ``exit``: the server dies
in it); over HTTP, ``MCP_EFFECTS_TOKEN`` is the ``X-Effects-Token`` header every request must
carry. ``MCP_EFFECTS_EXIT`` (tool names) makes the server die in the first application of those
tools, after its effect; ``MCP_EFFECTS_IGNORE_TERM`` makes it ignore SIGTERM;
``MCP_EFFECTS_PIDS`` names a file the server appends its pid to when it starts.

Run: ``python tests/runtime/mcp/effects_server.py [stdio | http PORT]``.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import time
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ImageContent, TextContent, ToolAnnotations

OPERATION_KEY = "io.durable-runtime/operation_id"

server = MCPServer("effects", version="1.0")


def _db() -> sqlite3.Connection:
    db = sqlite3.connect(os.environ["MCP_EFFECTS_DB"], timeout=30, isolation_level=None)
    db.execute(
        "create table if not exists effects (operation_id text primary key, tool text, "
        "key text, applied integer)"
    )
    return db


def _operation_id(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    operation_id = meta.get(OPERATION_KEY)
    if not operation_id:
        raise ToolError(f"no {OPERATION_KEY} in the request's _meta")
    return str(operation_id)


def _check_token(ctx: Context) -> None:
    """Over HTTP with MCP_EFFECTS_TOKEN set, refuse requests without that X-Effects-Token."""
    token = os.environ.get("MCP_EFFECTS_TOKEN")
    if ctx.headers is not None and token and ctx.headers.get("x-effects-token") != token:
        raise ToolError("missing or wrong X-Effects-Token header")


def _apply(ctx: Context, tool: str, key: str) -> dict[str, Any]:
    """Record the application once per operation id; count every repeat."""
    _check_token(ctx)
    operation_id = _operation_id(ctx)
    with _db() as db:
        db.execute(
            "insert into effects values (?, ?, ?, 1) on conflict (operation_id) "
            "do update set applied = applied + 1",
            (operation_id, tool, key),
        )
        (applied,) = db.execute(
            "select applied from effects where operation_id = ?", (operation_id,)
        ).fetchone()
    if tool in os.environ.get("MCP_EFFECTS_EXIT", "").split(",") and applied == 1:
        os._exit(3)  # the server dies after the effect, without answering
    held = os.environ.get("MCP_EFFECTS_HOLD", "").split(",")
    if tool in held and applied == 1:
        while True:  # the test kills this server now
            time.sleep(1)
    return {"recorded": key, "operation_id": operation_id}


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def lookup_effects(key: str, ctx: Context) -> dict[str, Any]:
    """Read how many effects were recorded under a key."""
    applied = _apply(ctx, "lookup_effects", key)
    with _db() as db:
        (count,) = db.execute("select count(*) from effects where key = ?", (key,)).fetchone()
    return {"key": key, "effects": count, "operation_id": applied["operation_id"]}


# MCP_EFFECTS_CHANGED: the server's next version says upsert is destructive (a fresh listing
# would derive "indeterminate, ask" for it).
UPSERT_HINTS = (
    ToolAnnotations(destructive_hint=True)
    if os.environ.get("MCP_EFFECTS_CHANGED")
    else ToolAnnotations(idempotent_hint=True, destructive_hint=False)
)


@server.tool(annotations=UPSERT_HINTS)
def upsert(key: str, ctx: Context) -> dict[str, Any]:
    """Record a key; idempotent by operation id."""
    return _apply(ctx, "upsert", key)


@server.tool(annotations=ToolAnnotations(destructive_hint=True))
def delete(key: str, ctx: Context) -> dict[str, Any]:
    """Delete a key (destructive: never retried blindly)."""
    return _apply(ctx, "delete", key)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def fail(key: str, ctx: Context) -> str:
    """Always answers an error result."""
    _apply(ctx, "fail", key)
    raise ToolError(f"cannot do {key}")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def find_effect(operation_id: str) -> dict[str, Any] | None:
    """The effect recorded under an operation id, or null when there is none."""
    failure = os.environ.get("MCP_EFFECTS_LOOKUP_FAILS")
    if failure == "exit":
        os._exit(3)  # the server dies while it is asked
    if failure:
        raise ToolError("the effect store is unreachable")
    with _db() as db:
        row = db.execute(
            "select tool, key from effects where operation_id = ?", (operation_id,)
        ).fetchone()
    return {"recorded": row[1], "operation_id": operation_id} if row else None


@server.tool()
def mixed(key: str) -> list[TextContent | ImageContent]:
    """Answers text and an image (no annotations)."""
    return [
        TextContent(type="text", text=f"about {key}"),
        ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
    ]


if __name__ == "__main__":
    if os.environ.get("MCP_EFFECTS_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if pids := os.environ.get("MCP_EFFECTS_PIDS"):
        with open(pids, "a") as out:
            out.write(f"{os.getpid()}\n")
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
