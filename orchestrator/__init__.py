"""Skillrun's control plane: skills and three-tier injection, agents, models, tools, sessions, dispatch, the API.

Import paths follow the guide's SDK with ``trpc_agent_sdk`` replaced by ``orchestrator``
(``orchestrator.agents.LlmAgent``, ``orchestrator.skills.create_default_skill_repository``,
``orchestrator.code_executors.create_local_workspace_runtime``, ...). The root package itself exports only the
settings and the error tree, so importing any one part stays cheap.
"""

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

__all__ = [
    "DispatchError",
    "McpConnectionError",
    "ModelError",
    "OrchestratorError",
    "SessionError",
    "Settings",
    "SkillError",
    "SkillNotFoundError",
    "SkillValidationError",
    "SkillsRootNotFoundError",
    "ToolError",
    "get_settings",
]
