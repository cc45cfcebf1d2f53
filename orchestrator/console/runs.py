"""The console's runs: the list (filtered by status and skill), a run's page that follows it live, its event stream,
its files and artifacts, and cancelling it. Each read goes through the service layer's checks (``team_run``), so
another team's run is a 404 here too."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import (
    HTMLResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.sse import EventSourceResponse, ServerSentEvent

from orchestrator.api.deps import get_services
from orchestrator.api.file_paths import FILE_NAME
from orchestrator.api.responses import refusal
from orchestrator.api.run_answers import (
    FileName,
    RunId,
    artifact_answer,
    event_stream,
    file_answer,
)
from orchestrator.console.auth import PREFIX, ConsoleError, checked, signed_in
from orchestrator.console.render import page
from orchestrator.errors import RunLostError, RunNotFoundError
from orchestrator.services import Services, team_run
from orchestrator.teams import Team
from worker.contract import OutputFile
from worker.run_store import RunRecord, RunStatus

router = APIRouter(prefix=f"{PREFIX}/runs", include_in_schema=False)

LISTED = 100
SCANNED = 1000
"""Runs looked through for a skill filter (the newest ones)."""
PREVIEW_CHARS = 64 * 1024
_TEXT_PREVIEW = {"application/json", "application/x-ndjson", "text/plain", "text/csv", "text/markdown",
                 "text/tab-separated-values", "text/x-python", "text/x-log"}


def preview(file: OutputFile) -> tuple[str, str]:
    """How an output file is previewed on its run's page: ``("text", content)``, ``("image", "")`` for a raster
    image (shown from its download address), or ``("", "")``: never HTML, SVG or XML, and nothing without content."""
    base = file.mime_type.split(";")[0].strip().lower()
    if file.encoding == "none":
        return "", ""
    if base.startswith("image/") and "svg" not in base and "xml" not in base:
        return "image", ""
    if base in _TEXT_PREVIEW or (base.startswith("text/") and base not in {"text/html", "text/xml"}):
        data = base64.b64decode(file.content) if file.encoding == "base64" else file.content.encode()
        return "text", data[:PREVIEW_CHARS].decode("utf-8", "replace")
    return "", ""


@router.get("", response_class=HTMLResponse)
async def runs_page(
    request: Request, status: str = Query(default="", max_length=20),
    skill: str = Query(default="", max_length=64), team: Team = Depends(signed_in),
    services: Services = Depends(get_services),
) -> HTMLResponse:
    try:
        wanted = RunStatus(status) if status else None
    except ValueError:
        raise ConsoleError(422, f"status {status!r}: one of {', '.join(s.value for s in RunStatus)}") from None
    name = skill.strip()
    records = await services.dispatcher.list(wanted, SCANNED if name else LISTED, owner=team.id)
    if name:
        records = [r for r in records if r.request.skill.name == name][:LISTED]
    return page(request, "runs.html", runs=records, status=status, skill=name,
                statuses=[s.value for s in RunStatus])


def duration(record: RunRecord) -> float | None:
    if record.result is not None:
        return record.result.duration_ms / 1000
    if record.started_at and record.finished_at:
        return record.finished_at - record.started_at
    return None


@router.get("/{run_id}", response_class=HTMLResponse)
async def run_page(request: Request, run_id: str = RunId, team: Team = Depends(signed_in),
                   services: Services = Depends(get_services)) -> HTMLResponse:
    record = await _team_run(services, run_id, team)
    events = await services.dispatcher.events(run_id)
    files = [(file, *preview(file)) for file in (record.result.output_files if record.result else [])]
    return page(request, "run.html", run=record, events=events, files=files, duration=duration(record),
                ended=record.status.done)


async def _team_run(services: Services, run_id: str, team: Team) -> RunRecord:
    try:
        return await team_run(services, run_id, team)
    except (RunLostError, RunNotFoundError) as exc:
        raise ConsoleError(refusal(exc).status_code, str(exc)) from exc


async def followed_run(run_id: str = RunId, team: Team = Depends(signed_in),
                       services: Services = Depends(get_services)) -> RunRecord:
    """The run a console stream follows, checked before the stream starts."""
    return await _team_run(services, run_id, team)


@router.get("/{run_id}/events", response_class=EventSourceResponse)
async def run_events(record: RunRecord = Depends(followed_run),
                     services: Services = Depends(get_services)) -> AsyncIterator[ServerSentEvent]:
    """The run's events as server-sent events, as ``GET /v1/runs/{id}/events`` sends them."""
    async for event in event_stream(services, record.id):
        yield event


@router.get(f"/{{run_id}}/files/{FILE_NAME}", response_class=Response)
async def run_file(run_id: str = RunId, name: str = FileName, team: Team = Depends(signed_in),
                   services: Services = Depends(get_services)) -> Response:
    return file_answer(await _team_run(services, run_id, team), name)


@router.get(f"/{{run_id}}/artifacts/{FILE_NAME}", response_class=StreamingResponse)
async def run_artifact(run_id: str = RunId, name: str = FileName, team: Team = Depends(signed_in),
                       services: Services = Depends(get_services)) -> StreamingResponse:
    return await artifact_answer(services, await _team_run(services, run_id, team), name)


@router.post("/{run_id}/cancel", response_class=RedirectResponse)
async def cancel_run(run_id: str = RunId, team: Team = Depends(checked),
                     services: Services = Depends(get_services)) -> Response:
    await _team_run(services, run_id, team)
    await services.dispatcher.cancel(run_id)
    return RedirectResponse(f"{PREFIX}/runs/{run_id}", status_code=303)

