"""How the API answers errors: one body shape (``ErrorPublic``) for every 4xx and 503, declared on every route.

``HTTPException``\\ s and request validation errors are both answered as ``{"detail": "<message>", "errors":
[...]}``; validation errors list each field (``loc``, ``msg``) without echoing the input back (a refused 100 MB
command is not sent back, and a ``NaN`` cannot break the answer's JSON). The control plane's refusals are answered
by one table (``REFUSALS``, ``refusal``), which the console's pages use too: no such run or file 404, a lost run
(``RunLostError``) 410, a run refused as asked 400 or 422, an environment not ready or a library or workspace limit
409, a team over its quota (``QuotaExceededError``) 429 saying which, with ``Retry-After`` when waiting may help;
Redis or the blob store unreachable (``UnavailableError``, or a Redis connection error from any store) is 503 with
``Retry-After``.
"""

from __future__ import annotations

from typing import Any

import redis
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from orchestrator.dispatch import WorkspaceConflictError
from orchestrator.errors import (
    InvalidRunError,
    RunFileNotFoundError,
    RunLostError,
    RunNotFoundError,
    RunRefusedError,
    SkillNotFoundError,
    UnavailableError,
    WorkspaceNotFoundError,
)
from orchestrator.libraries import LibraryError, LibraryLimitError
from orchestrator.quotas import QuotaExceededError
from worker.errors import EnvironmentNotReadyError

_DESCRIPTIONS = {
    400: "The body could not be parsed.",
    401: "A missing, wrong or revoked API key.",
    403: "The route is turned off in this installation; the message says how to turn it on.",
    404: "No such object (or another team's).",
    409: "The object already exists.",
    413: "The body is larger than this route accepts.",
    410: "The run was lost: its record vanished from the run store (Redis restarted without its data); submit it again.",
    422: "A field is missing, malformed or out of bounds; the message names it.",
    429: "Over the team's quota: the message says which; with Retry-After, trying again then may succeed.",
    503: "A service the API needs (Redis, the blob store) cannot be reached; try again after Retry-After seconds.",
}

UNAVAILABLE_RETRY_AFTER_SECONDS = 5

REFUSALS: dict[type[Exception], int] = {
    RunRefusedError: 400,
    RunNotFoundError: 404, RunFileNotFoundError: 404, SkillNotFoundError: 404, WorkspaceNotFoundError: 404,
    EnvironmentNotReadyError: 409, LibraryLimitError: 409, WorkspaceConflictError: 409,
    RunLostError: 410,
    InvalidRunError: 422, LibraryError: 422,
    QuotaExceededError: 429,
    UnavailableError: 503,
}
"""The status of each refusal of the control plane (a subclass takes its nearest listed class's); a skill's
environment not ready is the run contract's own error (``worker.errors``), as runtimes raise it."""


class FieldProblem(BaseModel):
    loc: list[str | int] = Field(description="Where: 'body', then the field path.")
    msg: str


class ErrorPublic(BaseModel):
    """Every error answer."""

    detail: str = Field(description="What was wrong.")
    errors: list[FieldProblem] = Field(default_factory=list, description="Each refused field, for validation errors.")


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: each of ``codes`` answered with an ``ErrorPublic``."""
    return {code: {"model": ErrorPublic, "description": _DESCRIPTIONS[code]} for code in codes}


def stream_error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a server-sent-events route, whose own media type is ``text/event-stream``: each of ``codes``
    (with those every route may answer: 401, 422, 503) is still a JSON ``ErrorPublic``, sent before any stream."""
    schema = {"$ref": f"#/components/schemas/{ErrorPublic.__name__}"}
    return {code: {"description": _DESCRIPTIONS[code], "content": {"application/json": {"schema": schema}}}
            for code in sorted({401, 422, 503, *codes})}


def error_response(status_code: int, detail: str, errors: list[FieldProblem] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    body = ErrorPublic(detail=detail, errors=errors or [])
    return JSONResponse(body.model_dump(mode="json"), status_code=status_code, headers=headers)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    headers = dict(exc.headers or {})
    if exc.status_code == 405:  # Starlette names only the methods of the first route on the path
        routes = [route for route in request.app.routes if route.matches(request.scope)[0] is not Match.NONE]
        headers["Allow"] = ", ".join(sorted({method for route in routes for method in getattr(route, "methods", ())}))
    return error_response(exc.status_code, str(exc.detail), headers=headers)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = [FieldProblem(loc=[str(p) if not isinstance(p, int) else p for p in e["loc"]], msg=e["msg"])
                for e in exc.errors()]
    detail = "; ".join(f"{'.'.join(str(p) for p in problem.loc)}: {problem.msg}" for problem in problems)
    return error_response(422, detail or "invalid request", problems)


def refusal(exc: Exception) -> HTTPException:
    """The HTTP answer to a refusal of ``REFUSALS``: its status, its message, and ``Retry-After`` when waiting may
    help (a quota that frees up, a service away)."""
    status_code = next(REFUSALS[cls] for cls in type(exc).__mro__ if cls in REFUSALS)
    retry_after = getattr(exc, "retry_after", None)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return HTTPException(status_code, str(exc), headers=headers)


async def _refused(request: Request, exc: Exception) -> JSONResponse:
    answer = refusal(exc)
    return error_response(answer.status_code, str(answer.detail), headers=answer.headers)


async def _redis_away(request: Request, exc: Exception) -> JSONResponse:
    return error_response(503, f"Redis cannot be reached: {exc}",
                          headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)})


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    for refused in REFUSALS:
        app.add_exception_handler(refused, _refused)
    for away in (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        app.add_exception_handler(away, _redis_away)
