"""Agent Skills on the control plane: parsing, repositories, search, three-tier injection, the skill tool sets."""

from orchestrator.skills.filtered import FilteredSkillRepository
from orchestrator.skills.options import SkillLoadMode, SkillOptions
from orchestrator.skills.overview import Overview, build_overview
from orchestrator.skills.repository import (
    BaseSkillRepository,
    CachedSkillRepository,
    FsSkillRepository,
    SkillProblem,
    create_default_skill_repository,
)
from orchestrator.skills.search import SkillHit, SkillIndex
from orchestrator.skills.skill import (
    Skill,
    SkillDoc,
    SkillSummary,
    load_skill,
    parse_tools,
)
from orchestrator.skills.tools import DynamicSkillToolSet, SkillToolSet

__all__ = [
    "BaseSkillRepository",
    "CachedSkillRepository",
    "DynamicSkillToolSet",
    "FilteredSkillRepository",
    "FsSkillRepository",
    "Overview",
    "Skill",
    "SkillDoc",
    "SkillHit",
    "SkillIndex",
    "SkillLoadMode",
    "SkillOptions",
    "SkillProblem",
    "SkillSummary",
    "SkillToolSet",
    "build_overview",
    "create_default_skill_repository",
    "load_skill",
    "parse_tools",
]
