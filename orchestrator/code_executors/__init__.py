"""Workspace runtimes under the guide's names (``code_executors.create_local_workspace_runtime`` …).

The Cube runtime is an optional extra (``pip install '.[cube]'``): import it from ``orchestrator.code_executors.cube``.
"""

from __future__ import annotations

import os
from typing import cast

from worker.artifacts import BaseArtifactStore
from worker.contract import RuntimeName
from worker.runtimes import BaseWorkspaceRuntime, LocalWorkspaceRuntime, resolve_runtime
from worker.workspaces import BaseSkillStager


def create_local_workspace_runtime(
    work_root: str | os.PathLike[str] | None = None,
    *,
    stager: BaseSkillStager | None = None,
    artifact_store: BaseArtifactStore | None = None,
    isolate_users: bool | None = None,
) -> LocalWorkspaceRuntime:
    """A runtime that runs skill commands as local processes; workspaces go under ``work_root`` (default: /tmp).
    Its limits are the worker settings' (``SKILLRUN_RUN_CPUS``, ``SKILLRUN_RUN_TMPFS_BYTES`` …), as a worker's."""
    runtime = resolve_runtime(RuntimeName.LOCAL, work_root=work_root, stager=stager, artifact_store=artifact_store,
                              isolate_users=isolate_users)
    return cast(LocalWorkspaceRuntime, runtime)


def create_container_workspace_runtime(
    work_root: str | os.PathLike[str] | None = None,
    *,
    stager: BaseSkillStager | None = None,
    artifact_store: BaseArtifactStore | None = None,
    **options: object,
) -> BaseWorkspaceRuntime:
    """A runtime that runs skill commands in a hardened Docker container per workspace (``pip install '.[docker]'``);
    ``options`` are those of ``ContainerWorkspaceRuntime`` (image, memory_bytes, allow_network, ...). What they leave
    out is the worker settings' (``SKILLRUN_DOCKER_POOL_SIZE``, ``SKILLRUN_DOCKER_OCI_RUNTIME``, limits), as a
    worker's: a warm pool of 2 unless told otherwise, begun by ``start()`` or the first run, removed by ``close()``."""
    return resolve_runtime(
        RuntimeName.DOCKER, work_root=work_root, stager=stager, artifact_store=artifact_store, **options
    )


__all__ = [
    "BaseWorkspaceRuntime",
    "LocalWorkspaceRuntime",
    "create_container_workspace_runtime",
    "create_local_workspace_runtime",
]
