"""Workspaces: one directory per session laid out as the guide describes (``manager``), skills staged into it,
files to and from remote sandboxes as tar archives, and the sandbox user ids workspaces hold."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.workspaces.manager": ["Workspace", "WorkspaceManager"],
    "worker.workspaces.staging": ["BaseSkillStager", "CopySkillStager", "LinkSkillStager"],
    "worker.workspaces.user_ids": ["UserIdRegistry"],
})
