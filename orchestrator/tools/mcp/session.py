"""``McpConnection``: one health-checked, reconnecting client session to an MCP server, on the ``mcp`` SDK's client.

The SDK's transports and ``ClientSession`` are AnyIO context managers that must be entered and left in the same
task, so each connection lives in a task of its own (the *holder*): it opens the transport, performs the
``initialize`` handshake and keeps the session until it is closed or the connection is lost. Callers in any task
use the session while it lives.

Between the transport and the session a small pump forwards what the server sends and notes the moment the
stream ends (a stdio server that exited, an HTTP connection that failed): from then on the connection counts as
lost, requests still waiting get the SDK's "Connection closed" error at once (the session's own receive loop, left
running, fails them), and the next request connects anew.
A streamable HTTP server that forgot the session (it restarted) answers "Session terminated" without running the
request; that request is sent again once on a new session. Connecting, the handshake and each request have a
timeout, so nothing waits for ever on a server that does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import Any

import anyio
import httpx
from mcp import ClientSession, McpError
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import INVALID_REQUEST, ServerNotification, ToolListChangedNotification

from orchestrator.errors import McpConnectionError
from orchestrator.tools.mcp.params import ConnectionParams, SseConnectionParams, StdioConnectionParams

logger = logging.getLogger(__name__)

CLOSE_GRACE_SECONDS = 5.0
"""How long leaving a connection (ending a stdio server, the HTTP session's DELETE) may take before it is abandoned."""


class McpConnection:
    """A session to the server ``params`` name, opened on first use and again after it is lost."""

    def __init__(self, params: ConnectionParams, on_tools_changed: Callable[[], None] | None = None) -> None:
        self.params = params
        self._on_tools_changed = on_tools_changed
        self._session: ClientSession | None = None
        self._holder: asyncio.Task[None] | None = None
        self._stop = asyncio.Event()
        self._lost = False
        self._lock = asyncio.Lock()
        self.connects = 0
        """How many sessions were opened (a reconnection adds one)."""

    @property
    def alive(self) -> bool:
        """Whether the current session can take requests (the health check made before each request)."""
        return self._session is not None and not self._lost and self._holder is not None and not self._holder.done()

    async def request(self, send: Callable[[ClientSession], Awaitable[Any]]) -> Any:
        """``send(session)`` on a live session (connecting first when there is none). A request the server refused
        because it forgot the session is sent once more on a new one. Raises ``McpConnectionError`` when the server
        cannot be reached or the connection is lost during the request, ``McpError`` for the server's own errors."""
        for attempt in (1, 2):
            session = await self._live_session()
            try:
                return await self._while_held(send(session))
            except McpError as exc:
                if _session_forgotten(exc) and attempt == 1:
                    await self._drop()
                    continue
                if self._lost or exc.error.message == "Connection closed":
                    await self._drop()
                    raise McpConnectionError(
                        f"the MCP server {self.params.describe()} closed the connection during the request; "
                        "the next call connects again"
                    ) from exc
                raise
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream) as exc:
                await self._drop()
                if attempt == 1:  # the request could not be written: the server never saw it
                    continue
                raise McpConnectionError(f"the MCP server {self.params.describe()} is not reachable") from exc
        raise AssertionError("unreachable")

    async def _while_held(self, call: Awaitable[Any]) -> Any:
        """``call``'s answer, or ``McpConnectionError`` at once if the holder ends first: a transport whose own task
        group failed (a streamable HTTP POST that cannot connect) takes the session down before the session fails
        the requests waiting on it, which would otherwise wait out their timeout."""
        holder = self._holder
        request = asyncio.ensure_future(call)
        try:
            done, _ = await asyncio.wait({request, holder}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not request.done():
                request.cancel()
        if request in done:
            return request.result()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await request
        self._lost = True
        raise McpConnectionError(f"the MCP server {self.params.describe()} closed the connection during the request; "
                                 "the next call connects again")

    async def close(self) -> None:
        """End the session and its transport (a stdio server is stopped)."""
        async with self._lock:
            await self._drop()

    async def _live_session(self) -> ClientSession:
        async with self._lock:
            if self.alive:
                return self._session  # type: ignore[return-value]
            await self._drop()
            return await self._connect()

    async def _connect(self) -> ClientSession:
        self._stop = asyncio.Event()
        self._lost = False
        ready: asyncio.Future[ClientSession] = asyncio.get_running_loop().create_future()
        ready.add_done_callback(_retrieved)  # a holder cancelled after a timeout still sets an error nobody awaits
        self._holder = asyncio.create_task(self._hold(ready), name=f"mcp session {self.params.describe()}")
        try:
            async with asyncio.timeout(self.params.timeout):
                session = await asyncio.shield(ready)
        except TimeoutError:
            await self._drop()
            raise McpConnectionError(
                f"the MCP server {self.params.describe()} did not complete the initialize handshake within "
                f"{self.params.timeout:g} s"
            ) from None
        except Exception as exc:
            await self._drop()
            raise McpConnectionError(f"cannot connect to the MCP server {self.params.describe()}: {_reason(exc)}") from exc
        self.connects += 1
        return session

    async def _drop(self) -> None:
        """Stop the holder (it leaves the session and transport in its own task) and forget the session."""
        holder, session, self._holder, self._session = self._holder, self._session, None, None
        if holder is None:
            return
        if session is None:  # still connecting or in the handshake: nothing to leave politely
            holder.cancel()
        self._stop.set()
        done, _ = await asyncio.wait({holder}, timeout=CLOSE_GRACE_SECONDS)
        if not done:
            holder.cancel()
            await asyncio.wait({holder}, timeout=CLOSE_GRACE_SECONDS)

    async def _hold(self, ready: asyncio.Future[ClientSession]) -> None:
        try:
            async with AsyncExitStack() as stack:
                read, write = await self._open_transport(stack)
                into_session, session_read = anyio.create_memory_object_stream[Any](32)
                session = await stack.enter_async_context(ClientSession(
                    session_read, write, read_timeout_seconds=timedelta(seconds=self.params.timeout),
                    message_handler=self._on_message,
                ))
                pump = asyncio.create_task(self._pump(read, into_session))
                stack.push_async_callback(_cancel, pump)
                await session.initialize()
                self._session = session
                if not ready.done():
                    ready.set_result(session)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - whatever ended the connection is reported to the caller
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpConnectionError("connection cancelled"))
            if isinstance(exc, Exception):
                logger.info("MCP connection to %s ended: %s", self.params.describe(), _reason(exc))
        finally:
            self._lost = True
            if not ready.done():
                ready.set_exception(McpConnectionError("the connection ended before the session was ready"))

    async def _open_transport(self, stack: AsyncExitStack) -> tuple[Any, Any]:
        params = self.params
        if isinstance(params, StdioConnectionParams):
            return await stack.enter_async_context(stdio_client(params.server_params))
        if isinstance(params, SseConnectionParams):
            return await stack.enter_async_context(sse_client(
                params.url, headers=params.headers, timeout=params.timeout, sse_read_timeout=params.sse_read_timeout,
            ))
        client = await stack.enter_async_context(httpx.AsyncClient(
            headers=params.headers, follow_redirects=True,
            timeout=httpx.Timeout(params.timeout, read=params.sse_read_timeout),
        ))
        read, write, _ = await stack.enter_async_context(streamable_http_client(
            params.url, http_client=client, terminate_on_close=params.terminate_on_close,
        ))
        return read, write

    async def _pump(self, read: Any, into_session: Any) -> None:
        """Forward the server's messages to the session; when the transport's stream ends the connection is lost."""
        try:
            async with into_session:
                async for message in read:
                    await into_session.send(message)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass
        finally:
            # Lost: the session's receive loop ends on the closed stream and fails the requests still waiting with
            # "Connection closed" (``request`` then drops the connection); the holder stays until then, or until
            # the next request finds the connection not ``alive``.
            self._lost = True

    async def _on_message(self, message: Any) -> None:
        if (
            isinstance(message, ServerNotification)
            and isinstance(message.root, ToolListChangedNotification)
            and self._on_tools_changed is not None
        ):
            self._on_tools_changed()


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _session_forgotten(exc: McpError) -> bool:
    """The SDK's answer for a request a streamable HTTP server refused with 404 (it does not know the session, so it
    ran nothing); its code is +32600 in the SDK, -32600 (``INVALID_REQUEST``) by JSON-RPC: either is taken."""
    return exc.error.message == "Session terminated" and abs(exc.error.code) == abs(INVALID_REQUEST)


def _reason(exc: BaseException) -> str:
    """A readable cause: the first leaf of an exception group, else the exception itself."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if not isinstance(exc, (McpError, McpConnectionError)) else text
