"""Building the API for tests: services with teams, libraries and an inline (or queue) dispatcher."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import uvicorn

from orchestrator.api import create_app
from orchestrator.assistant import create_assistant
from orchestrator.cli.serve import server_config
from orchestrator.config import Settings
from orchestrator.documents import FileDocuments
from orchestrator.libraries import LibraryRegistry
from orchestrator.services import Services
from orchestrator.sessions import BaseSessionService, InMemorySessionService
from orchestrator.skills import create_default_skill_repository
from orchestrator.teams import TeamStore
from tests.services import free_port
from worker.artifacts import BaseArtifactStore
from worker.roots.archives import FetchLimits

LIBRARY = Path(__file__).resolve().parents[2] / "skills"


def make_services(dispatcher, artifact_store: BaseArtifactStore, data_dir: Path, *, model_url: str = "http://127.0.0.1:9/v1",
                  session_service: BaseSessionService | None = None, documents=None) -> Services:
    settings = Settings(model="m", openai_api_key="k", openai_base_url=model_url)
    documents = documents or FileDocuments(data_dir / "registry")
    return Services(
        repository=create_default_skill_repository(str(LIBRARY), use_cached_repository=True),
        dispatcher=dispatcher,
        session_service=session_service or InMemorySessionService(),
        agent_factory=lambda repo: create_assistant(settings, repo, dispatcher),
        app_name="skillrun",
        artifact_store=artifact_store,
        teams=TeamStore(documents),
        libraries=LibraryRegistry(documents, data_dir / "libraries", FetchLimits(allow_private_addresses=True)),
    )


def new_team(services: Services, name: str) -> str:
    """Create team ``name`` (if needed) and return a fresh key for it."""
    if services.teams.get_team(name) is None:
        services.teams.create_team(name)
    return services.teams.create_key(name)[1]


def client(services: Services, key: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=create_app(services=services)), base_url="http://t",
                             headers=headers)


@contextlib.contextmanager
def api_in_a_thread(services: Services) -> Iterator[str]:
    """The app under uvicorn on loopback (real connections, so a client can leave), in a thread of this process;
    its URL."""
    server = uvicorn.Server(server_config(create_app(services=services), "127.0.0.1", free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive(), "the API did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
