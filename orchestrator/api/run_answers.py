"""How a run's events, files and artifacts are sent over HTTP, by the API's routes and the console's pages alike:
as server-sent events, and as downloads a browser never runs on the API's origin."""

from __future__ import annotations

import urllib.parse
from collections.abc import AsyncIterator
from pathlib import PurePosixPath

from fastapi import Path, Response
from fastapi.responses import StreamingResponse
from fastapi.sse import ServerSentEvent

from orchestrator.schemas import RUN_ID
from orchestrator.services import Services, follow_run, open_artifact, output_file
from worker.run_store import RunRecord
from worker.validation import MAX_PATH_CHARS

RunId = Path(pattern=RUN_ID, description="The run's id.")
FileName = Path(min_length=1, max_length=MAX_PATH_CHARS, description="The file's path in the workspace (out/x.png).")

_INLINE_TYPES = {"text/plain", "text/csv", "application/json"}
"""Types a browser shows without running anything; every other type is sent as a download."""


def served_headers(mime_type: str, name: str) -> dict[str, str]:
    """How a run's file is sent to a browser: never sniffed into another type; HTML, SVG, XML, scripts and any type
    not known to be passive are downloaded (``attachment``), never shown on the API's origin."""
    base = mime_type.split(";")[0].strip().lower()
    passive = base in _INLINE_TYPES or (base.startswith(("image/", "audio/", "video/")) and "xml" not in base)
    filename = urllib.parse.quote(PurePosixPath(name).name or "file")
    return {
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "sandbox",
        "Content-Disposition": f"{'inline' if passive else 'attachment'}; filename*=UTF-8''{filename}",
    }


async def event_stream(services: Services, run_id: str) -> AsyncIterator[ServerSentEvent]:
    """A run's events as server-sent events (the API's and the console's streams)."""
    async for item in follow_run(services, run_id):
        yield ServerSentEvent(event=item.type, data=item.data)


def file_answer(record: RunRecord, name: str) -> Response:
    """The answer that sends output file ``name`` of a run."""
    found, data = output_file(record, name)
    return Response(data, media_type=found.mime_type, headers={
        "X-Skillrun-Truncated": str(found.truncated).lower(), **served_headers(found.mime_type, name)})


async def artifact_answer(services: Services, record: RunRecord, name: str) -> StreamingResponse:
    """The answer that streams artifact ``name`` of a run from the artifact store."""
    found, opened = await open_artifact(services, record, name)
    return StreamingResponse(opened.chunks(), media_type=found.mime_type, headers={
        "Content-Length": str(opened.size), **served_headers(found.mime_type, name)})
