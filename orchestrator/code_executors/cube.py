"""The Cube runtime under the guide's names: remote E2B-compatible sandboxes (``pip install '.[cube]'``).

::

    executor = await CubeCodeExecutor.create(CubeCodeExecutorConfig())
    workspace_runtime = create_cube_workspace_runtime(executor)
"""

from __future__ import annotations

import os

from worker.artifacts import BaseArtifactStore
from worker.config import CubeCodeExecutorConfig, CubeWorkspaceConfig
from worker.errors import RuntimeUnavailableError

try:
    from worker.runtimes import CodeExecutionResult, CubeCodeExecutor, CubeWorkspaceRuntime
except ImportError as exc:  # the e2b SDK is missing
    raise RuntimeUnavailableError(f"the Cube runtime needs the cube extra (pip install '.[cube]'): {exc}") from exc


def create_cube_workspace_runtime(
    executor: CubeCodeExecutor | None = None,
    *,
    workspace_cfg: CubeWorkspaceConfig | None = None,
    config: CubeCodeExecutorConfig | None = None,
    work_root: str | os.PathLike[str] | None = None,
    artifact_store: BaseArtifactStore | None = None,
) -> CubeWorkspaceRuntime:
    """A runtime that runs skill commands in Cube sandboxes: in ``executor``'s sandbox (shared with the executor's
    own code), or, without one, in a sandbox per workspace made from ``config`` (default: the environment)."""
    return CubeWorkspaceRuntime(
        executor, config=config, workspace_cfg=workspace_cfg, work_root=work_root, artifact_store=artifact_store
    )


__all__ = [
    "CodeExecutionResult",
    "CubeCodeExecutor",
    "CubeCodeExecutorConfig",
    "CubeWorkspaceConfig",
    "CubeWorkspaceRuntime",
    "create_cube_workspace_runtime",
]
