"""The local runtime: runs in bubblewrap sandboxes on this host, with control groups and launchers per run."""

from __future__ import annotations

from worker.lazy import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "worker.runtimes.local.runtime": ["LocalWorkspaceRuntime"],
    "worker.runtimes.local.run_groups": ["RunGroups"],
})
