"""Agent Skills on the control plane: parsing, repositories, three-tier injection, the skill tool sets."""

from orchestrator.skills.repository import (
    BaseSkillRepository,
    CachedSkillRepository,
    FsSkillRepository,
    SkillProblem,
    create_default_skill_repository,
)
from orchestrator.skills.skill import Skill, SkillDoc, SkillSummary, load_skill, parse_tools
from orchestrator.skills.tools import DynamicSkillToolSet, SkillToolSet

__all__ = [
    "BaseSkillRepository",
    "CachedSkillRepository",
    "DynamicSkillToolSet",
    "FsSkillRepository",
    "Skill",
    "SkillDoc",
    "SkillProblem",
    "SkillSummary",
    "SkillToolSet",
    "create_default_skill_repository",
    "load_skill",
    "parse_tools",
]
