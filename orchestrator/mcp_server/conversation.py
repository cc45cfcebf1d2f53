"""``Conversation``: what Skillrun keeps for one MCP session — its skill state, its owner, its workspace.

An MCP client's session plays the part an agent's session plays for the skill tools: ``skill_load`` and the
selections are recorded in its state, and every ``skill_run`` of the session goes to one workspace
(``workspace_id_for(owner, conversation id)``), so ``work/`` and ``out/`` persist across its calls. The first call
binds the session to the team that made it; a call with another team's key is refused. When the session ends (the
client closes it or goes away, the HTTP session idles out, the stdio server stops) its runs still going are
cancelled and its workspace is removed.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.context import InvocationContext
from orchestrator.errors import OrchestratorError
from orchestrator.dispatch import BaseDispatcher, WorkspaceConflictError
from orchestrator.sessions.session import Session, apply_delta
from orchestrator.skills.options import SkillLoadMode, SkillOptions
from orchestrator.skills.repository import BaseSkillRepository
from orchestrator.skills.tools.skill_toolset import workspace_id_for

logger = logging.getLogger(__name__)

APP_NAME = "skillrun-mcp"
REMOVAL_TRIES = 20
REMOVAL_PAUSE_SECONDS = 0.25


@dataclass(frozen=True)
class Scope:
    """What a caller of the MCP server may use: its team's skills, the dispatcher runs go through, the owner
    (team) its runs and workspaces are filed under."""

    repository: BaseSkillRepository
    dispatcher: BaseDispatcher
    owner: str
    egress: Callable[[str], list[str]] | None = None
    """The control plane's look-up of a team's egress allow-list (``SkillToolSet``'s ``egress``); none: no network."""


@dataclass(frozen=True)
class McpCaller:
    """Stands for the agent in the skill tools' context: an MCP client has no system message, so loaded skills and
    selected docs come back in tool results, and stay loaded for the session."""

    name: str = "mcp-client"
    skill_options: SkillOptions = SkillOptions(load_mode=SkillLoadMode.SESSION, content_in_tool_results=True)


CALLER = McpCaller()


class ForeignSessionError(OrchestratorError, PermissionError):
    """A call on an MCP session another team opened."""


class Conversation:
    """One MCP session's state (see the module docstring)."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.owner: str | None = None
        self.state: dict[str, Any] = {}
        self._workspace: tuple[BaseDispatcher, str] | None = None

    def claim(self, scope: Scope) -> None:
        """Bind the session to ``scope``'s owner on its first call; refuse calls of any other."""
        if self.owner is None:
            self.owner = scope.owner
        elif self.owner != scope.owner:
            raise ForeignSessionError("this MCP session belongs to another team: open a session of your own")

    def context(self, scope: Scope) -> InvocationContext:
        """A context for one tool call of this session."""
        session = Session(id=self.id, app_name=APP_NAME, user_id=scope.owner, state=self.state)
        return InvocationContext(session=session, agent=CALLER)  # type: ignore[arg-type]

    def will_run(self, scope: Scope) -> None:
        """Note, before a run starts, the workspace it makes: the session removes it when it ends."""
        self._workspace = (scope.dispatcher, workspace_id_for(scope.owner, self.id))

    def record(self, context: InvocationContext) -> None:
        """Keep what a call changed in the session's state."""
        apply_delta(self.state, context.actions.state_delta)

    async def end(self) -> None:
        """Remove the session's workspace (its runs, cancelled as the session's calls were, may take a moment to
        leave it)."""
        if self._workspace is None:
            return
        dispatcher, workspace_id = self._workspace
        for _ in range(REMOVAL_TRIES):
            try:
                await dispatcher.remove_workspace(workspace_id)
                return
            except WorkspaceConflictError:
                await asyncio.sleep(REMOVAL_PAUSE_SECONDS)
            except Exception:  # the idle reaper removes it later
                logger.warning("removing the workspace %s of an ended MCP session failed", workspace_id, exc_info=True)
                return
        logger.warning("the workspace %s of an ended MCP session is still busy; the idle reaper removes it", workspace_id)
