"""What every front end works with: the stores, the dispatchers and the agents, built once per app from the settings
(``orchestrator.api.app.build_services``) or given by a test."""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from pydantic import SecretStr

from orchestrator.agents.base import BaseAgent
from orchestrator.builds import LibraryEnvironments, environments_for
from orchestrator.dispatch import BaseDispatcher
from orchestrator.events import Event
from orchestrator.libraries import LibraryRegistry
from orchestrator.runners import Runner
from orchestrator.sessions import BaseSessionService
from orchestrator.skills import BaseSkillRepository, CachedSkillRepository
from orchestrator.teams import Team, TeamStore
from orchestrator.types import Content, Part
from worker.artifacts import BaseArtifactStore
from worker.secrets import SecretStore

AgentFactory = Callable[[BaseSkillRepository], BaseAgent]

TEAM_LIBRARIES_KEPT = 256
"""Teams whose repository (and agent) an API process keeps at once; the least recently used go first."""


@dataclass
class _TeamLibrary:
    """One team's skills at one set of library versions, and the agent built on them."""

    roots: tuple[str, ...]
    repository: BaseSkillRepository
    agent: BaseAgent | None = None
    turns: int = 0
    """Agent turns under way; a retired entry's agent is closed when the last one ends."""
    retired: bool = False


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
    team_libraries_kept: int = TEAM_LIBRARIES_KEPT
    _libraries: OrderedDict[str, _TeamLibrary] = field(default_factory=OrderedDict)
    """Per team, the repository of its current library versions: replaced when they change, and the least recently
    used dropped past ``team_libraries_kept``. A dropped entry's agent is closed once its turns have ended."""
    _lock: threading.RLock = field(default_factory=threading.RLock)  # repository_for also runs in worker threads
    _agent: BaseAgent | None = None
    """The agent on the server's own library."""
    _loop: asyncio.AbstractEventLoop | None = None
    _closing: set[asyncio.Task] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.environments is None:
            self.environments = environments_for(self.dispatcher)
        if self.secrets is None:  # the inline dispatcher's, where runs get theirs
            self.secrets = getattr(self.dispatcher, "secrets", None)

    def repository_for(self, team: Team) -> BaseSkillRepository:
        """The skills a team sees: the current versions of its libraries, or the server's library if it has none."""
        entry = self._library(team)
        return self.repository if entry is None else entry.repository

    async def turn(self, team: Team, session_id: str, text: str) -> AsyncIterator[Event]:
        """One agent turn in a team's session: the agent on the team's current skills answers ``text``."""
        self._loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._library(team)
            if entry is None:
                if self._agent is None:
                    self._agent = self.agent_factory(self.repository)
                agent = self._agent
            else:
                if entry.agent is None:
                    entry.agent = self.agent_factory(entry.repository)
                entry.turns += 1
                agent = entry.agent
        runner = Runner(app_name=self.app_name, agent=agent, session_service=self.session_service)
        try:
            async for event in runner.run_async(user_id=team.id, session_id=session_id,
                                                new_message=Content(parts=[Part.from_text(text)])):
                yield event
        finally:
            if entry is not None:
                with self._lock:
                    entry.turns -= 1
                    self._close_if_done(entry)

    def _library(self, team: Team) -> _TeamLibrary | None:
        roots = tuple(str(r) for r in self.libraries.current_roots(team.id))
        with self._lock:
            entry = self._libraries.get(team.id)
            if entry is not None and entry.roots == roots:
                self._libraries.move_to_end(team.id)
                return entry
            if entry is not None:
                self._retire(self._libraries.pop(team.id))
            if not roots:
                return None
            entry = self._libraries[team.id] = _TeamLibrary(roots, CachedSkillRepository(list(roots)))
            while len(self._libraries) > self.team_libraries_kept:
                self._retire(self._libraries.popitem(last=False)[1])
            return entry

    def _retire(self, entry: _TeamLibrary) -> None:
        entry.retired = True
        self._close_if_done(entry)

    def _close_if_done(self, entry: _TeamLibrary) -> None:
        """Close a retired entry's agent when no turn uses it (on the app's loop: this may run in a worker thread)."""
        if not entry.retired or entry.turns or entry.agent is None or self._loop is None:
            return
        agent, entry.agent = entry.agent, None
        self._loop.call_soon_threadsafe(self._close_agent, agent)

    def _close_agent(self, agent: BaseAgent) -> None:
        task = self._loop.create_task(agent.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        await self.environments.close()  # first: its builds use the dispatcher's runtime
        agents = [entry.agent for entry in self._libraries.values() if entry.agent is not None]
        for agent in [*agents, *([self._agent] if self._agent else [])]:
            await agent.close()
        await asyncio.gather(*self._closing)
        await self.session_service.close()
        await self.dispatcher.close()
        self.teams.docs.close()

