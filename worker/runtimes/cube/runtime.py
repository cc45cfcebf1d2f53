"""The Cube runtime: skill commands in remote E2B-compatible sandboxes, through the ``e2b`` SDK.

A workspace lives in a sandbox at ``<root>/ws_<exec_id>_<suffix>`` (root ``/workspace/cube_agent`` by default),
laid out as on the other runtimes and created with ``mkdir -p`` before every run, so a sandbox cleaned from
outside recovers. A run is one upload at most (the skill when it is not staged yet, the run's inputs:
``cube_staging``), one round trip for the command and the packing of its outputs, and one download of what its
output patterns may match, collected through a local mirror (``cube_outputs``).

A command runs as the sandbox's unprivileged user with an environment built from scratch, within the run's
timeout (and the config's ``execute_timeout``). When it times out, is cancelled, or leaves processes behind,
every process that carries its ``RUN_DIR`` is killed in the sandbox. A skill that declares Python packages gets
its dependency environment, made once per sandbox outside every workspace (``cube_environments``).

Sandboxes: ``CubeCodeExecutor`` holds one (created, or connected by ``sandbox_id``) and runs code in it; a
runtime built on an executor runs every workspace in that sandbox, next to the executor's own code, and so does
one whose config names a ``sandbox_id``. A runtime built without either gives each workspace its own sandbox,
found again by metadata (from any worker or a later CLI call), reused across the workspace's runs and killed when
the workspace is removed or has been idle for ``idle_seconds`` (or, with no process left to notice, at the
service's ``sandbox_timeout``). Removing a workspace of a shared sandbox removes its folder; either way a one-off
run's workspace is removed once its result is stored (``worker.jobs.execute.remove_one_off_workspace``), and a kill the
service refuses is asked again, then reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shlex
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path

from e2b import AsyncSandbox, SandboxQuery
from e2b.exceptions import NotFoundException, SandboxNotRunningException

from worker import defaults
from worker.artifacts import BaseArtifactStore, FileArtifactStore
from worker.cancellation import Cancellation
from worker.config import CubeCodeExecutorConfig, CubeWorkspaceConfig
from worker.contract import RunRequest, RunResult, RuntimeName
from worker.environments import EnvironmentBuilder
from worker.errors import InvalidRunRequestError, RuntimeUnavailableError, WorkspaceError
from worker.outcome import TIMEOUT_EXIT_CODE
from worker.runtimes.base import BaseWorkspaceRuntime, run_result
from worker.runtimes.cube.builds import cube_builder
from worker.runtimes.cube.environments import CubeEnvironments
from worker.runtimes.cube.executor import (
    KILLED_EXIT_CODE,
    REMOTE_TMP,
    CodeExecutionResult,
    CubeCodeExecutor,
    ScriptOutcome,
    open_sandbox,
    sandbox_error,
)
from worker.runtimes.cube.outputs import CubeOutputs
from worker.runtimes.cube.staging import CubeStaging
from worker.workspaces.staging import resolve_skill_paths
from worker.validation import validate_request

WORKSPACE_LABEL = "skillrun.workspace"
ROOT_LABEL = "skillrun.root"
PACK_GRACE_SECONDS = 30.0
"""Time a run's round trip gets past its command's timeout for killing leftovers and packing outputs (the command
itself is killed in the sandbox at its timeout)."""


class CubeWorkspaceRuntime(BaseWorkspaceRuntime):
    """Runs skill commands in Cube sandboxes (see the module's description)."""

    name = RuntimeName.CUBE

    def __init__(
        self,
        executor: CubeCodeExecutor | None = None,
        *,
        config: CubeCodeExecutorConfig | None = None,
        workspace_cfg: CubeWorkspaceConfig | None = None,
        work_root: str | os.PathLike[str] | None = None,
        artifact_store: BaseArtifactStore | None = None,
        input_file_bytes: int = defaults.INPUT_FILE_BYTES,
        disk_bytes: int | None = None,
        environment_builder: EnvironmentBuilder | None = None,
    ) -> None:
        """``environment_builder`` resolves skills' dependencies, and builds environments for sandboxes that
        cannot install them themselves (default: ``cube_builder``, in ``SKILLRUN_ENVS_DIR`` or the work root's
        ``.skillrun/environments``)."""
        if disk_bytes is not None:
            raise RuntimeUnavailableError(
                "cube: per-workspace disk caps are set by the sandbox template, not by skillrun"
            )
        self.executor = executor
        self.config = executor.config if executor is not None else (config or CubeCodeExecutorConfig())
        self.workspace_cfg = workspace_cfg or CubeWorkspaceConfig()
        self.local_root = Path(work_root) if work_root is not None else Path(tempfile.gettempdir())
        self.artifact_store = artifact_store or FileArtifactStore(self.local_root / ".skillrun" / "artifacts")
        self.staging = CubeStaging(self.config, self._in_background, input_file_bytes=input_file_bytes)
        self.outputs = CubeOutputs(self.config, self.local_root, self.artifact_store, self._in_background)
        builder = environment_builder or cube_builder(self.local_root / ".skillrun" / "environments")
        self.sandbox_environments = CubeEnvironments(builder, self.config, self.workspace_cfg.root)
        self._owned: dict[str, CubeCodeExecutor] = {}
        self._last_used: dict[str, float] = {}
        self._busy: dict[str, int] = {}  # workspace → runs in progress here
        self._opening: dict[str, asyncio.Lock] = {}
        self._cancels: dict[str, Cancellation] = {}
        self._background: set[asyncio.Task] = set()
        self._lock = threading.Lock()

    # ---- where ------------------------------------------------------------------------------------------------
    def workspace_path(self, workspace_id: str) -> str:
        """The workspace's folder in its sandbox: ``<root>/ws_<exec_id>_<suffix>``, the same from every worker."""
        suffix = hashlib.sha256(workspace_id.encode()).hexdigest()[:8]
        return f"{self.workspace_cfg.root.rstrip('/')}/ws_{workspace_id}_{suffix}"

    async def executor_for(self, workspace_id: str) -> CubeCodeExecutor:
        """The executor whose sandbox holds ``workspace_id``: the shared one, or the workspace's own (found by
        metadata, else created)."""
        if self.executor is not None:
            return self.executor
        await self._close_idle(keep=workspace_id)
        known = self._owned.get(workspace_id)
        if known is not None:
            self._last_used[workspace_id] = time.monotonic()
            return known
        lock = self._opening.setdefault(workspace_id, asyncio.Lock())
        async with lock:
            known = self._owned.get(workspace_id)
            if known is None:
                labels = {WORKSPACE_LABEL: workspace_id, ROOT_LABEL: self.workspace_cfg.root}
                sandbox = await self._find_sandbox(labels)
                known = (
                    CubeCodeExecutor(sandbox, self.config)
                    if sandbox
                    else await CubeCodeExecutor.create(self.config, metadata=labels)
                )
                self._owned[workspace_id] = known
            self._last_used[workspace_id] = time.monotonic()
            return known

    async def _find_sandbox(self, labels: dict[str, str]) -> AsyncSandbox | None:
        if self.config.sandbox_id:
            return None
        options = self.config.connection_options()
        try:
            paginator = AsyncSandbox.list(query=SandboxQuery(metadata=labels), **options)
            found = await paginator.next_items() if paginator.has_next else []
            for info in found:
                with contextlib.suppress(NotFoundException, SandboxNotRunningException):
                    return await AsyncSandbox.connect(info.sandbox_id, **options)
        except Exception as exc:
            raise sandbox_error("looking for the workspace's sandbox", exc) from exc
        return None

    # ---- running ----------------------------------------------------------------------------------------------
    async def run(self, request: RunRequest, *, allow_host_paths: bool = False) -> RunResult:
        validate_request(request, allow_host_paths=allow_host_paths)
        if request.network and not self.config.allow_internet_access:
            raise InvalidRunRequestError(
                "network", "network access is not allowed on this runtime (allow_internet_access=False)"
            )
        if request.egress:
            raise InvalidRunRequestError(
                "egress", "the cube runtime cannot hold a run to an egress allow-list (the sandbox service has "
                          "internet access or none, no per-host filter): run this skill on the local or docker runtime"
            )
        cancel = Cancellation()
        with self._lock:
            self._cancels[request.run_id] = cancel
        self._busy[request.workspace_id] = self._busy.get(request.workspace_id, 0) + 1
        try:
            return await self._run(request, cancel)
        finally:
            with self._lock:
                self._cancels.pop(request.run_id, None)
            self._busy[request.workspace_id] -= 1
            if not self._busy[request.workspace_id]:
                del self._busy[request.workspace_id]
            if request.workspace_id in self._last_used:
                self._last_used[request.workspace_id] = time.monotonic()

    async def _run(self, request: RunRequest, cancel: Cancellation) -> RunResult:
        started = time.monotonic()
        root, source = await asyncio.to_thread(resolve_skill_paths, request.skill)
        signature = await asyncio.to_thread(self.staging.signature, source)
        inputs = await asyncio.to_thread(self.staging.input_archive, request.inputs)
        executor = await self.executor_for(request.workspace_id)
        try:
            environment = await self._environment(executor, request, root, source)
        except RuntimeUnavailableError:
            executor = await self._replace_if_gone(executor, request.workspace_id)
            environment = await self._environment(executor, request, root, source)
        ws = self.workspace_path(request.workspace_id)
        skill_dir = f"{ws}/skills/{request.skill.name}"
        pack_dir = f"{REMOTE_TMP}/skillrun-pack-{uuid.uuid4().hex}"
        pack = self.outputs.pack_script(request, ws, pack_dir)
        limit = min(request.timeout, self.config.execute_timeout)
        options = {
            "timeout": request.timeout,
            "grace": PACK_GRACE_SECONDS,
            "stdout_cap": request.limits.stdout_bytes,
            "stderr_cap": request.limits.stderr_bytes,
            "cancel": cancel,
        }
        done = None
        guard = self.staging.fast_guard(executor, request, ws, signature)
        if guard is not None:
            # Staged before by this process: check and make the run folder in the command's own round trip.
            run_dir = guard.run_dir
            staged = time.monotonic()
            try:
                done = await executor.run_script(
                    guard.script
                    + self.outputs.command_script(request, ws, run_dir, skill_dir, pack, limit, environment),
                    marker=run_dir,
                    **options,
                )
            except RuntimeUnavailableError:
                executor = await self._replace_if_gone(executor, request.workspace_id)
            if done is not None and await self.staging.missed(executor, request, guard, done):
                done = None  # changed from outside: the full way
        if done is None:
            try:
                prepared = await self.staging.prepare(executor, request, ws, source, signature, inputs)
            except RuntimeUnavailableError:
                executor = await self._replace_if_gone(executor, request.workspace_id)
                prepared = await self.staging.prepare(executor, request, ws, source, signature, inputs)
            run_dir, real_cwd = prepared
            if real_cwd is not None and real_cwd != ws and not real_cwd.startswith(ws + "/"):
                raise InvalidRunRequestError("cwd", f"{request.cwd!r} resolves outside the workspace")
            staged = time.monotonic()
            done = await executor.run_script(
                self.outputs.command_script(request, ws, run_dir, real_cwd or skill_dir, pack, limit, environment),
                marker=run_dir,
                **options,
            )
        outcome = done.outcome
        if not outcome.timed_out and outcome.exit_code == KILLED_EXIT_CODE and outcome.duration_ms >= limit * 1000:
            # Killed by the sandbox-side timeout: reported as every runtime reports a timeout.
            outcome.timed_out, outcome.exit_code = True, TIMEOUT_EXIT_CODE
        executed = time.monotonic()

        packed = not (outcome.timed_out or outcome.cancelled)
        collection = await self.outputs.collect(executor, request, ws, run_dir, pack_dir, pack, packed)
        finished = time.monotonic()
        stderr = done.stderr_text + ("\n[skillrun: the run was cancelled]\n" if outcome.cancelled else "")
        return run_result(
            request,
            self.name,
            outcome,
            collection,
            stdout=done.stdout_text,
            stderr=stderr,
            marks=(started, staged, executed, finished),
        )

    async def _environment(
        self, executor: CubeCodeExecutor, request: RunRequest, root: Path, source: Path
    ) -> str | None:
        """The skill's dependency environment in the executor's sandbox (``None`` when it declares none)."""
        return await self.sandbox_environments.for_run(
            executor, source, root, request.skill.name, wait=request.wait_for_environment
        )

    # ---- lifecycle --------------------------------------------------------------------------------------------
    def cancel(self, run_id: str) -> bool:
        """Stop a run in progress (its processes are killed in the sandbox); ``False`` if it is not running here."""
        with self._lock:
            found = self._cancels.get(run_id)
        if found is None:
            return False
        found.set()
        return True

    def _in_background(self, work: Coroutine) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def idle(self) -> None:
        """Wait until background clean-up in the sandboxes is done."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    async def _replace_if_gone(self, executor: CubeCodeExecutor, workspace_id: str) -> CubeCodeExecutor:
        """After an error: when the workspace's own sandbox expired or was killed, a new one (the workspace is made
        again in it); otherwise the error stands (re-raised)."""
        try:
            gone = not await executor.sandbox.is_running()
        except Exception:
            gone = True
        if self.executor is not None or not gone:
            raise
        self._forget(workspace_id)
        return await self.executor_for(workspace_id)

    def _forget(self, workspace_id: str) -> CubeCodeExecutor | None:
        self._last_used.pop(workspace_id, None)
        executor = self._owned.pop(workspace_id, None)
        if executor is not None:
            self.staging.forget_sandbox(executor.sandbox_id)
            self.sandbox_environments.forget_sandbox(executor.sandbox_id)
        return executor

    async def _close_idle(self, keep: str | None = None) -> None:
        now = time.monotonic()
        for workspace_id, last in list(self._last_used.items()):
            busy = self._busy.get(workspace_id, 0) > 0
            if workspace_id != keep and not busy and now - last > self.workspace_cfg.idle_seconds:
                executor = self._forget(workspace_id)
                if executor is not None:
                    await executor.close()

    async def remove_workspace(self, workspace_id: str) -> None:
        """Remove a workspace and everything in it: its own sandbox is killed (found by metadata when this process
        does not hold it); in a sandbox it shares — the executor's, or the one ``sandbox_id`` names — its folder is
        removed. What this runtime remembers of it goes too. ``RuntimeUnavailableError`` when the service does not
        kill the sandbox, ``WorkspaceError`` when the folder cannot be removed."""
        self._opening.pop(workspace_id, None)
        if self.executor is not None or self.config.sandbox_id:
            await self._remove_folder(workspace_id)
            return
        executor = self._forget(workspace_id)
        if executor is None:
            labels = {WORKSPACE_LABEL: workspace_id, ROOT_LABEL: self.workspace_cfg.root}
            sandbox = await self._find_sandbox(labels)
            executor = CubeCodeExecutor(sandbox, self.config) if sandbox else None
        if executor is not None:
            await executor.kill()

    async def _remove_folder(self, workspace_id: str) -> None:
        """Remove the workspace's folder from the sandbox it shares with others (which stays, with what this
        runtime knows of it)."""
        self._last_used.pop(workspace_id, None)
        executor = self.executor or self._owned.pop(workspace_id, None) or await CubeCodeExecutor.create(self.config)
        path = self.workspace_path(workspace_id)
        done = await executor.run_script(f"rm -rf -- {shlex.quote(path)}", timeout=60, user="root")
        self.staging.forget_workspace(workspace_id)
        if done.outcome.exit_code != 0:
            raise WorkspaceError(f"cube: removing workspace {workspace_id!r} failed: {done.stderr_text.strip()}")

    async def end_workspace(self, workspace_id: str) -> None:
        await self.remove_workspace(workspace_id)

    async def close_workspace(self, workspace_id: str) -> None:
        """Close a workspace: the same as ``remove_workspace`` (its sandbox, or its folder in a shared one, goes)."""
        await self.remove_workspace(workspace_id)

    async def close(self) -> None:
        """Stop runs in progress and finish clean-up. Workspace sandboxes stay up for the next process that serves
        their workspaces (they are found by metadata); they end when idle here, by ``remove_workspace``, or at
        the service's sandbox timeout."""
        with self._lock:
            running = list(self._cancels.values())
        for cancel in running:
            cancel.set()
        await self.idle()
        await asyncio.to_thread(self.sandbox_environments.close)


__all__ = [
    "CodeExecutionResult",
    "ScriptOutcome",
    "CubeCodeExecutor",
    "CubeWorkspaceRuntime",
    "open_sandbox",
    "sandbox_error",
]
