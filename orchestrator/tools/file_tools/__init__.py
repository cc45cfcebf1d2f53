"""File tools (the guide's ``trpc_agent_sdk.tools.file_tools``): ``FileToolSet`` and ``ReadTool``, ``WriteTool``,
``EditTool``, ``GrepTool``, ``BashTool``, ``GlobTool`` over a host folder (``cwd``), and ours,
``WorkspaceFileToolSet``: the same tools in the session's sandboxed workspace, through ``skill_run``'s dispatcher.

``WorkspaceFileToolSet`` loads the skill tools and the dispatcher; it is imported on first use.
"""

from importlib import import_module
from typing import Any

from orchestrator.tools.file_tools.backends import BaseFileBackend, HostFileBackend
from orchestrator.tools.file_tools.tools import (
    BaseFileTool,
    BashTool,
    EditTool,
    GlobTool,
    GrepTool,
    ReadTool,
    WriteTool,
)
from orchestrator.tools.file_tools.toolset import FileToolSet

_LAZY_NAMES = {
    "WorkspaceFileBackend": "orchestrator.tools.file_tools.workspace",
    "WorkspaceFileToolSet": "orchestrator.tools.file_tools.workspace",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_NAMES:
        return getattr(import_module(_LAZY_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BaseFileBackend",
    "BaseFileTool",
    "BashTool",
    "EditTool",
    "FileToolSet",
    "GlobTool",
    "GrepTool",
    "HostFileBackend",
    "ReadTool",
    "WorkspaceFileBackend",
    "WorkspaceFileToolSet",
    "WriteTool",
]
