"""The Cube runtime: remote E2B-compatible sandboxes, files moved as one tar archive each way."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.runtimes.cube.runtime": ["CodeExecutionResult", "CubeCodeExecutor", "CubeWorkspaceRuntime"],
})
