"""Workspaces: one directory per session laid out as the guide describes (``manager``), skills staged into it,
files to and from remote sandboxes as tar archives, and the sandbox user ids workspaces hold."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.workspaces.manager": ["REGISTRY_DIR", "Workspace", "WorkspaceManager", "default_work_root"],
    "worker.workspaces.staging": ["BaseSkillStager", "CopySkillStager", "LinkSkillStager", "TreeSkillStager", "resolve_skill_paths"],
    "worker.workspaces.user_ids": ["UserIdRegistry"],
})
