"""Skillrun's execution plane: the run contract, workspaces, staging, runtimes, output collection, artifacts.

Nothing here imports ``orchestrator``: a worker image carries no agent, model or API code. The names below are
imported on first use (``worker.lazy``): ``from worker import defaults`` does not load every runtime.
"""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.artifacts": ["BaseArtifactStore", "FileArtifactStore", "S3ArtifactStore"],
    "worker.contract": ["ArtifactFile", "InputFile", "OutputFile", "RunLimits", "RunRequest", "RunResult", "RunTimings",
                        "RuntimeName", "SkillRef", "SkippedFile"],
    "worker.errors": ["ArtifactError", "InvalidRunRequestError", "RuntimeUnavailableError", "StagingError",
                      "WorkerError", "WorkspaceError"],
    "worker.runtimes": ["BaseWorkspaceRuntime", "LocalWorkspaceRuntime", "resolve_runtime"],
    "worker.workspaces.staging": ["BaseSkillStager", "CopySkillStager", "LinkSkillStager", "TreeSkillStager"],
    "worker.workspaces.manager": ["Workspace", "WorkspaceManager"],
})
