"""``GET /healthz``: 200 while the API can serve runs, 503 (with the reason) while Redis cannot be reached."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Depends

from orchestrator.api.deps import get_services
from orchestrator.schemas import Health
from orchestrator.services import Services

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
async def healthz(services: Services = Depends(get_services)) -> Health:
    """Health: the run store answers (503 otherwise), and how many skills the library offers."""
    await services.dispatcher.ping()
    return Health(status="ok", skills=len(await asyncio.to_thread(services.repository.summaries)))
