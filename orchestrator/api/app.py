"""The FastAPI application: ``create_app(settings)`` builds it, tests pass their own parts."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from orchestrator.api.routes import health, sessions
from orchestrator.api.services import Services
from orchestrator.assistant import create_assistant, create_session_service
from orchestrator.code_executors import create_local_workspace_runtime
from orchestrator.config import Settings, get_settings
from orchestrator.dispatch import InlineDispatcher
from orchestrator.skills import create_default_skill_repository


def build_services(settings: Settings) -> Services:
    """The embedded default: runs execute in this process; sessions in Redis or in files."""
    repository = create_default_skill_repository(settings.skills_roots(), use_cached_repository=True)
    dispatcher = InlineDispatcher({"local": create_local_workspace_runtime(settings.work_root)})
    return Services(
        repository=repository,
        dispatcher=dispatcher,
        session_service=create_session_service(settings),
        agent=create_assistant(settings, repository, dispatcher),
        app_name=settings.app_name,
    )


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    settings = settings or get_settings()
    services = services or build_services(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await services.close()

    app = FastAPI(
        title="Skillrun",
        version="0.1.0",
        description="Run Agent Skills safely: skill libraries, agent sessions, isolated runs.",
        lifespan=lifespan,
    )
    app.state.services = services
    app.include_router(health.router)
    app.include_router(sessions.router)
    return app
