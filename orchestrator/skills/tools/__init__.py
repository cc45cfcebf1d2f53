"""Skill tooling under the guide's import path (``skills.tools``): the stagers that put skills in workspaces."""

from worker.staging import BaseSkillStager, CopySkillStager, LinkSkillStager

__all__ = ["BaseSkillStager", "CopySkillStager", "LinkSkillStager"]
