"""``McpEndpoint``: the MCP server at the API's ``/mcp``, over streamable HTTP, behind the team's bearer key.

Every request (initialize, each call, the event stream, the session's DELETE) shows ``Authorization: Bearer <team
key>``; a missing, wrong or revoked key is answered 401 before MCP sees the request, as on ``/v1``. The team the key
names is the request's scope: its current libraries (or the server's library), the API's dispatcher, its own runs
and workspaces. An MCP session answers only the team that opened it: the team is the SDK's authenticated user, and
another team's request with the session's id is answered 404 (``Conversation.claim`` checks again on each call).
A body that is not JSON the server can read is answered 400 with a JSON-RPC parse error, one holding a string with a
lone surrogate with invalid params (the field named), before the SDK sees either.

Sessions are the SDK's (``StreamableHTTPSessionManager``): at most ``max_sessions`` at once (one more is refused
with 503), and ``team_sessions`` of one team (one more is refused with 429, so one team cannot lock the others out),
each ended — its runs cancelled, its workspace removed — when the client closes it (``DELETE``) or after
``idle_seconds`` without a request.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.types import INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope, Send

from orchestrator.api.responses import error_response
from orchestrator.egress import EgressStore
from orchestrator.errors import OrchestratorError, UnencodableTextError
from orchestrator.mcp_server.conversation import Scope as CallerScope
from orchestrator.mcp_server.server import McpCaps, SkillMcpServer
from orchestrator.services import Services
from orchestrator.teams import Team
from orchestrator.text import check_text

TEAM_STATE_KEY = "skillrun_team"


class McpEndpoint:
    """An ASGI app serving ``SkillMcpServer`` for the teams of ``services``; ``run()`` must be entered for its
    lifetime (the API's lifespan does)."""

    def __init__(self, services: Services, caps: McpCaps | None = None, *, idle_seconds: float = 900,
                 max_sessions: int = 1000, team_sessions: int = 100) -> None:
        self.services = services
        self.team_sessions = team_sessions
        self.server = SkillMcpServer(self._scope_of, caps)
        self.sessions = StreamableHTTPSessionManager(
            self.server, session_idle_timeout=idle_seconds, max_sessions=max_sessions, json_response=True,
        )

    def run(self) -> AbstractAsyncContextManager[None]:
        return self.sessions.run()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        authorization = headers.get("authorization", "")
        kind, _, key = authorization.partition(" ")
        if kind.lower() != "bearer" or not key.strip():
            await _refuse("missing API key: send 'Authorization: Bearer <key>'", scope, receive, send)
            return
        team = await asyncio.to_thread(self.services.teams.authenticate, key.strip())
        if team is None:
            await _refuse("invalid or revoked API key", scope, receive, send)
            return
        scope.setdefault("state", {})[TEAM_STATE_KEY] = team
        # The team as the SDK's authenticated user: a session answers only the credential that opened it (another
        # team's POST, GET or DELETE with its id gets 404, as if there were none).
        scope["user"] = AuthenticatedUser(AccessToken(token="", client_id=team.id, subject=team.id, scopes=[]))
        if scope["method"] == "POST" and MCP_SESSION_ID_HEADER not in headers and self._full(team):
            await error_response(429, f"team {team.id} has {self.team_sessions} MCP sessions open, the most it may: "
                                      "close one (DELETE /mcp) or wait for one to idle out",
                                 headers={"Retry-After": "60"})(scope, receive, send)
            return
        if scope["method"] == "POST":
            body = await _whole_body(receive)
            refusal = _refusal(body)
            if refusal is not None:
                await refusal(scope, receive, send)
                return
            receive = _replaying(body, receive)
            if session_id := headers.get(MCP_SESSION_ID_HEADER):
                send = _ended_session_answered(send, lambda: self._ended(session_id))
        await self.sessions.handle_request(scope, receive, send)

    def _ended(self, session_id: str) -> bool:
        """Whether the session ``session_id`` has ended (its client's DELETE, or its idle time)."""
        transport = self.sessions._server_instances.get(session_id)
        return transport is None or transport.is_terminated

    def _full(self, team: Team) -> bool:
        """Whether ``team`` holds ``team_sessions`` sessions already (the sessions by their opener, as the SDK
        keeps them for its per-credential check)."""
        owners = getattr(self.sessions, "_session_owners", {})
        return sum(1 for owner in owners.values() if owner and owner.get("client_id") == team.id) >= self.team_sessions

    async def _scope_of(self, request: Request | None) -> CallerScope:
        team: Team | None = getattr(request.state, TEAM_STATE_KEY, None) if request is not None else None
        if team is None:  # every request passed __call__, which puts the team there
            raise PermissionError("an MCP request without a team")
        repository = await asyncio.to_thread(self.services.repository_for, team)
        return CallerScope(repository=repository, dispatcher=self.services.dispatcher, owner=team.id,
                           egress=self._egress)

    def _egress(self, team: str) -> list[str]:
        return EgressStore(self.services.teams.docs).get(team).entries


async def _refuse(detail: str, scope: Scope, receive: Receive, send: Send) -> None:
    await error_response(401, detail, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)


async def _whole_body(receive: Receive) -> bytes:
    """The request's body (the API's body limit has bounded it)."""
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


def _refusal(body: bytes) -> JSONResponse | None:
    """The answer to a body the server does not take (400, a JSON-RPC error), or ``None``. A parse error the SDK
    would answer 500 (nesting past the parser's depth, bytes that are not UTF-8, integers past Python's digit limit)
    is a parse error here, and so is a number that is not finite (``NaN``, ``Infinity``, ``1e999``), which the SDK
    would pass on as null: a tool's argument would silently become its default. A string holding a lone surrogate
    (``"\\ud800"``), which the SDK would pass on to the tools though no store can keep it, is invalid params naming
    where it is (``params.arguments.command``)."""
    try:
        message = json.loads(body, parse_constant=_not_finite, parse_float=_finite)
    except NonFiniteNumberError as exc:
        return _error(PARSE_ERROR, f"Parse error: {exc} is not a finite number; JSON numbers must be finite")
    except (ValueError, RecursionError) as exc:
        return _error(PARSE_ERROR, f"Parse error: the body is not JSON the server can read ({type(exc).__name__})")
    try:
        check_text(message)
    except UnencodableTextError as exc:
        request_id = message.get("id") if isinstance(message, dict) and exc.where != "id" else None
        return _error(INVALID_PARAMS, f"Invalid params: {exc}",
                      request_id if isinstance(request_id, (int, str)) else None)
    return None


def _error(code: int, message: str, request_id: int | str | None = None) -> JSONResponse:
    return JSONResponse({"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}},
                        status_code=400)


class NonFiniteNumberError(OrchestratorError, ValueError):
    """A number in a request that is not finite (its text is the message)."""


def _not_finite(token: str) -> float:
    raise NonFiniteNumberError(token)


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise NonFiniteNumberError(text[:40])
    return number


def _ended_session_answered(send: Send, ended: Callable[[], bool]) -> Send:
    """``send`` where the 500 the SDK answers a call whose session ended under it (its DELETE or idle time closed
    the call's stream: 'Error processing request') becomes the 404 any request of an ended session gets."""
    replaced = False

    async def guarded(message: Message) -> None:
        nonlocal replaced
        if message["type"] == "http.response.start" and message["status"] >= 500 and ended():
            replaced = True
            await JSONResponse({"jsonrpc": "2.0", "id": None, "error": {
                "code": INVALID_REQUEST, "message": "the session ended while the call was running"}},
                status_code=404)({"type": "http"}, _no_body, send)
        elif not replaced:  # the SDK's own body of a replaced answer is dropped
            await send(message)

    return guarded


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _replaying(body: bytes, receive: Receive) -> Receive:
    """``receive`` with ``body`` handed out first, as if it had not been read."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
