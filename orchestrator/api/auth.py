"""API keys: every ``/v1`` route needs ``Authorization: Bearer <team key>``; a missing, wrong or revoked key is
answered 401. Routes get the caller's team and show it only its own objects (others' ids answer 404).

The worker routes (``/v1/worker/…``) take the workers' token instead (``SKILLRUN_WORKER_TOKEN``, compared in constant
time); no team key opens them, and without a token configured they answer 403 (401 without credentials)."""

from __future__ import annotations

import asyncio
import hmac

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from orchestrator.api.deps import get_services
from orchestrator.services import Services
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


async def current_worker(
    credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    services: Services = Depends(get_services),
) -> None:
    if credentials is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing worker token: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})
    if services.worker_token is None:
        raise HTTPException(status.HTTP_403_FORBIDDEN, "worker routes are off: set SKILLRUN_WORKER_TOKEN on the API "
                                                       "and on its workers")
    if not hmac.compare_digest(credentials.credentials.encode(), services.worker_token.get_secret_value().encode()):
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "wrong worker token (SKILLRUN_WORKER_TOKEN must match the "
                                                          "API's)", headers={"WWW-Authenticate": "Bearer"})
