"""The Docker runtime: one container per workspace from a warm pool, an executor program inside each, derived
images for skill dependencies."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.runtimes.docker.runtime": ["ContainerWorkspaceRuntime", "DEFAULT_IMAGE"],
    "worker.runtimes.docker.pool": ["WarmPool"],
})
