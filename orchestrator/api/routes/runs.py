"""Runs: submit (202), read (optionally waiting), list, cancel, follow as SSE, download files and artifacts.

A run whose record is missing is told apart from a wrong id (``run_ids``): 410 when it was lost, 404 when there is
no such run. A wait ends when its client goes, and answers at once (the run as it stands) when the API shuts down;
an event stream then ends with ``closing``, or ``lost`` / ``unavailable`` when the run or Redis went away.
"""

from __future__ import annotations

import asyncio
import base64
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from pathlib import PurePosixPath

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, status
from fastapi.responses import StreamingResponse
from fastapi.sse import EventSourceResponse, ServerSentEvent

from orchestrator.api import run_ids
from orchestrator.api.auth import current_team
from orchestrator.builds import not_ready
from orchestrator.api.file_paths import FILE_NAME
from orchestrator.api.responses import (
    UNAVAILABLE_RETRY_AFTER_SECONDS, ErrorPublic, error_responses, over_quota, stream_error_responses,
)
from orchestrator.api.schemas import RUN_ID, RunCreate, RunPublic, RunsPublic
from orchestrator.api.services import Services, get_services
from orchestrator.egress import EgressStore
from orchestrator.errors import DispatchError, RunLostError, SkillNotFoundError, UnavailableError
from orchestrator.quotas import QuotaExceededError
from orchestrator.teams import Team
from worker.contract import InputFile, RunRequest, RuntimeName, SkillRef
from worker.egress import effective
from worker.names import env_name_problem
from worker.errors import ArtifactError, BlobStoreError, SecretError, WorkerError
from worker.run_store import ENDING_EVENTS, RunRecord, RunStatus
from worker.validation import MAX_PATH_CHARS, validate_request

router = APIRouter(prefix="/v1/runs", tags=["runs"], responses=error_responses(401, 422))

MAX_WAIT_SECONDS = 300.0
CLIENT_GONE = 499
"""What a wait whose client left answers (nobody reads it), as proxies log it."""

RunId = Path(pattern=RUN_ID, description="The run's id.")
FileName = Path(min_length=1, max_length=MAX_PATH_CHARS, description="The file's path in the workspace (out/x.png).")
FOUND = error_responses(404, 410)

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


async def team_run(services: Services, run_id: str, team: Team) -> RunRecord:
    """The team's run ``run_id``; another team's run is answered as if it did not exist."""
    record = await services.dispatcher.get(run_id)
    if record is None or record.owner != team.id:
        _missing(services, run_id, team, record is None)
    return record


def _missing(services: Services, run_id: str, team: Team, no_record: bool) -> None:
    """410 for a run of the team whose record is gone (lost), else 404."""
    if no_record and run_ids.lost(run_id, team.id, services.dispatcher.result_ttl):
        raise RunLostError(run_id)
    raise HTTPException(status.HTTP_404_NOT_FOUND, f"no run {run_id!r}")


async def _until_client_leaves(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        continue


def _json(model: RunPublic, status_code: int = status.HTTP_200_OK) -> Response:
    """The model as JSON, as FastAPI would send it, without its dump-validate-encode round (a run can be large)."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


def _skill_ref(services: Services, team: Team, name: str) -> SkillRef:
    return services.repository_for(team).skill_ref(name)


def _check_secrets(services: Services, team: Team, skill: str, names: list[str]) -> None:
    """A run may name only secrets its skill declares and the team has stored (400 otherwise, naming them)."""
    problems = [problem for name in names if (problem := env_name_problem(name)) is not None]
    if problems:
        raise HTTPException(422, f"secrets: {problems[0]}")
    declared = services.repository_for(team).get(skill).secrets
    undeclared = [name for name in names if name not in declared]
    if undeclared:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"skill {skill!r} does not declare the secret "
                            f"{', '.join(undeclared)} (it declares: {', '.join(declared) or 'none'}; metadata.secrets "
                            f"in its SKILL.md)")
    if services.secrets is None:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "secrets are not set up on this server: its operator sets "
                                                         "SKILLRUN_SECRETS_KEY")
    try:
        stored = {info.name for info in services.secrets.list(team.id)}
    except SecretError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    missing = [name for name in names if name not in stored]
    if missing:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"the team has no secret {', '.join(missing)}: store it with "
                            f"PUT /v1/secrets/<name> or skillrun secrets set")


def _egress(services: Services, team: Team, skill: str) -> list[str]:
    """The hosts a run of ``skill`` may reach: those its skill declares (``metadata.egress``) and its team allows
    (``orchestrator.egress``); the caller cannot set them."""
    allowed = EgressStore(services.teams.docs).get(team.id).entries  # read first: most teams have none
    return effective(services.repository_for(team).get(skill).egress, allowed) if allowed else []


BUILT_AHEAD = (RuntimeName.LOCAL, RuntimeName.DOCKER)
"""Runtimes whose environments the API can see before a run (the Cube runtime's are built in each sandbox)."""
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
    return _json(RunPublic.of(await accept_run(body, team, services)), status.HTTP_202_ACCEPTED)


async def accept_run(body: RunCreate, team: Team, services: Services) -> RunRecord:
    """Check and submit a team's run (what ``POST /v1/runs`` and the console's run form do); refusals are
    HTTP exceptions saying what was wrong."""
    try:
        ref = await asyncio.to_thread(_skill_ref, services, team, body.skill)  # reads the team's library records
    except SkillNotFoundError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    if body.secrets:
        await asyncio.to_thread(_check_secrets, services, team, body.skill, body.secrets)
    if not body.wait_for_environment and body.runtime in BUILT_AHEAD:
        environment = await asyncio.to_thread(services.environments.skill_status, ref, body.runtime.value)
        if environment.state not in ("ready", "none"):
            raise HTTPException(status.HTTP_409_CONFLICT, not_ready(body.skill, environment))
    egress = await asyncio.to_thread(_egress, services, team, body.skill)
    fields = body.model_dump(exclude={"skill", "inputs", "priority", "workspace_id", "keep_workspace"})
    keep = body.workspace_id is not None if body.keep_workspace is None else body.keep_workspace
    try:
        request = RunRequest(
            skill=ref, inputs=[InputFile(name=i.name, content=i.content) for i in body.inputs],
            workspace_id=f"{team.id}.{body.workspace_id or uuid.uuid4().hex[:16]}", keep_workspace=keep,
            run_id=run_ids.mint(team.id), egress=egress, **fields,
        )
        validate_request(request)
        record = await services.dispatcher.submit(request, priority=body.priority, owner=team.id)
    except QuotaExceededError as exc:
        raise over_quota(exc) from exc
    except (ValueError, DispatchError, WorkerError) as exc:
        raise HTTPException(422, str(exc)) from exc
    return record


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
        _missing(services, run_id, team, await services.dispatcher.get(run_id) is None)
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


async def event_stream(services: Services, run_id: str) -> AsyncIterator[ServerSentEvent]:
    """A run's events until it ends, then ``closing``, ``lost`` or ``unavailable`` when it could not be followed."""
    last = None
    try:
        async for event in services.dispatcher.follow(run_id):
            last = event.type
            yield ServerSentEvent(event=event.type, data=event.model_dump())
    except RunLostError as exc:
        yield ServerSentEvent(event="lost", data={"reason": str(exc)})
        return
    except UnavailableError as exc:
        yield ServerSentEvent(event="unavailable", data={"reason": str(exc), "retry_after": exc.retry_after})
        return
    if last not in ENDING_EVENTS:
        yield ServerSentEvent(event="closing", data={"reason": "the API is shutting down; follow the run again"})


@router.get(f"/{{run_id}}/files/{FILE_NAME}", response_class=Response,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The file's bytes."}, **FOUND})
async def get_file(run_id: str = RunId, name: str = FileName, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> Response:
    """An output file of a finished run, with its MIME type (``X-Skillrun-Truncated`` when it was capped)."""
    return output_file(await team_run(services, run_id, team), name)


def output_file(record: RunRecord, name: str) -> Response:
    """The answer that sends output file ``name`` of a run (404 when it has none such, or kept no content)."""
    run_id = record.id
    found = next((f for f in (record.result.output_files if record.result else []) if f.name == name), None)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id!r} has no output file {name!r}")
    if found.encoding == "none":
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"{name!r} was collected without content; save it as an artifact")
    data = base64.b64decode(found.content) if found.encoding == "base64" else found.content.encode()
    return Response(data, media_type=found.mime_type, headers={
        "X-Skillrun-Truncated": str(found.truncated).lower(), **served_headers(found.mime_type, name)})


@router.get(f"/{{run_id}}/artifacts/{FILE_NAME}", response_class=StreamingResponse,
            responses={200: {"content": {"application/octet-stream": {}}, "description": "The artifact's bytes."}, **FOUND})
async def get_artifact(run_id: str = RunId, name: str = FileName, team: Team = Depends(current_team), services: Services = Depends(get_services)) -> StreamingResponse:
    """An artifact a run saved, byte for byte, with its MIME type and length, streamed from the artifact store (404
    when the store no longer has it, 503 when the store cannot be reached)."""
    return await artifact_file(services, await team_run(services, run_id, team), name)


async def artifact_file(services: Services, record: RunRecord, name: str) -> StreamingResponse:
    """The answer that streams artifact ``name`` of a run from the artifact store."""
    run_id = record.id
    found = next((a for a in (record.result.artifact_files if record.result else []) if a.name == name), None)
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"run {run_id!r} has no artifact {name!r}")
    try:
        opened = await asyncio.to_thread(services.artifact_store.open, record.request.workspace_id, name, found.version)
    except BlobStoreError as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc),
                            headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS)}) from exc
    except ArtifactError as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from exc
    return StreamingResponse(opened.chunks(), media_type=found.mime_type, headers={
        "Content-Length": str(opened.size), **served_headers(found.mime_type, name)})
