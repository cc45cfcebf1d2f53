"""Workspace runtimes under the guide's names (``code_executors.create_local_workspace_runtime`` …)."""

from __future__ import annotations

import os

from worker.artifacts import FileArtifactStore
from worker.runtimes import BaseWorkspaceRuntime, LocalWorkspaceRuntime
from worker.staging import BaseSkillStager


def create_local_workspace_runtime(
    work_root: str | os.PathLike[str] | None = None,
    *,
    stager: BaseSkillStager | None = None,
    artifact_store: FileArtifactStore | None = None,
    isolate_users: bool | None = None,
) -> LocalWorkspaceRuntime:
    """A runtime that runs skill commands as local processes; workspaces go under ``work_root`` (default: /tmp)."""
    return LocalWorkspaceRuntime(work_root, stager=stager, artifact_store=artifact_store, isolate_users=isolate_users)


__all__ = ["BaseWorkspaceRuntime", "LocalWorkspaceRuntime", "create_local_workspace_runtime"]
