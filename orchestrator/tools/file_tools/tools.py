"""The six file tools of the guide — ``ReadTool``, ``WriteTool``, ``EditTool``, ``GrepTool``, ``BashTool``,
``GlobTool`` (model-facing names ``Read``, ``Write``, ``Edit``, ``Grep``, ``Bash``, ``Glob``).

Each takes ``cwd`` (host mode, the guide's) or a ``backend`` (``WorkspaceFileBackend``: the session's workspace);
arguments are checked against the tool's schema first, and a wrong one is answered ``{"success": False, "error":
...}`` with nothing touched.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

from orchestrator.context import InvocationContext
from orchestrator.tools.base import BaseTool
from orchestrator.tools.file_tools.backends import BaseFileBackend, HostFileBackend
from orchestrator.tools.file_tools.workspace_skill import ops as _ops

_TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,)}


def _param(kind: str, description: str) -> dict[str, str]:
    return {"type": kind, "description": description}


class BaseFileTool(BaseTool):
    """A file tool: its name, description and parameters, checked, then handed to its backend."""

    NAME: ClassVar[str]
    DESCRIPTION: ClassVar[str]
    PARAMETERS: ClassVar[dict[str, dict[str, str]]]
    REQUIRED: ClassVar[tuple[str, ...]]

    def __init__(self, cwd: str | os.PathLike[str] | None = None, *, backend: BaseFileBackend | None = None,
                 filters_name: list[str] | None = None, filters: list | None = None) -> None:
        super().__init__(name=self.NAME, description=self.DESCRIPTION, filters_name=filters_name, filters=filters)
        if backend is not None and cwd is not None:
            raise ValueError("give cwd (host mode) or backend, not both")
        self.backend = backend or HostFileBackend(cwd)

    @property
    def cwd(self) -> str | None:
        """The host folder the tool is confined to (``None`` in workspace mode)."""
        return getattr(self.backend, "cwd", None)

    def parameters_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {k: dict(v) for k, v in self.PARAMETERS.items()},
                "required": list(self.REQUIRED)}

    def _check(self, args: dict[str, Any]) -> str | None:
        unknown = sorted(set(args) - set(self.PARAMETERS))
        if unknown:
            return f"unexpected argument(s): {', '.join(unknown)}"
        for name in self.REQUIRED:
            if args.get(name) is None:
                return f"missing required argument: {name}"
        for name, value in args.items():
            kind = self.PARAMETERS[name]["type"]
            if value is not None and (not isinstance(value, _TYPES[kind]) or (kind != "boolean" and isinstance(value, bool))):
                return f"{name} must be {'an' if kind == 'integer' else 'a'} {kind}"
        return None

    async def _run_async_impl(self, *, tool_context: InvocationContext, args: dict[str, Any]) -> Any:
        problem = self._check(args or {})
        if problem:
            return _ops.failure(f"invalid arguments for {self.name}: {problem}")
        return await self._call({k: v for k, v in (args or {}).items() if v is not None}, tool_context)

    async def _call(self, args: dict[str, Any], tool_context: InvocationContext | None) -> dict:
        return await self.backend.operate(self.NAME.lower(), args, tool_context)


class ReadTool(BaseFileTool):
    NAME = "Read"
    DESCRIPTION = (f"Read a text file, whole or a range of lines (numbered from 1). Files over "
                   f"{_ops.MAX_READ_BYTES // (1024 * 1024)} MB and binary files are refused; at most "
                   f"{_ops.MAX_READ_LINES} lines come back at once.")
    PARAMETERS = {
        "path": _param("string", "The file, relative to the working directory."),
        "start_line": _param("integer", "First line to read (from 1)."),
        "end_line": _param("integer", "Last line to read (inclusive)."),
    }
    REQUIRED = ("path",)


class WriteTool(BaseFileTool):
    NAME = "Write"
    DESCRIPTION = "Write a file (created with its folders, or overwritten), or append to it with append=true."
    PARAMETERS = {
        "path": _param("string", "The file, relative to the working directory."),
        "content": _param("string", "The text to write."),
        "append": _param("boolean", "Append to the end of the file instead of overwriting it."),
    }
    REQUIRED = ("path", "content")


class EditTool(BaseFileTool):
    NAME = "Edit"
    DESCRIPTION = ("Replace one block of text in a file: old_string must match exactly one place (spaces and tabs "
                   "may differ); when it matches none or several, nothing changes and the answer says why.")
    PARAMETERS = {
        "path": _param("string", "The file, relative to the working directory."),
        "old_string": _param("string", "The text to replace, with enough context to be unique."),
        "new_string": _param("string", "The replacement text."),
    }
    REQUIRED = ("path", "old_string", "new_string")


class GrepTool(BaseFileTool):
    NAME = "Grep"
    DESCRIPTION = "Search text files for a regular expression, in one file or a folder (recursively)."
    PARAMETERS = {
        "pattern": _param("string", "A Python regular expression, e.g. 'TODO|FIXME'."),
        "path": _param("string", "File or folder to search, relative to the working directory (default '.')."),
        "case_sensitive": _param("boolean", "Match case (default true)."),
        "max_results": _param("integer", f"Matches to return at most (default {_ops.MAX_GREP_RESULTS})."),
    }
    REQUIRED = ("pattern",)


class GlobTool(BaseFileTool):
    NAME = "Glob"
    DESCRIPTION = "Find files by glob pattern: '*.txt', '**/*.py' (recursive), '**/*.{py,js}' (braces)."
    PARAMETERS = {
        "pattern": _param("string", "The glob pattern, relative to path."),
        "path": _param("string", "Folder to search from, relative to the working directory (default '.')."),
        "max_results": _param("integer", f"Paths to return at most (default {_ops.MAX_GLOB_RESULTS})."),
    }
    REQUIRED = ("pattern",)


class BashTool(BaseFileTool):
    NAME = "Bash"
    DESCRIPTION = ("Run a shell command (bash; pipes and redirection work) in the working directory or a folder "
                   "inside it. It is killed, with everything it started, after timeout seconds (default 300).")
    PARAMETERS = {
        "command": _param("string", "The shell command."),
        "cwd": _param("string", "Folder to run in, relative to the working directory (default: the working directory)."),
        "timeout": _param("number", "Seconds before the command is killed (default 300)."),
    }
    REQUIRED = ("command",)

    async def _call(self, args: dict[str, Any], tool_context: InvocationContext | None) -> dict:
        return await self.backend.bash(args["command"], args.get("cwd"), args.get("timeout"), tool_context)


FILE_TOOL_CLASSES: tuple[type[BaseFileTool], ...] = (ReadTool, WriteTool, EditTool, GrepTool, BashTool, GlobTool)
