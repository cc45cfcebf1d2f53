"""Where the file tools act: ``BaseFileBackend``, and ``HostFileBackend`` (a folder of this machine, the guide's
``cwd``). ``workspace.WorkspaceFileBackend`` is the other: the session's sandboxed workspace."""

from __future__ import annotations

import asyncio
import os
from abc import ABC, abstractmethod
from typing import Any

from orchestrator.context import InvocationContext
from orchestrator.tools.file_tools.workspace_skill import ops as _ops
from worker.outcome import decode_output
from worker.sandbox import find_bash, run_process

DEFAULT_TIMEOUT_SECONDS = 300.0
MAX_TIMEOUT_SECONDS = 3600.0
MAX_OUTPUT_BYTES = 64 * 1024
"""What host-mode ``Bash`` keeps of one stream (the rest is read and dropped, so the command never blocks on a full
pipe)."""
HOST_PATH = "/usr/local/bin:/usr/bin:/bin"


def host_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The command's environment, built from scratch (no host secret reaches the model): PATH, HOME, LANG, TERM."""
    env = {"PATH": HOST_PATH, "HOME": os.environ.get("HOME", "/"), "LANG": "C.UTF-8", "TERM": "dumb"}
    env.update(extra or {})
    return env


def check_timeout(timeout: float | None) -> float:
    """The Bash timeout asked for, or the default; refused when it is not a positive number within the maximum."""
    if timeout is None:
        return DEFAULT_TIMEOUT_SECONDS
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise _ops.Refused(f"timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECONDS:g}")
    return float(timeout)


def bash_answer(command: str, cwd: str, stdout: str, stderr: str, return_code: int, timed_out: bool,
                timeout: float) -> dict[str, Any]:
    """The guide's Bash result; a command past its timeout, or failing, is ``success: False`` with an ``error``."""
    answer: dict[str, Any] = {"success": return_code == 0 and not timed_out, "stdout": stdout, "stderr": stderr,
                              "return_code": return_code, "command": command, "cwd": cwd}
    if timed_out:
        answer["error"] = f"command timed out after {timeout:g} seconds; it was killed with everything it started"
    elif return_code != 0:
        answer["error"] = f"command exited with code {return_code}"
    return answer


class BaseFileBackend(ABC):
    """Runs the tools' operations somewhere."""

    @abstractmethod
    async def operate(self, operation: str, args: dict[str, Any], tool_context: InvocationContext | None) -> dict:
        """One of ``_ops.OPERATIONS`` with its arguments; the guide's answer."""

    @abstractmethod
    async def bash(self, command: str, cwd: str | None, timeout: float | None,
                   tool_context: InvocationContext | None) -> dict:
        """A shell command; the guide's Bash answer."""


class HostFileBackend(BaseFileBackend):
    """A folder of this machine (default: the current directory). Paths that leave it are refused; ``Bash`` runs in
    it (or a folder inside it) as this process's user, on the process runner runs use (``worker.sandbox``: a process
    group of its own, output capped, everything it started killed at its timeout and once it has ended), with an
    environment built from scratch (``env`` adds to it). A shell command can still name any host path: for
    isolation, use the workspace mode."""

    def __init__(self, cwd: str | os.PathLike[str] | None = None, *, env: dict[str, str] | None = None,
                 output_bytes: int | None = None) -> None:
        self.root = _ops.Root(os.fspath(cwd) if cwd is not None else os.getcwd())
        self.env = dict(env or {})
        self.output_bytes = output_bytes

    @property
    def cwd(self) -> str:
        return self.root.path

    async def operate(self, operation: str, args: dict[str, Any], tool_context: InvocationContext | None) -> dict:
        return await asyncio.to_thread(_ops.call, self.root, operation, args)

    async def bash(self, command: str, cwd: str | None, timeout: float | None,
                   tool_context: InvocationContext | None) -> dict:
        try:
            seconds = check_timeout(timeout)
            where = self.root.resolve(cwd or ".", "cwd")
            if not os.path.isdir(where):
                raise _ops.Refused(f"cwd {cwd!r} is not a directory")
        except _ops.Refused as exc:
            return _ops.failure(str(exc))
        cap = self.output_bytes or MAX_OUTPUT_BYTES
        outcome = await run_process([find_bash(), "-c", command], cwd=where, env=host_environment(self.env),
                                    timeout=seconds, stdout_cap=cap, stderr_cap=cap)
        return bash_answer(command, where, decode_output(outcome.stdout, outcome.stdout_omitted),
                           decode_output(outcome.stderr, outcome.stderr_omitted), outcome.exit_code,
                           outcome.timed_out, seconds)
