"""What the API's routes use, built once per app from the settings (or given by a test)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Request

from orchestrator.agents.base import BaseAgent
from orchestrator.dispatch import BaseDispatcher
from orchestrator.runners import Runner
from orchestrator.sessions import BaseSessionService
from orchestrator.skills import BaseSkillRepository
from worker.artifacts import FileArtifactStore

DEFAULT_USER = "default"
"""Whose sessions a request touches until requests carry team API keys."""


@dataclass
class Services:
    repository: BaseSkillRepository
    dispatcher: BaseDispatcher
    session_service: BaseSessionService
    agent: BaseAgent
    app_name: str
    artifact_store: FileArtifactStore

    def runner(self) -> Runner:
        return Runner(app_name=self.app_name, agent=self.agent, session_service=self.session_service)

    async def close(self) -> None:
        await self.agent.close()
        await self.session_service.close()
        await self.dispatcher.close()


def get_services(request: Request) -> Services:
    return request.app.state.services
