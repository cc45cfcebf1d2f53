"""``serve_stdio``: one skill library served to one MCP client over this process's stdin and stdout.

Used by ``skillrun mcp``, which an MCP client (Claude Code or Desktop, Cursor, an ``mcp`` SDK client) starts as a
child process. Standard output carries the protocol only: logs go to standard error. The session ends when the
client closes stdin (or the process is stopped); its runs are cancelled and its workspace is removed.

The SDK's stdio transport reads each line and writes each answer through a worker thread (three thread hops per
request). When stdin and stdout are pipes or sockets — as an MCP client starts its servers — they are read and
written on the event loop instead (``_PipeLines``, ``_PipeOut``), which the SDK's transport accepts in their place.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import sys
from collections.abc import AsyncIterator
from typing import Any

from mcp.server.stdio import stdio_server

from orchestrator.dispatch import BaseDispatcher
from orchestrator.mcp_server.conversation import Scope
from orchestrator.mcp_server.server import McpCaps, SkillMcpServer
from orchestrator.skills.repository import BaseSkillRepository

logger = logging.getLogger(__name__)

STDIO_OWNER = "MCP"
"""The owner a stdio server's runs and workspace are filed under: there is no team (the machine's user is the one),
and no team can be named so (team names are lower case), so none of a team's secrets reach it."""
LINE_LIMIT = 64 * 1024 * 1024
"""The longest message line read from the client."""


async def serve_stdio(repository: BaseSkillRepository, dispatcher: BaseDispatcher, caps: McpCaps | None = None) -> None:
    scope = Scope(repository=repository, dispatcher=dispatcher, owner=STDIO_OWNER)

    async def scope_of(request: object) -> Scope:
        return scope

    server = SkillMcpServer(scope_of, caps)
    async with _event_loop_stdio() as (stdin, stdout), stdio_server(stdin, stdout) as (read, write):
        await server.run(read, write, server.create_initialization_options())


@contextlib.asynccontextmanager
async def _event_loop_stdio() -> AsyncIterator[tuple[Any, Any]]:
    """Standard input and output as the event loop's pipes, or ``(None, None)`` (the SDK's threads) when either is
    a file or a terminal."""
    if not (_is_stream(sys.stdin.fileno()) and _is_stream(sys.stdout.fileno())):
        yield None, None
        return
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                     os.fdopen(os.dup(sys.stdin.fileno()), "rb", buffering=0))
    write_transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                              os.fdopen(os.dup(sys.stdout.fileno()), "wb", buffering=0))
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    try:
        yield _PipeLines(reader), _PipeOut(writer)
    finally:
        read_transport.close()
        write_transport.close()


def _is_stream(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _PipeLines:
    """The client's messages, a line each, as the SDK's transport iterates them."""

    def __init__(self, reader: asyncio.StreamReader) -> None:
        self._reader = reader

    def __aiter__(self) -> _PipeLines:
        return self

    async def __anext__(self) -> str:
        try:
            line = await self._reader.readline()
        except ValueError:  # a message past LINE_LIMIT: the client is not speaking MCP; the session ends
            logger.error("a message from the MCP client is longer than %d bytes: ending the session", LINE_LIMIT)
            raise StopAsyncIteration from None
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


class _PipeOut:
    """Where the SDK's transport writes its answers."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer

    async def write(self, text: str) -> None:
        self._writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self._writer.drain()
