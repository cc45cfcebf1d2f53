"""Skillrun's control plane: skill repositories and three-tier injection, dispatch of runs, the CLI.

Import paths follow the guide's SDK with ``trpc_agent_sdk`` replaced by ``orchestrator``
(``orchestrator.skills.create_default_skill_repository``, ``orchestrator.code_executors.create_local_workspace_runtime``).
"""

from orchestrator.config import Settings, get_settings
from orchestrator.dispatch import BaseDispatcher, InlineDispatcher
from orchestrator.errors import (
    DispatchError,
    OrchestratorError,
    SkillError,
    SkillNotFoundError,
    SkillsRootNotFoundError,
    SkillValidationError,
)

__all__ = [
    "BaseDispatcher",
    "DispatchError",
    "InlineDispatcher",
    "OrchestratorError",
    "Settings",
    "SkillError",
    "SkillNotFoundError",
    "SkillValidationError",
    "SkillsRootNotFoundError",
    "get_settings",
]
