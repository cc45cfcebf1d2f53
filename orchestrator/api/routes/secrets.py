"""Team secrets, write-only: store one (``PUT``), list them by name and date, remove one. No route returns a value.

A run names the secrets it needs (``RunCreate.secrets``); each must be declared by its skill (``metadata.secrets``)
and stored for the team. The values reach the command's environment only, and are taken out of everything the run
gives back (``worker.secrets``).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends, HTTPException, Path, Response, status

from orchestrator.api.auth import current_team
from orchestrator.api.deps import get_services
from orchestrator.api.responses import error_responses
from orchestrator.schemas import SecretSet, SecretsPublic
from orchestrator.services import Services
from orchestrator.teams import Team
from worker.errors import SecretError
from worker.names import ENV_NAME, MAX_ENV_NAME_CHARS
from worker.secrets import SecretInfo, SecretStore

router = APIRouter(prefix="/v1/secrets", tags=["secrets"], responses=error_responses(401, 403, 422))

SecretName = Path(pattern=ENV_NAME.pattern, max_length=MAX_ENV_NAME_CHARS, description="The secret's name (a shell "
                                                                                          "variable name).")


def _store(services: Services) -> SecretStore:
    if services.secrets is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "secrets are off on this server: its operator sets "
                                                       "SKILLRUN_SECRETS_KEY")
    return services.secrets


@router.get("", response_model=SecretsPublic, responses=error_responses(400))
async def list_secrets(team: Team = Depends(current_team), services: Services = Depends(get_services)) -> SecretsPublic:
    """The team's secrets: names and dates."""
    try:
        found = await asyncio.to_thread(_store(services).list, team.id)
    except SecretError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    return SecretsPublic(data=found, count=len(found))


@router.put("/{name}", response_model=SecretInfo, responses=error_responses(400))
async def set_secret(
    body: SecretSet, name: str = SecretName, team: Team = Depends(current_team),
    services: Services = Depends(get_services),
) -> SecretInfo:
    """Store (or replace) a secret's value, encrypted; the answer holds its name and dates, never the value."""
    try:
        return await asyncio.to_thread(_store(services).set, team.id, name, body.value.get_secret_value())
    except SecretError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=error_responses(400, 404))
async def remove_secret(
    name: str = SecretName, team: Team = Depends(current_team), services: Services = Depends(get_services)
) -> Response:
    try:
        removed = await asyncio.to_thread(_store(services).remove, team.id, name)
    except SecretError as exc:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(exc)) from exc
    if not removed:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"the team has no secret {name}")
    return Response(status_code=status.HTTP_204_NO_CONTENT)
