"""Skill tools under the guide's import path: the tool sets and the stagers."""

from orchestrator.skills.tools.dynamic_toolset import DynamicSkillToolSet
from orchestrator.skills.tools.skill_toolset import SkillToolSet, workspace_id_for
from worker.workspaces import BaseSkillStager, CopySkillStager, LinkSkillStager, TreeSkillStager

__all__ = [
    "BaseSkillStager",
    "CopySkillStager",
    "DynamicSkillToolSet",
    "LinkSkillStager",
    "TreeSkillStager",
    "SkillToolSet",
    "workspace_id_for",
]
