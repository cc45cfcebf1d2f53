"""Runs: submit (202), read (optionally waiting), list, cancel, follow as SSE, download files and artifacts.

A run whose record is missing is told apart from a wrong id (``run_ids``): 410 when it was lost, 404 when there is
no such run. A wait ends when its client goes, and answers at once (the run as it stands) when the API shuts down;
an event stream then ends with ``closing``, or ``lost`` / ``unavailable`` when the run or Redis went away.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from orchestrator.api.auth import current_team
from orchestrator.api.deps import get_services
from orchestrator.api.file_paths import FILE_NAME
from orchestrator.api.responses import (
    ErrorPublic,
    error_responses,
    stream_error_responses,
)
from orchestrator.api.run_answers import (
    FileName,
    RunId,
    artifact_answer,
    event_stream,
    file_answer,
)
from orchestrator.errors import RunLostError
from orchestrator.schemas import RunCreate, RunPublic, RunsPublic
from orchestrator.services import Services, accept_run, missing_run, team_run
from orchestrator.teams import Team
from worker.run_store import RunRecord, RunStatus

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=error_responses(401, 422))

MAX_WAIT_SECONDS = 300.0
CLIENT_GONE = 499
"""What a wait whose client left answers (nobody reads it), as proxies log it."""

FOUND = error_responses(404, 410)

async def _until_client_leaves(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        continue


def _json(model: RunPublic, status_code: int = status.HTTP_200_OK) -> Response:
    """The model as JSON, as FastAPI would send it, without its dump-validate-encode round (a run can be large)."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


NOT_READY = {409: {"model": ErrorPublic, "description": "The skill's dependency environment is not ready and the "
                                                        "run asked not to wait for it (wait_for_environment=false)."}}


@router.post("", response_model=RunPublic, status_code=status.HTTP_202_ACCEPTED,
             responses={**error_responses(400, 404, 413, 429), **NOT_READY})
async def submit_run(
    body: RunCreate, team: Team = Depends(current_team), services: Services = Depends(get_services)
) -> Response:
    """Accept a run; it executes in the background (in this process, or on a worker when Redis is configured).
    The workspace id is the team's: ``<team>.<workspace_id>`` (a new one when not given, removed after the run
    unless ``keep_workspace``). A run of the local or
    Docker runtime that will not wait for its skill's dependency environment is refused (409) while the environment
    (and on Docker the image of its Debian packages) is not ready;
    a run that waits has it built first (one whose build fails ends failed, with the build's message). A run over
    its team's quota (``GET /v1/quota``) is refused with 429, nothing of it stored."""
    return _json(RunPublic.of(await accept_run(services, team, body)), status.HTTP_202_ACCEPTED)


@router.get("", response_model=RunsPublic)
async def list_runs(
    status_filter: RunStatus | None = Query(default=None, alias="status"),
    limit: int = Query(default=100, ge=1, le=1000),
    team: Team = Depends(current_team),
    services: Services = Depends(get_services),
) -> RunsPublic:
    """The team's recent runs, newest first, optionally of one status."""
    records = await services.dispatcher.list(status_filter, limit, owner=team.id)
    return RunsPublic(data=[RunPublic.of(r) for r in records], count=len(records))


@router.get("/{run_id}", response_model=RunPublic, responses=FOUND)
async def get_run(
    request: Request,
    run_id: str = RunId,
    wait: float = Query(default=0.0, ge=0.0, le=MAX_WAIT_SECONDS, description="Seconds to wait for the run to end."),
    team: Team = Depends(current_team),
    services: Services = Depends(get_services),
) -> Response:
    """A run; with ``wait`` the answer comes when the run ends or after that many seconds (sooner, with the run as
    it stands, when the API shuts down). 410: the run was lost (its record vanished), not an unknown id."""
    if not wait:
        return _json(RunPublic.of(await team_run(services, run_id, team)))
    waiting = asyncio.ensure_future(services.dispatcher.wait(run_id, wait, owner=team.id))
    leaving = asyncio.ensure_future(_until_client_leaves(request))
    try:
        await asyncio.wait({waiting, leaving}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiting.cancel()
        leaving.cancel()
    if not waiting.done():  # the client went: the wait ended with it
        return Response(status_code=CLIENT_GONE)
    record = waiting.result()
    if record is None:
        raise missing_run(services, run_id, team, await services.dispatcher.get(run_id) is None)
    return _json(RunPublic.of(record))


@router.post("/{run_id}/cancel", response_model=RunPublic, responses=FOUND)
async def cancel_run(run_id: str = RunId, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> RunPublic:
    """Cancel a run: a queued one at once, a started one is stopped (its processes killed) by its worker."""
    await team_run(services, run_id, team)
    record = await services.dispatcher.cancel(run_id)
    if record is None:  # vanished since it was read
        raise RunLostError(run_id)
    return RunPublic.of(record)


EVENTS = {"content": {"text/event-stream": {}}, "description": "queued, started, finished... until the run ends; or it "
          "ends with closing (the API shuts down: follow again), lost (the run's record vanished) or unavailable "
          "(Redis went away: follow again after retry_after seconds)."}


async def followed_run(run_id: str = RunId, team: Team = Depends(current_team),
                       services: Services = Depends(get_services)) -> RunRecord:
    """The run a stream follows, checked before the stream starts (404 / 410 as an answer, not a broken stream)."""
    return await team_run(services, run_id, team)


@router.get("/{run_id}/events", response_class=EventSourceResponse, responses={200: EVENTS, **stream_error_responses(404, 410)})
async def run_events(record: RunRecord = Depends(followed_run),
                     services: Services = Depends(get_services)) -> AsyncIterator[ServerSentEvent]:
    """The run's events as server-sent events (with timings), until it ends."""
    async for event in event_stream(services, record.id):
        yield event


@router.get(f"/{{run_id}}/files/{FILE_NAME}", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes."}, **FOUND})
async def get_file(run_id: str = RunId, name: str = FileName, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> Response:
    """An output file of a finished run, with its MIME type (``X-Skillrun-Truncated`` when it was capped)."""
    return file_answer(await team_run(services, run_id, team), name)


@router.get(f"/{{run_id}}/artifacts/{FILE_NAME}", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The artifact's bytes."}, **FOUND})
async def get_artifact(run_id: str = RunId, name: str = FileName, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> StreamingResponse:
    """An artifact a run saved, byte for byte, with its MIME type and length, streamed from the artifact store (404
    when the store no longer has it, 503 when the store cannot be reached)."""
    return await artifact_answer(services, await team_run(services, run_id, team), name)
