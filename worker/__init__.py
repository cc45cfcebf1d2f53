"""Skillrun's execution plane: the run contract, workspaces, staging, runtimes, output collection, artifacts.

Nothing here imports ``orchestrator``: a worker image carries no agent, model or API code.
"""

from worker.artifacts import FileArtifactStore
from worker.contract import (
    ArtifactFile,
    InputFile,
    OutputFile,
    RunLimits,
    RunRequest,
    RunResult,
    RunTimings,
    RuntimeName,
    SkillRef,
    SkippedFile,
)
from worker.errors import (
    ArtifactError,
    InvalidRunRequestError,
    RuntimeUnavailableError,
    StagingError,
    WorkerError,
    WorkspaceError,
)
from worker.runtimes import BaseWorkspaceRuntime, LocalWorkspaceRuntime, resolve_runtime
from worker.staging import BaseSkillStager, CopySkillStager, LinkSkillStager
from worker.workspace import Workspace, WorkspaceManager

__all__ = [
    "ArtifactError",
    "ArtifactFile",
    "BaseSkillStager",
    "BaseWorkspaceRuntime",
    "CopySkillStager",
    "FileArtifactStore",
    "InputFile",
    "InvalidRunRequestError",
    "LinkSkillStager",
    "LocalWorkspaceRuntime",
    "OutputFile",
    "RunLimits",
    "RunRequest",
    "RunResult",
    "RunTimings",
    "RuntimeName",
    "RuntimeUnavailableError",
    "SkillRef",
    "SkippedFile",
    "StagingError",
    "WorkerError",
    "Workspace",
    "WorkspaceError",
    "WorkspaceManager",
    "resolve_runtime",
]
