"""Workspace runtimes: where a run's command executes."""

from worker.runtimes.base import RUNTIME_CLASSES, BaseWorkspaceRuntime, resolve_runtime
from worker.runtimes.local import LocalWorkspaceRuntime

__all__ = ["RUNTIME_CLASSES", "BaseWorkspaceRuntime", "LocalWorkspaceRuntime", "resolve_runtime"]
