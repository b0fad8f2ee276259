"""Client sessions to an agent's MCP servers for the length of one claim.

The SDK is asyncio-based, like the worker's drivers: every session lives on the driver's own
event loop. Each server's session is held open by one task that also runs that server's
requests, one at a time, inside the session's scope: when the transport dies (a stdio server
exits, an HTTP server drops the connection) the request in flight fails at once
(ConnectionLost, or the SDK's "Connection closed" error) instead of waiting for its timeout,
and the session ends. A later request reconnects.

``McpSessions.close()`` ends every session through the anyio cancel scope its task holds the
session in, never by cancelling the task itself: the SDK shuts a stdio server down inside a
shielded scope with bounded waits (stdin closed, ``PROCESS_TERMINATION_TIMEOUT`` for it to
exit, SIGTERM to its process group, ``FORCE_KILL_TIMEOUT`` later SIGKILL), and only anyio's
cancellation respects that shield. A native ``Task.cancel()`` breaks out of it half way and
leaves the task waiting forever for the stdout of a server that nobody stops (issue 35). An
HTTP session's requests are cancelled the same way. ``close()`` waits for that at most
``CLOSE_SECONDS``; the stdio servers a process still has when it must leave at once are
killed with their process groups (``runtime.mcp.processes``). Nothing outlives the claim.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import anyio

from runtime.errors import McpServerUnavailable
from runtime.mcp.config import HttpServer, ServerConfig, StdioServer

log = logging.getLogger("runtime.mcp")

CONNECT_RETRY_SECONDS = 0.2  # pause between connection attempts while connect_timeout lasts
# How long close() waits for the sessions to end: the SDK's own bounded stdio shutdown (0.5 s
# flush, 2 s grace after stdin closes, 2 s after SIGTERM, 2 s to see the SIGKILL) plus margin.
CLOSE_SECONDS = 10.0


class ConnectionLost(Exception):
    """The server's connection ended, or could not be opened, while a request needed it."""


@dataclass(frozen=True, slots=True)
class Listing:
    """What a server said when its session opened: its identity and its tools."""

    server_info: dict[str, Any]
    tools: tuple[Any, ...]  # mcp.types.Tool


Job = Callable[[Any], Awaitable[Any]]


class Connection:
    """One server's session during a claim: open it, run requests on it, reconnect after it
    died. Requests are run in order."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.lock = asyncio.Lock()
        self.jobs: Any = None  # the holder's job stream while the session is open
        self.holder: asyncio.Task[None] | None = None
        # Every holder still running: one whose session broke may still be shutting its
        # transport down while the next one holds the new session.
        self.holders: set[asyncio.Task[None]] = set()
        self.scope: anyio.CancelScope | None = None  # the holder's, while it holds a session

    def stop(self) -> None:
        """End the session (its requests fail with ConnectionLost) without waiting; the holder
        task shuts its transport down by itself, within the SDK's bounds."""
        if self.scope is not None:
            self.scope.cancel()
        elif self.holder is not None and not self.holder.done():
            self.holder.cancel()  # not started yet: nothing to shut down

    async def open(self) -> Listing:
        """Connect, retrying until ``connect_timeout``; return the listing.

        Raises McpServerUnavailable when no session could be opened in that time.
        """
        deadline = time.monotonic() + self.config.connect_timeout
        while True:
            try:
                return await self._open_once(deadline)
            except (ConnectionLost, OSError) as exc:
                if time.monotonic() + CONNECT_RETRY_SECONDS >= deadline:
                    raise McpServerUnavailable(
                        f"MCP server {self.config.name!r} ({self.config.target}) "
                        f"could not be reached: {exc}",
                        server=self.config.name,
                    ) from exc
                await asyncio.sleep(CONNECT_RETRY_SECONDS)

    async def _open_once(self, deadline: float) -> Listing:
        ready: asyncio.Future[Listing] = asyncio.get_running_loop().create_future()
        self.holder = asyncio.ensure_future(self._hold(ready))
        self.holders.add(self.holder)
        self.holder.add_done_callback(self.holders.discard)
        try:
            return await asyncio.wait_for(
                asyncio.shield(ready), max(0.1, deadline - time.monotonic())
            )
        except TimeoutError:
            self.stop()
            raise ConnectionLost("no answer before the connect timeout") from None

    async def request(self, job: Job, timeout: float) -> Any:
        """Run ``job(client)`` on the session (reconnecting first if it died); return its
        value. Raises ConnectionLost when the session ends meanwhile, McpServerUnavailable
        when it cannot be reopened, and whatever the job raises."""
        answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        async with self.lock:
            if self.jobs is None:
                await self.open()
            try:
                if self.jobs is None:
                    raise anyio.ClosedResourceError
                self.jobs.send_nowait((job, answer))
            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                raise ConnectionLost("the session ended before the request was sent") from None
        try:
            return await asyncio.wait_for(asyncio.shield(answer), timeout)
        except TimeoutError:
            raise ConnectionLost(f"no answer within {timeout:g}s") from None

    async def _hold(self, ready: asyncio.Future[Listing]) -> None:
        send, receive = anyio.create_memory_object_stream[tuple[Job, asyncio.Future[Any]]](math.inf)
        with anyio.CancelScope() as scope:  # stop() cancels it: the SDK's shield holds
            self.scope = scope
            await self._session(ready, send, receive)
        if self.scope is scope:
            self.scope = None

    async def _session(self, ready: asyncio.Future[Listing], send: Any, receive: Any) -> None:
        current: asyncio.Future[Any] | None = None
        try:
            async with AsyncExitStack() as stack:
                client = await stack.enter_async_context(await self._client(stack))
                listing = await _listing(client)
                self.jobs = send
                _settle(ready, result=listing)
                async for job, answer in receive:
                    current = answer
                    try:
                        _settle(answer, result=await job(client))
                    except Exception as exc:  # the server's answer, or a broken transport
                        if _breaks_session(exc):
                            self.jobs = None  # before the caller hears: it may retry at once
                            _settle(answer, error=exc)
                            break  # the next request starts a new session
                        _settle(answer, error=exc)
                    current = None
        except BaseException as exc:
            self.jobs = None  # before the caller hears: it may retry at once
            # A definition that cannot work (a header's variable unset) is not retried.
            unusable = isinstance(exc, McpServerUnavailable)
            lost = exc if unusable else ConnectionLost(_describe(exc))
            for future in (ready, current):
                if future is not None:
                    _settle(future, error=lost)
            if not isinstance(exc, Exception):
                raise  # cancellation: the claim is over
        finally:
            self.jobs = None
            send.close()
            _fail_queued(receive)
            receive.close()

    async def _client(self, stack: AsyncExitStack) -> Any:
        from mcp import Client, StdioServerParameters

        config = self.config
        if isinstance(config, StdioServer):
            params = StdioServerParameters(
                command=config.command,
                args=list(config.args),
                env=dict(config.env) or None,
                cwd=config.cwd,
            )
            return Client(params, read_timeout_seconds=config.call_timeout)
        assert isinstance(config, HttpServer)
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        http = await stack.enter_async_context(
            httpx2.AsyncClient(
                headers=config.headers(),
                timeout=httpx2.Timeout(config.connect_timeout, read=config.call_timeout),
            )
        )
        transport = streamable_http_client(config.url, http_client=http)
        return Client(transport, read_timeout_seconds=config.call_timeout)


async def _listing(client: Any) -> Listing:
    tools: list[Any] = []
    cursor = None
    while True:
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            break
    info = client.server_info
    identity = {"name": info.name, "version": info.version} if info is not None else {}
    return Listing(server_info=identity, tools=tuple(tools))


def _breaks_session(exc: Exception) -> bool:
    """Whether the session is no use after ``exc``: the connection closed, a request timed
    out (the server may hang), or an answer that is not the protocol's."""
    from mcp import MCPError
    from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

    return not isinstance(exc, MCPError) or exc.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT)


def _fail_queued(receive: Any) -> None:
    """Fail the requests queued behind a session that ended (without awaiting: the task may
    be cancelled)."""
    while True:
        try:
            _, answer = receive.receive_nowait()
        except (anyio.EndOfStream, anyio.WouldBlock, anyio.ClosedResourceError):
            return
        _settle(answer, error=ConnectionLost("the session ended"))


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups (anyio task groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _settle(future: asyncio.Future[Any], *, result: Any = None, error: Any = None) -> None:
    """Answer ``future`` unless its waiter gave up on it (it timed out or was cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class McpSessions:
    """The sessions of one claim, one Connection per server, on the claim's event loop."""

    def __init__(self, servers: tuple[ServerConfig, ...]) -> None:
        self.connections = {server.name: Connection(server) for server in servers}

    async def close(self) -> None:
        """End every session (stopping stdio servers and their process groups, cancelling
        HTTP requests) and wait until they have ended, at most CLOSE_SECONDS (a session
        still open then is logged and left to ``processes.kill_servers``). Raises nothing."""
        holders = [h for c in self.connections.values() for h in c.holders]
        for connection in self.connections.values():
            connection.stop()
        if not holders:
            return
        _, pending = await asyncio.wait(holders, timeout=CLOSE_SECONDS)
        for holder in holders:
            if holder.done() and not holder.cancelled():
                holder.exception()  # retrieved: the session's end was already reported
        if pending:
            log.warning("%d MCP session(s) still open %gs after close", len(pending), CLOSE_SECONDS)
