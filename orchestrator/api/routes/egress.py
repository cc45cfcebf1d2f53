"""A team's egress allow-list, read-only: the hosts its runs may reach (within what each skill declares in
``metadata.egress``). The operator sets it (``skillrun egress set``); a team cannot change it through the API."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from orchestrator.api.auth import current_team
from orchestrator.api.deps import get_services
from orchestrator.api.responses import error_responses
from orchestrator.egress import EgressList, EgressStore
from orchestrator.services import Services
from orchestrator.teams import Team

router = APIRouter(prefix="/v1/egress", tags=["egress"], responses=error_responses(401))


@router.get("", response_model=EgressList)
def get_egress(team: Team = Depends(current_team), services: Services = Depends(get_services)) -> EgressList:
    """The team's own egress allow-list (entries ``host:port`` or ``*.domain:port``; empty: its runs have no
    network). A run reaches the entries both its skill declares and this list allows."""
    return EgressStore(services.teams.docs).get(team.id)
