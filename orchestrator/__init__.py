"""Skillrun's control plane: skills and three-tier injection, agents, models, tools, sessions, dispatch, the API.

Import paths follow the guide's SDK with ``trpc_agent_sdk`` replaced by ``orchestrator``
(``orchestrator.agents.LlmAgent``, ``orchestrator.skills.create_default_skill_repository``,
``orchestrator.code_executors.create_local_workspace_runtime``, ...). The root package itself exports only the
settings and the error tree, each imported on first use, so importing any one part (or ``skillrun --help``)
stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "orchestrator.config": ["Settings", "get_settings"],
    "orchestrator.errors": ["DispatchError", "McpConnectionError", "ModelError", "OrchestratorError", "SessionError",
                            "SkillError", "SkillNotFoundError", "SkillsRootNotFoundError", "SkillValidationError",
                            "ToolError"],
})

if TYPE_CHECKING:
    from orchestrator.config import Settings, get_settings
    from orchestrator.errors import (
        DispatchError,
        McpConnectionError,
        ModelError,
        OrchestratorError,
        SessionError,
        SkillError,
        SkillNotFoundError,
        SkillsRootNotFoundError,
        SkillValidationError,
        ToolError,
    )
