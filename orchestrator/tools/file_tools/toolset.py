"""``FileToolSet``: the six file tools sharing one working directory (host mode) or one backend."""

from __future__ import annotations

import os

from orchestrator.context import InvocationContext
from orchestrator.tools.base import BaseTool
from orchestrator.tools.file_tools.backends import BaseFileBackend, HostFileBackend
from orchestrator.tools.file_tools.tools import FILE_TOOL_CLASSES, BaseFileTool
from orchestrator.tools.toolset import BaseToolSet


class FileToolSet(BaseToolSet):
    """``Read``, ``Write``, ``Edit``, ``Grep``, ``Bash`` and ``Glob`` over ``cwd`` (default: the current directory);
    relative paths are resolved against it and paths that leave it are refused. ``backend`` puts them elsewhere
    (``WorkspaceFileToolSet`` does, for the session's workspace)."""

    def __init__(self, cwd: str | os.PathLike[str] | None = None, *, backend: BaseFileBackend | None = None,
                 name: str = "file_tools", filters_name: list[str] | None = None) -> None:
        super().__init__(name=name, filters_name=filters_name)
        if backend is not None and cwd is not None:
            raise ValueError("give cwd (host mode) or backend, not both")
        self.backend = backend or HostFileBackend(cwd)
        self._tools: list[BaseFileTool] = [cls(backend=self.backend) for cls in FILE_TOOL_CLASSES]

    @property
    def cwd(self) -> str | None:
        return getattr(self.backend, "cwd", None)

    async def get_tools(self, invocation_context: InvocationContext | None = None) -> list[BaseTool]:
        return list(self._tools)
