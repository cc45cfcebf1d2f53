"""Signing in to the console with a team API key, and what every page checks.

The login form posts the key once; the answer sets ``skillrun_session`` (HTTP-only, ``SameSite=Strict``, path
``/ui``, ``Secure`` over HTTPS) to a session token (``orchestrator.console.sessions``). Each page finds the team from
that session and the key it was opened with (a revoked key ends its sessions). Every form that changes something
carries the session's CSRF token in a hidden ``csrf`` field, compared in constant time; the login form carries one
from a short-lived cookie of its own (double submit). A post the browser says came from another site
(``Sec-Fetch-Site``, ``Origin``) is refused before either is looked at, so a cookie planted from a sibling host
cannot sign a browser in to another team either. A form whose names, values or file names are not text a store can
keep (a lone surrogate, which a multipart body declaring a charset such as UTF-7 decodes to) is refused (422) before
anything of it is used or shown again (``form_text``).
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.datastructures import FormData, UploadFile

from orchestrator.api.deps import get_services
from orchestrator.console.render import page
from orchestrator.console.sessions import BaseConsoleSessions, ConsoleSession
from orchestrator.errors import OrchestratorError, UnencodableTextError
from orchestrator.services import Services
from orchestrator.teams import Team
from orchestrator.text import check_text

SESSION_COOKIE = "skillrun_session"
LOGIN_COOKIE = "skillrun_login"
LOGIN_SECONDS = 3600
PREFIX = "/ui"
MAX_KEY_CHARS = 200

router = APIRouter(prefix=PREFIX, include_in_schema=False)


class SignInRequiredError(OrchestratorError):
    """No live session: the browser is sent to the login page."""


class ConsoleError(OrchestratorError):
    """A page that cannot be shown or an action that was refused: an error page with ``status_code``."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code


def console_sessions(request: Request) -> BaseConsoleSessions:
    return request.app.state.console_sessions


async def signed_in(
    request: Request, services: Services = Depends(get_services),
    sessions: BaseConsoleSessions = Depends(console_sessions),
) -> Team:
    """The signed-in team (its session kept on ``request.state`` for the templates); else to the login page."""
    token = request.cookies.get(SESSION_COOKIE, "")
    session = await sessions.get(token)
    if session is None:
        raise SignInRequiredError()
    team = await asyncio.to_thread(services.teams.team_of_key, session.key_id)
    if team is None or team.id != session.team_id:
        await sessions.close(token)
        raise SignInRequiredError()
    request.state.console = session
    request.state.console_team = team
    return team


def cross_site(request: Request) -> str | None:
    """Why a form post comes from another site, or ``None``: the browser's own word (``Sec-Fetch-Site``), else (an
    older browser) its ``Origin`` against the address the form was posted to. Requests with neither (not from a
    browser) pass on their tokens alone."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return None if site in ("same-origin", "none") else f"the form was sent from another site ({site})"
    origin = request.headers.get("origin")
    if origin is not None:
        sent = urlsplit(origin)
        if (sent.scheme, sent.netloc) != (request.url.scheme, request.headers.get("host")):
            return "the form was sent from another origin"
    return None


def form_text(form: FormData) -> None:
    """Refuse (``ConsoleError`` 422, naming the field) a form whose names, values or file names hold a lone
    surrogate."""
    for name, value in form.multi_items():
        try:
            check_text({name: (value.filename or "") if isinstance(value, UploadFile) else value})
        except UnencodableTextError as exc:
            raise ConsoleError(422, str(exc)) from None


async def checked(request: Request, team: Team = Depends(signed_in)) -> Team:
    """The signed-in team, for a form that changes something: sent from the console's own pages, with the
    session's ``csrf`` token (403 otherwise), its text checked (``form_text``)."""
    if (reason := cross_site(request)) is not None:
        raise ConsoleError(403, f"{reason}: use the console's own pages")
    form = await request.form()
    form_text(form)
    session: ConsoleSession = request.state.console
    sent = form.get("csrf")
    if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), session.csrf.encode()):
        raise ConsoleError(403, "the form's CSRF token is missing or wrong: reload the page and send it again")
    return team


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


def _login_page(request: Request, error: str | None = None, status_code: int = 200) -> HTMLResponse:
    token = secrets.token_urlsafe(32)
    response = page(request, "login.html", status_code, csrf=token, error=error, session=None, team=None)
    response.set_cookie(LOGIN_COOKIE, token, max_age=LOGIN_SECONDS, path=PREFIX, httponly=True, samesite="strict",
                        secure=_secure(request))
    return response


@router.get("", response_class=RedirectResponse)
async def home(request: Request, sessions: BaseConsoleSessions = Depends(console_sessions)) -> Response:
    signed = await sessions.get(request.cookies.get(SESSION_COOKIE, ""))
    return RedirectResponse(f"{PREFIX}/skills" if signed else f"{PREFIX}/login", status_code=303)


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request) -> HTMLResponse:
    return _login_page(request)


@router.post("/login", response_class=HTMLResponse)
async def login(
    request: Request, key: str = Form(default="", max_length=MAX_KEY_CHARS),
    csrf: str = Form(default="", max_length=100),
    services: Services = Depends(get_services), sessions: BaseConsoleSessions = Depends(console_sessions),
) -> Response:
    if (reason := cross_site(request)) is not None:
        return _login_page(request, f"{reason}: sign in on this page", 403)
    expected = request.cookies.get(LOGIN_COOKIE, "")
    if not expected or not hmac.compare_digest(csrf.encode(), expected.encode()):
        return _login_page(request, "the sign-in form expired: enter the key again", 403)
    found = await asyncio.to_thread(services.teams.authenticate_key, key.strip())
    if found is None:
        return _login_page(request, "that key is not valid (wrong, or revoked): ask for one with "
                                    "'skillrun keys create TEAM'", 401)
    team, key_id = found
    token, _ = await sessions.open(team.id, key_id)
    response = RedirectResponse(f"{PREFIX}/skills", status_code=303)
    response.set_cookie(SESSION_COOKIE, token, max_age=sessions.ttl_seconds, path=PREFIX, httponly=True,
                        samesite="strict", secure=_secure(request))
    response.delete_cookie(LOGIN_COOKIE, path=PREFIX)
    return response


@router.post("/logout", response_class=RedirectResponse)
async def logout(request: Request, _: Team = Depends(checked),
                 sessions: BaseConsoleSessions = Depends(console_sessions)) -> Response:
    await sessions.close(request.cookies.get(SESSION_COOKIE, ""))
    response = RedirectResponse(f"{PREFIX}/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path=PREFIX)
    return response
