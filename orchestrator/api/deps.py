"""What the API's and the console's routes are given (FastAPI dependencies)."""

from __future__ import annotations

from fastapi import Request

from orchestrator.services import Services


async def get_services(request: Request) -> Services:
    """The app's services (a coroutine, so FastAPI resolves it without a worker-thread hop)."""
    return request.app.state.services
