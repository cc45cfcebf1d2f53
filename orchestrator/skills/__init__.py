"""Agent Skills on the control plane: parsing, repositories, and (from ``.tools``) the stagers."""

from orchestrator.skills.repository import (
    BaseSkillRepository,
    CachedSkillRepository,
    FsSkillRepository,
    SkillProblem,
    create_default_skill_repository,
)
from orchestrator.skills.skill import Skill, SkillDoc, SkillSummary, load_skill, parse_tools

__all__ = [
    "BaseSkillRepository",
    "CachedSkillRepository",
    "FsSkillRepository",
    "Skill",
    "SkillDoc",
    "SkillProblem",
    "SkillSummary",
    "create_default_skill_repository",
    "load_skill",
    "parse_tools",
]
