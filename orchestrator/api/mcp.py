"""``McpEndpoint``: the MCP server at the API's ``/mcp``, over streamable HTTP, behind the team's bearer key.

Every request (initialize, each call, the event stream, the session's DELETE) shows ``Authorization: Bearer <team
key>``; a missing, wrong or revoked key is answered 401 before MCP sees the request, as on ``/v1``. The team the key
names is the request's scope: its current libraries (or the server's library), the API's dispatcher, its own runs
and workspaces. An MCP session is bound to the team that opened it (``Conversation.claim``).

Sessions are the SDK's (``StreamableHTTPSessionManager``): at most ``max_sessions`` at once (one more is refused),
each ended — its runs cancelled, its workspace removed — when the client closes it (``DELETE``) or after
``idle_seconds`` without a request.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from orchestrator.api.responses import error_response
from orchestrator.api.services import Services
from orchestrator.mcp_server.conversation import Scope as CallerScope
from orchestrator.mcp_server.server import McpCaps, SkillMcpServer
from orchestrator.teams import Team

TEAM_STATE_KEY = "skillrun_team"


class McpEndpoint:
    """An ASGI app serving ``SkillMcpServer`` for the teams of ``services``; ``run()`` must be entered for its
    lifetime (the API's lifespan does)."""

    def __init__(self, services: Services, caps: McpCaps | None = None, *, idle_seconds: float = 900,
                 max_sessions: int = 1000) -> None:
        self.services = services
        self.server = SkillMcpServer(self._scope_of, caps)
        self.sessions = StreamableHTTPSessionManager(
            self.server, session_idle_timeout=idle_seconds, max_sessions=max_sessions, json_response=True,
        )

    def run(self) -> AbstractAsyncContextManager[None]:
        return self.sessions.run()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        authorization = Headers(scope=scope).get("authorization", "")
        kind, _, key = authorization.partition(" ")
        if kind.lower() != "bearer" or not key.strip():
            await _refuse("missing API key: send 'Authorization: Bearer <key>'", scope, receive, send)
            return
        team = await asyncio.to_thread(self.services.teams.authenticate, key.strip())
        if team is None:
            await _refuse("invalid or revoked API key", scope, receive, send)
            return
        scope.setdefault("state", {})[TEAM_STATE_KEY] = team
        await self.sessions.handle_request(scope, receive, send)

    async def _scope_of(self, request: Request | None) -> CallerScope:
        team: Team | None = getattr(request.state, TEAM_STATE_KEY, None) if request is not None else None
        if team is None:  # every request passed __call__, which puts the team there
            raise PermissionError("an MCP request without a team")
        repository = await asyncio.to_thread(self.services.repository_for, team)
        return CallerScope(repository=repository, dispatcher=self.services.dispatcher, owner=team.id)


async def _refuse(detail: str, scope: Scope, receive: Receive, send: Send) -> None:
    await error_response(401, detail, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
