"""Kept workspaces: list the team's, read one, remove one.

A workspace is kept when a run names a ``workspace_id`` (or asks ``keep_workspace``) and an agent session's runs
use one; it is removed when unused for ``SKILLRUN_WORKSPACE_IDLE_SECONDS``, when its session is deleted, or here.
Removal is refused (409) while runs are queued or running in it. In the embedded default it is removed before the
answer (204); with Redis a worker of its runtime removes it (202: listed ``removing`` until it is gone).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Path, Query, Response, status

from orchestrator.api.auth import current_team
from orchestrator.api.deps import get_services
from orchestrator.api.responses import ErrorPublic, error_responses
from orchestrator.schemas import WORKSPACE_ID, WorkspacePublic, WorkspacesPublic
from orchestrator.services import Services, remove_workspace, team_workspace
from orchestrator.teams import Team
from worker.run_store import WorkspaceEntry

router = APIRouter(prefix="/v1/workspaces", tags=["workspaces"], responses=error_responses(401, 422))

MAX_OFFSET = 1_000_000
WorkspaceId = Path(pattern=WORKSPACE_ID, description="The workspace's id, as listed: <team>.<workspace_id>.")
BUSY = {409: {"model": ErrorPublic, "description": "Runs are queued or running in it; the message names them."}}
HANDED_OVER = {202: {"model": WorkspacePublic, "description": "A worker of its runtime removes it (state removing)."}}


async def removed(services: Services, entry: WorkspaceEntry) -> Response:
    """The answer to removing ``entry``'s workspace: 204 once gone, 202 when a worker removes it."""
    marked = await remove_workspace(services, entry)
    if marked is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    public = WorkspacePublic.of(marked, services.dispatcher.workspace_idle_seconds)
    return Response(public.model_dump_json(), status.HTTP_202_ACCEPTED, media_type="application/json")


@router.get("", response_model=WorkspacesPublic)
async def list_workspaces(
    offset: int = Query(default=0, ge=0, le=MAX_OFFSET),
    limit: int = Query(default=100, ge=1, le=1000),
    team: Team = Depends(current_team),
    services: Services = Depends(get_services),
) -> WorkspacesPublic:
    """The team's kept workspaces, oldest first, a page at a time."""
    entries, total = await services.dispatcher.list_workspaces(team.id, offset, limit)
    idle = services.dispatcher.workspace_idle_seconds
    following = offset + len(entries)
    return WorkspacesPublic(data=[WorkspacePublic.of(e, idle) for e in entries], count=len(entries), total=total,
                            next_offset=following if entries and following < total else None)


@router.get("/{workspace_id}", response_model=WorkspacePublic, responses=error_responses(404))
async def get_workspace(
    workspace_id: str = WorkspaceId, team: Team = Depends(current_team), services: Services = Depends(get_services)
) -> WorkspacePublic:
    """One of the team's kept workspaces."""
    entry = await team_workspace(services, workspace_id, team)
    return WorkspacePublic.of(entry, services.dispatcher.workspace_idle_seconds)


@router.delete("/{workspace_id}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response,
               responses={**HANDED_OVER, **error_responses(404), **BUSY})
async def delete_workspace(
    workspace_id: str = WorkspaceId, team: Team = Depends(current_team), services: Services = Depends(get_services)
) -> Response:
    """Remove a kept workspace and everything in it (folder, user id, container, sandbox); output files and artifacts
    of its runs stay readable through the runs. 409 while runs are queued or running in it."""
    return await removed(services, await team_workspace(services, workspace_id, team))
