"""The FastAPI application: ``create_app(settings)`` builds it, tests pass their own parts."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from orchestrator.api.limits import BodyLimitMiddleware
from orchestrator.api.mcp import McpEndpoint
from orchestrator.api.responses import error_responses, install_error_handlers
from orchestrator.api.routes import (
    egress,
    health,
    libraries,
    metrics,
    quota,
    runs,
    secrets,
    sessions,
    skills,
    worker_libraries,
    workspaces,
)
from orchestrator.assistant import create_assistant, create_session_service
from orchestrator.config import Settings, get_settings, libraries_dir
from orchestrator.console import (
    BaseConsoleSessions,
    MemoryConsoleSessions,
    RedisConsoleSessions,
    mount_console,
)
from orchestrator.dispatch import dispatcher_for, secret_store_for
from orchestrator.documents import create_documents
from orchestrator.egress import EgressStore
from orchestrator.libraries import LibraryRegistry
from orchestrator.mcp_server import McpCaps
from orchestrator.quotas import Quotas
from orchestrator.services import Services
from orchestrator.skills import create_default_skill_repository
from orchestrator.teams import TeamStore
from worker.config import get_worker_settings
from worker.errors import SecretError
from worker.roots import FetchLimits
from worker.validation import run_ceilings


def build_services(settings: Settings) -> Services:
    """With ``SKILLRUN_REDIS_URL`` runs go onto the queue for ``skillrun worker`` processes and sessions live in
    Redis; without it (the embedded default) runs execute in this process and sessions are files. Artifacts are
    served from the store ``SKILLRUN_BLOB_URL`` or ``SKILLRUN_ARTIFACTS_DIR`` names (the workers' own)."""
    repository = create_default_skill_repository(settings.skills_roots(), use_cached_repository=True)
    documents = create_documents(settings)
    dispatcher, artifacts = dispatcher_for(settings)
    dispatcher.quotas = Quotas(documents, settings.default_quota())
    secret_store = getattr(dispatcher, "secrets", None) or secret_store_for(settings)  # the inline runs' own
    if secret_store.box is None and secret_store.any_stored():
        raise SecretError("secrets are stored but SKILLRUN_SECRETS_KEY is not set: start the API with the key they "
                          "were stored with")
    return Services(
        repository=repository,
        dispatcher=dispatcher,
        session_service=create_session_service(settings),
        agent_factory=lambda repo: create_assistant(settings, repo, dispatcher,
                                                    egress=lambda team: EgressStore(documents).get(team).entries),
        app_name=settings.app_name,
        artifact_store=artifacts,
        teams=TeamStore(documents),
        libraries=LibraryRegistry(
            documents, libraries_dir(settings), FetchLimits(allow_private_addresses=settings.allow_private_library_urls),
            versions_kept=settings.library_versions_kept, max_libraries=settings.max_libraries_per_team,
        ),
        worker_token=settings.worker_token,
        secrets=secret_store,
    )


def console_sessions_for(settings: Settings) -> BaseConsoleSessions:
    """Console sign-ins: in Redis when configured (every API process shares them), else in this process."""
    options = {"ttl_seconds": settings.console_session_seconds, "per_team": settings.console_sessions_per_team}
    if settings.redis_url:
        return RedisConsoleSessions(settings.redis_url, **options)
    return MemoryConsoleSessions(**options)


def _on_stop_signals(stop: Callable[[], None]) -> Callable[[], None]:
    """Call ``stop`` as soon as SIGTERM or SIGINT arrives, before the server (uvicorn) waits for open requests to
    end, so that waits answer and event streams close at once; then the server's own handler runs. Returns what
    puts the handlers back. Signals reach only the main thread: elsewhere (a server in a test's thread) nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    loop = asyncio.get_running_loop()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig, handler in previous.items():
        if callable(handler):
            def chained(signum: int, frame: object, handler: Callable = handler) -> None:
                loop.call_soon_threadsafe(stop)
                handler(signum, frame)

            signal.signal(sig, chained)

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def create_app(settings: Settings | None = None, services: Services | None = None) -> FastAPI:
    settings = settings or get_settings()
    services = services or build_services(settings)

    console = console_sessions_for(settings)
    mcp = McpEndpoint(
        services, McpCaps(settings.mcp_output_file_bytes, settings.mcp_output_total_bytes),
        idle_seconds=settings.mcp_session_idle_seconds, max_sessions=settings.mcp_max_sessions,
        team_sessions=settings.mcp_max_sessions_per_team,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        dispatcher = services.dispatcher
        dispatcher.start()  # runs nobody reads still get recovered when their worker dies
        restore_signals = _on_stop_signals(dispatcher.stop_waiting)
        async with mcp.run():
            yield
        restore_signals()
        dispatcher.stop_waiting()
        await services.close()
        await console.aclose()

    app = FastAPI(
        title="Skillrun",
        version="0.1.0",
        description="Run Agent Skills safely: skill libraries, agent sessions, isolated runs. The team's skill "
                    "library is also served to MCP clients at /mcp (streamable HTTP, the same bearer key), and "
                    "the web console at /ui (sign in with the same key).",
        lifespan=lifespan,
        responses=error_responses(503),
    )
    app.state.services = services
    for module in (health, metrics, libraries, skills, runs, sessions, workspaces, secrets, egress, quota,
                   worker_libraries):
        app.include_router(module.router)
    app.add_route("/mcp", mcp, methods=["GET", "POST", "DELETE"], include_in_schema=False)
    app.add_middleware(BodyLimitMiddleware)
    install_error_handlers(app)
    mount_console(app, console)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = declare_workspace_refusals(declare_ceilings(FastAPI.openapi(app)))
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def declare_workspace_refusals(document: dict[str, Any]) -> dict[str, Any]:
    """A submitted run's 409 also covers its kept workspace refusing it (``WorkspaceConflictError``)."""
    conflict = document["paths"]["/v1/runs"]["post"]["responses"]["409"]
    conflict["description"] += (" Or its kept workspace cannot take it: the team keeps SKILLRUN_MAX_WORKSPACES_PER_TEAM "
                                "workspaces (remove one first), the workspace is being removed, or it lives on another "
                                "runtime.")
    return document


def declare_ceilings(document: dict[str, Any]) -> dict[str, Any]:
    """The run schemas' maxima lowered to this server's ceilings (``SKILLRUN_MAX_*``), which the API enforces."""
    schemas = document["components"]["schemas"]
    for path, ceiling in run_ceilings(get_worker_settings()).items():
        owner, _, name = path.rpartition(".")
        prop = schemas["RunLimits" if owner == "limits" else "RunCreate"]["properties"][name]
        prop["maximum"] = min(prop.get("maximum", ceiling), ceiling)
    return document
