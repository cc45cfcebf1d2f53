"""The workspace runtime interface, and the one table that maps runtime names to implementations.

A runtime is like an httpx transport: one method (``run``) plus ``close`` and async context-manager support.
Callers take ``runtime=None`` and build the default (``local``).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import stat
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

from worker import defaults
from worker.collect import Collection
from worker.config import get_worker_settings
from worker.contract import EgressRefusal, InputFile, RunRequest, RunResult, RuntimeName, RunTimings
from worker.errors import InvalidRunRequestError, RuntimeUnavailableError, WorkspaceError
from worker.outcome import ProcessOutcome
from worker.runtimes.host_files import WorkspaceFiles


def worker_id() -> str:
    """Who executed a run: host name and process id."""
    return f"{socket.gethostname()}:{os.getpid()}"


def command_environment(
    run_dir: str | os.PathLike[str], request: RunRequest, variables: dict[str, str], *, path: str, shell: str,
    aliased: bool = False,
) -> dict[str, str]:
    """A command's environment, from scratch: PATH, HOME and TMPDIR (the run folder; ``aliased``, in a sandbox that
    shows the workspace at ``SANDBOX_WORKSPACE_ALIAS`` too, TMPDIR names it by that short path), LANG and SHELL,
    then the request's variables and its secrets' values, then the workspace's six. The shell is the runtime's,
    whatever the request says."""
    tmp = aliased_run_dir(run_dir) if aliased else str(run_dir)
    env = {"PATH": path, "HOME": str(run_dir), "TMPDIR": tmp, "LANG": defaults.SANDBOX_LANG}
    env.update(request.env)
    env.update(request.secret_values)
    env.update(variables)
    env["SHELL"] = shell
    return env


def aliased_run_dir(run_dir: str | os.PathLike[str]) -> str:
    """The run folder ``<workspace>/runs/<run>`` by the workspace's short path in a sandbox."""
    run = Path(run_dir)
    return f"{defaults.SANDBOX_WORKSPACE_ALIAS}/{run.parent.name}/{run.name}"


def open_input(item: InputFile, limit: int) -> tuple[bytes | BinaryIO, int]:
    """An input's content, or its host file opened for reading (the caller closes it), and its size. Refused, with
    the reason, when the host file cannot be read or is not a regular file (opened without blocking: a FIFO at that
    path must not hang the run), or when the input is over ``limit`` bytes."""
    if item.host_path is None:
        content = item.content or b""
        source: bytes | BinaryIO = content
        size = len(content)
    else:
        try:
            source = os.fdopen(os.open(item.host_path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK), "rb")
        except OSError as exc:
            raise InvalidRunRequestError("inputs", f"cannot read host file {item.host_path!r}: {exc.strerror}") from exc
        info = os.fstat(source.fileno())
        size = info.st_size
        if not stat.S_ISREG(info.st_mode):
            source.close()
            raise InvalidRunRequestError("inputs", f"host path {item.host_path!r} is not a regular file")
    if size > limit:
        if not isinstance(source, bytes):
            source.close()
        raise InvalidRunRequestError("inputs", f"input {item.name!r} is {size} bytes; the limit is {limit}")
    return source, size


def run_result(
    request: RunRequest,
    runtime: RuntimeName,
    outcome: ProcessOutcome,
    collection: Collection,
    *,
    stdout: str,
    stderr: str,
    marks: tuple[float, float, float, float],
) -> RunResult:
    """The result of a run from its outcome, its collected outputs and the monotonic times it started, was staged,
    had executed and had finished."""
    started, staged, executed, finished = marks
    return RunResult(
        stdout=stdout,
        stderr=stderr,
        exit_code=outcome.exit_code,
        timed_out=outcome.timed_out,
        duration_ms=outcome.duration_ms,
        output_files=collection.files,
        artifact_files=collection.artifacts,
        run_id=request.run_id,
        workspace_id=request.workspace_id,
        runtime=runtime,
        worker_id=worker_id(),
        stdout_truncated=outcome.stdout_omitted > 0,
        stderr_truncated=outcome.stderr_omitted > 0,
        skipped_files=collection.skipped,
        oom_killed=outcome.oom_killed,
        egress_refused=outcome.egress.count if outcome.egress is not None else 0,
        egress_refusals=[EgressRefusal(destination=where, reason=why) for where, why in outcome.egress.listed]
        if outcome.egress is not None else [],
        timings=RunTimings(
            stage_ms=_ms(staged - started), exec_ms=_ms(executed - staged),
            collect_ms=_ms(finished - executed), total_ms=_ms(finished - started), exec_via=outcome.via[:1000],
        ),
    )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


class BaseWorkspaceRuntime(ABC):
    """Executes run requests in workspaces."""

    name: RuntimeName

    @abstractmethod
    async def run(self, request: RunRequest, *, allow_host_paths: bool = False) -> RunResult:
        """Create or reuse the request's workspace, stage its skill, run its command, collect its outputs.

        ``allow_host_paths`` lets ``InputFile.host_path`` be read; only a trusted caller (the CLI, an operator)
        sets it, never a model's tool call.
        """

    def cancel(self, run_id: str) -> bool:
        """Stop a run in progress here; ``False`` if it is not running here."""
        return False

    async def end_workspace(self, workspace_id: str) -> None:
        """Remove a workspace and everything in it, from async code (each runtime's ``remove_workspace``);
        ``WorkspaceError`` when there is none here."""
        raise WorkspaceError(f"the {self.name.value} runtime cannot remove workspaces")

    async def end_one_off_workspace(self, workspace_id: str) -> None:
        """A one-off run's end (``keep_workspace`` false, its result stored): remove its workspace once no run is in
        it, never under another run, and not at all if a run that keeps it was in it. A runtime that cannot tell
        which runs are in a workspace removes it at once (``end_workspace``)."""
        await self.end_workspace(workspace_id)

    @contextlib.asynccontextmanager
    async def workspace_files(self, workspace_id: str) -> AsyncIterator[WorkspaceFiles | None]:
        """The workspace's files, for this process to read and write directly while the block lasts (the file tools'
        fast path, ``worker.runtimes.host_files``); ``None`` where only a run can reach them (a workspace elsewhere,
        not made yet, or being removed)."""
        yield None

    async def start(self) -> None:
        """Begin what the runtime keeps ready in the background (a Docker runtime's warm pool), on the running loop;
        the first run begins it too. Nothing is started when the runtime is built."""

    async def close(self) -> None:
        """Release what the runtime holds (containers, sandboxes, connections)."""

    async def __aenter__(self) -> "BaseWorkspaceRuntime":
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


RUNTIME_CLASSES: dict[str, str] = {
    RuntimeName.LOCAL.value: "worker.runtimes.local.runtime:LocalWorkspaceRuntime",
    RuntimeName.DOCKER.value: "worker.runtimes.docker.runtime:ContainerWorkspaceRuntime",
    RuntimeName.CUBE.value: "worker.runtimes.cube.runtime:CubeWorkspaceRuntime",
}
"""Runtime name → ``module:Class``. Optional runtimes are imported only when asked for."""


def resolve_runtime(name: str | RuntimeName, **kwargs: Any) -> BaseWorkspaceRuntime:
    """Build the runtime called ``name`` with ``kwargs``, over the worker settings' defaults for it
    (``WorkerSettings.runtime_options``: pool size, OCI runtime, limits), so a runtime built here is set up as a
    worker's is; a keyword argument given wins over its setting."""
    key = name.value if isinstance(name, RuntimeName) else name
    target = RUNTIME_CLASSES.get(key)
    if target is None:
        known = ", ".join(sorted(RUNTIME_CLASSES))
        raise RuntimeUnavailableError(f"runtime {key!r} is not available in this installation (available: {known})")
    module_name, class_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RuntimeUnavailableError(
            f"runtime {key!r} needs an optional dependency (pip install '.[{key}]'): {exc}"
        ) from exc
    return getattr(module, class_name)(**(get_worker_settings().runtime_options(key) | kwargs))
