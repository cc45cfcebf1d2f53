"""``GET /healthz``."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from orchestrator.api.schemas import Health
from orchestrator.api.services import Services, get_services

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz(services: Services = Depends(get_services)) -> Health:
    """Liveness, and how many skills the library offers."""
    return Health(status="ok", skills=len(services.repository.summaries()))
