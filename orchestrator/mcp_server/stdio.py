"""``serve_stdio``: one skill library served to one MCP client over this process's stdin and stdout.

Used by ``skillrun mcp``, which an MCP client (Claude Code or Desktop, Cursor, an ``mcp`` SDK client) starts as a
child process. Standard output carries the protocol only: logs go to standard error. The session ends when the
client closes stdin (or the process is stopped); its runs are cancelled and its workspace is removed.
"""

from __future__ import annotations

from mcp.server.stdio import stdio_server

from orchestrator.dispatch import BaseDispatcher
from orchestrator.mcp_server.conversation import Scope
from orchestrator.mcp_server.server import McpCaps, SkillMcpServer
from orchestrator.skills.repository import BaseSkillRepository

STDIO_OWNER = "mcp"
"""The owner a stdio server's runs and workspace are filed under (there is no team: the machine's user is the one)."""


async def serve_stdio(repository: BaseSkillRepository, dispatcher: BaseDispatcher, caps: McpCaps | None = None) -> None:
    scope = Scope(repository=repository, dispatcher=dispatcher, owner=STDIO_OWNER)

    async def scope_of(request: object) -> Scope:
        return scope

    server = SkillMcpServer(scope_of, caps)
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options())
