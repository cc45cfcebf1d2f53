"""Putting the console into the API app: its pages under ``/ui``, its static files, its sessions, and error pages
instead of the API's JSON for every ``/ui`` address."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.console import auth, libraries, operator, runs, skills
from orchestrator.console.auth import PREFIX, ConsoleError, SignInRequiredError
from orchestrator.console.render import SECURITY_HEADERS, page
from orchestrator.console.sessions import BaseConsoleSessions


class ConsoleHeaders:
    """Every answer under ``/ui`` carries the console's security headers (``SECURITY_HEADERS``) — pages, redirects,
    error pages, static files, event streams, downloads and answers made before a route runs (a slash redirect, a
    body over its limit); a header a route set itself is kept (a download's ``Content-Security-Policy: sandbox``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _console(scope["path"]):
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _console(path: str) -> bool:
    return path == PREFIX or path.startswith(f"{PREFIX}/")


def mount_console(app: FastAPI, sessions: BaseConsoleSessions) -> None:
    """Serve the console at ``/ui`` (after the API's error handlers are installed: it wraps them)."""
    app.state.console_sessions = sessions
    for module in (auth, skills, runs, libraries, operator):
        app.include_router(module.router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=Path(__file__).parent / "static"), name="console-static")
    app.add_middleware(ConsoleHeaders)  # outermost: it sees the body limit's answers too
    api_http_error = app.exception_handlers[StarletteHTTPException]
    api_validation_error = app.exception_handlers[RequestValidationError]

    async def sign_in(request: Request, exc: SignInRequiredError) -> Response:
        return RedirectResponse(f"{PREFIX}/login", status_code=303)

    async def refused(request: Request, exc: ConsoleError) -> Response:
        return page(request, "error.html", exc.status_code, message=str(exc), status=exc.status_code)

    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if not _console(request.url.path):
            return await api_http_error(request, exc)
        return page(request, "error.html", exc.status_code, message=str(exc.detail), status=exc.status_code)

    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        if not _console(request.url.path):
            return await api_validation_error(request, exc)
        message = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return page(request, "error.html", 422, message=message or "invalid request", status=422)

    app.add_exception_handler(SignInRequiredError, sign_in)
    app.add_exception_handler(ConsoleError, refused)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
