"""Workspace runtimes: where a run's command executes. Exports are imported on first use (``worker.lazy``):
``worker.runtimes.base`` alone does not load the local runtime."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.runtimes.base": ["RUNTIME_CLASSES", "BaseWorkspaceRuntime", "resolve_runtime"],
    "worker.runtimes.local.runtime": ["LocalWorkspaceRuntime"],
})
