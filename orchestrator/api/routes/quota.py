"""A team's quota and what it uses of it, read-only: the operator sets quotas (``skillrun teams set-quota``)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, HTTPException, status
from pydantic import BaseModel, Field

from orchestrator.api.auth import current_team
from orchestrator.api.deps import get_services
from orchestrator.api.responses import error_responses
from orchestrator.quotas import QuotaUsage, TeamQuota
from orchestrator.services import Services
from orchestrator.teams import Team

router = APIRouter(prefix="/v1/quota", tags=["quota"], responses=error_responses(401))


class QuotaPublic(BaseModel):
    quota: TeamQuota = Field(description="The quota that holds for the team: its own over the operator's defaults "
                                         "(0: no limit; null: only the server's own ceilings).")
    usage: QuotaUsage


@router.get("", response_model=QuotaPublic, responses=error_responses(403))
async def get_quota(team: Team = Depends(current_team), services: Services = Depends(get_services)) -> QuotaPublic:
    """The team's quota and its usage now: runs queued and running, workspaces kept, environment builds going,
    artifacts kept and the room its runs going hold for theirs."""
    dispatcher = services.dispatcher
    if dispatcher.quotas is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "quotas are off on this server")
    quota = dispatcher.quotas.cached(team.id) or await asyncio.to_thread(dispatcher.quotas.of, team.id)
    queued, running = await dispatcher.usage(team.id)
    _, workspaces = await dispatcher.list_workspaces(team.id, 0, 1)
    builds = await asyncio.to_thread(services.environments.builds, team.id)
    kept, reserved = await dispatcher.artifact_usage(team.id)
    return QuotaPublic(quota=quota, usage=QuotaUsage(queued=queued, running=running, workspaces=workspaces,
                                                     builds=builds, artifact_bytes=kept,
                                                     artifact_bytes_reserved=reserved))
