"""Workspace runtimes: where a run's command executes. Exports are imported on first use (``worker.lazy``):
``worker.runtimes.base`` alone does not load the local runtime."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.runtimes.base": ["BaseWorkspaceRuntime", "RUNTIME_CLASSES", "resolve_runtime", "worker_id"],
    "worker.runtimes.local.runtime": ["LocalWorkspaceRuntime"],
    "worker.runtimes.host": ["HostWorkspaceRuntime"],
    "worker.runtimes.docker.images": ["DerivedImages"],
    "worker.runtimes.cube.runtime": ["CodeExecutionResult", "CubeCodeExecutor", "CubeWorkspaceRuntime"],
    "worker.runtimes.host_files": ["WorkspaceFiles"],
})
