"""What the API's routes use, built once per app from the settings (or given by a test)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request
from pydantic import SecretStr

from orchestrator.agents.base import BaseAgent
from orchestrator.api.environments import LibraryEnvironments, environments_for
from orchestrator.dispatch import BaseDispatcher
from orchestrator.libraries import LibraryRegistry
from orchestrator.runners import Runner
from orchestrator.sessions import BaseSessionService
from orchestrator.skills import BaseSkillRepository, CachedSkillRepository
from orchestrator.teams import Team, TeamStore
from worker.artifacts import BaseArtifactStore
from worker.secrets import SecretStore

AgentFactory = Callable[[BaseSkillRepository], BaseAgent]


@dataclass
class Services:
    repository: BaseSkillRepository
    """The server's own library, for teams that registered none."""
    dispatcher: BaseDispatcher
    session_service: BaseSessionService
    agent_factory: AgentFactory
    app_name: str
    artifact_store: BaseArtifactStore
    teams: TeamStore
    libraries: LibraryRegistry
    environments: LibraryEnvironments | None = None
    """Skills' dependency environments and who builds them; by default as the dispatcher runs (``environments_for``)."""
    worker_token: SecretStr | None = None
    """What workers show to fetch library archives (``/v1/worker/…``); ``None`` turns those routes off."""
    secrets: SecretStore | None = None
    """The teams' secrets (``PUT /v1/secrets/{name}``); by default the inline dispatcher's (none: the routes say
    secrets are not set up)."""
    _repositories: dict[tuple[str, ...], BaseSkillRepository] = field(default_factory=dict)
    _agents: dict[int, BaseAgent] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.environments is None:
            self.environments = environments_for(self.dispatcher)
        if self.secrets is None:  # the inline dispatcher's, where runs get theirs
            self.secrets = getattr(self.dispatcher, "secrets", None)

    def repository_for(self, team: Team) -> BaseSkillRepository:
        """The skills a team sees: the current versions of its libraries, or the server's library if it has none."""
        roots = tuple(str(r) for r in self.libraries.current_roots(team.id))
        if not roots:
            return self.repository
        if roots not in self._repositories:
            self._repositories[roots] = CachedSkillRepository(list(roots))
        return self._repositories[roots]

    def agent_for(self, team: Team) -> BaseAgent:
        repository = self.repository_for(team)
        if id(repository) not in self._agents:
            self._agents[id(repository)] = self.agent_factory(repository)
        return self._agents[id(repository)]

    def runner(self, team: Team) -> Runner:
        return Runner(app_name=self.app_name, agent=self.agent_for(team), session_service=self.session_service)

    async def close(self) -> None:
        await self.environments.close()  # first: its builds use the dispatcher's runtime
        for agent in self._agents.values():
            await agent.close()
        await self.session_service.close()
        await self.dispatcher.close()
        self.teams.docs.close()


async def get_services(request: Request) -> Services:
    """The app's services (a coroutine, so FastAPI resolves it without a worker-thread hop)."""
    return request.app.state.services
