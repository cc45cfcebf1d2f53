"""API keys: every ``/v1`` route needs ``Authorization: Bearer <team key>``; a missing, wrong or revoked key is
answered 401. Routes get the caller's team and show it only its own objects (others' ids answer 404)."""

from __future__ import annotations

import asyncio

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from orchestrator.api.services import Services, get_services
from orchestrator.teams import Team

bearer = HTTPBearer(auto_error=False, description="A team API key: skillrun keys create TEAM")


async def current_team(
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    services: Services = Depends(get_services),
) -> Team:
    if credentials is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing API key: send 'Authorization: Bearer <key>'",
                            headers={"WWW-Authenticate": "Bearer"})
    team = await asyncio.to_thread(services.teams.authenticate, credentials.credentials)  # reads the key store
    if team is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"})
    return team
