"""Bounds on request bodies, checked before a body is read whole.

Each route has a limit: a run request holds its inputs in base64 (one 64 MiB input and the rest of the request),
an archive upload may be as large as a library download, and every other body is a few MiB of JSON. A body is
refused with 413 (an ``ErrorPublic`` naming the limit) when its ``Content-Length`` is over the limit, and — for a
chunked body — as soon as the bytes received pass it, so the API never holds more than the limit of one body.
"""

from __future__ import annotations

import math
import re

from fastapi import HTTPException
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from orchestrator.api.responses import error_response
from worker import defaults
from worker.roots import FetchLimits

JSON_BODY_BYTES = 4 * 1024 * 1024
"""Any body but those below: sessions, messages, library registrations."""
RUN_BODY_BYTES = 4 * math.ceil(defaults.INPUT_FILE_BYTES / 3) + JSON_BODY_BYTES
"""``POST /v1/runs``: one input at its 64 MiB limit in base64, and room for the rest of the request."""
UPLOAD_BODY_BYTES = FetchLimits.max_download_bytes
"""``POST /v1/libraries/{name}/upload``: as large as a library archive fetched from a URL may be."""

_UPLOAD_PATH = re.compile(r"^/v1/libraries/[^/]+/upload$|^/ui/libraries/upload$")


def body_limit(method: str, path: str) -> int:
    """The most bytes a body of this route may have."""
    if method == "POST" and path == "/v1/runs":
        return RUN_BODY_BYTES
    if method == "POST" and _UPLOAD_PATH.match(path):
        return UPLOAD_BODY_BYTES
    return JSON_BODY_BYTES


def _too_large(method: str, path: str, limit: int) -> str:
    return f"the body of {method} {path} may be at most {limit} bytes"


class BodyLimitMiddleware:
    """Refuse a body over its route's limit: by its declared length before reading, else while it streams in."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        limit = body_limit(method, path)
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            await error_response(413, _too_large(method, path, limit))(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # answered by the app's error handler, before the route sees the body
                    raise HTTPException(413, _too_large(method, path, limit))
            return message

        await self.app(scope, limited_receive, send)
