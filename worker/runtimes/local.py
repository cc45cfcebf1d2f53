"""The local runtime: a ``bash -c`` subprocess in a workspace directory on this machine.

For development and the embedded default. The command's environment is built from scratch (no host variable
leaks in), it runs in its own process group under ``ulimit`` limits, and when the host runs as root it runs as
its workspace's own unprivileged user (through the workspace's spawner once the workspace is reused).
"""

from __future__ import annotations

import asyncio
import os
from collections import OrderedDict
from pathlib import Path
from typing import Literal

from worker import defaults
from worker.artifacts import FileArtifactStore
from worker.cancellation import Cancellation
from worker.contract import RunRequest, RuntimeName
from worker.errors import InvalidRunRequestError
from worker.process import (
    SETPRIV_HARDENING,
    ProcessOutcome,
    find_bash,
    find_setpriv,
    kill_user_processes,
    network_off_prefix,
    run_process,
    ulimit_prefix,
)
from worker.runtimes.base import command_environment
from worker.runtimes.host import HostWorkspaceRuntime
from worker.spawner import ReadyShell, Spawner, SpawnerError, spawner_python
from worker.staging import BaseSkillStager
from worker.workspace import Workspace, WorkspaceManager

MAX_SPAWNERS = 64
"""Spawner processes kept at once (one per recently used workspace); the least recently used is stopped."""

SpawnerMode = Literal["auto", "eager", "off"]


class LocalWorkspaceRuntime(HostWorkspaceRuntime):
    """Runs skill commands as local processes."""

    name = RuntimeName.LOCAL

    def __init__(
        self,
        work_root: str | os.PathLike[str] | None = None,
        *,
        stager: BaseSkillStager | None = None,
        artifact_store: FileArtifactStore | None = None,
        isolate_users: bool | None = None,
        sandbox_path: str = defaults.SANDBOX_PATH,
        input_file_bytes: int = defaults.INPUT_FILE_BYTES,
        spawners: SpawnerMode = "auto",
        disk_bytes: int | None = None,
        allow_network: bool = False,
        ready_shells: bool = True,
    ) -> None:
        """``spawners`` applies when commands run as workspace users: ``auto`` starts a workspace's spawner when the
        workspace is used a second time and uses it once ready (a one-off run never pays for one), ``eager`` starts
        it at once and waits for it, ``off`` never uses one (every run switches user through ``setpriv``).

        With workspace users (root), commands run in a network namespace of their own, with no network, unless a
        request asks for it (``network``) and ``allow_network`` is set. A non-root host cannot take the network
        away: there commands share the host's.

        ``ready_shells``: after each run through a spawner, the spawner starts bash for the workspace's next run
        (``spawner.ReadyShell``), so that run skips a round trip and bash's start-up."""
        super().__init__(
            WorkspaceManager(work_root, isolate_users=isolate_users, disk_bytes=disk_bytes), stager=stager,
            artifact_store=artifact_store,
            input_file_bytes=input_file_bytes,
        )
        self.sandbox_path = sandbox_path
        self.spawner_mode: SpawnerMode = spawners
        self.allow_network = allow_network
        self.ready_shells = ready_shells
        self._bash: str | None = None
        self._spawners: OrderedDict[str, Spawner] = OrderedDict()

    def command_environment(self, run_dir: Path, request: RunRequest, variables: dict[str, str]) -> dict[str, str]:
        if self._bash is None:
            self._bash = find_bash()
        # SHELL and HOME set up front also spare bash a user-database lookup of the (unlisted) workspace user.
        return command_environment(run_dir, request, variables, path=self.sandbox_path, shell=self._bash)

    async def _execute(
        self, workspace: Workspace, request: RunRequest, cwd: str, env: dict[str, str], cancel: Cancellation
    ) -> ProcessOutcome:
        if request.network and not self.allow_network:
            raise InvalidRunRequestError("network", "network access is not allowed on this runtime (allow_network=False)")
        no_network = workspace.uid is not None and not request.network
        script = ulimit_prefix(request.limits, dedicated_user=workspace.uid is not None) + request.command
        argv = [self._bash or find_bash(), "-c", script]
        process_args = dict(
            cwd=cwd, env=env, timeout=request.timeout, stdout_cap=request.limits.stdout_bytes,
            stderr_cap=request.limits.stderr_bytes, uid=workspace.uid, gid=workspace.gid, cancel=cancel,
            no_network=no_network,
        )
        spawner = await self._spawner(workspace) if no_network or workspace.uid is None else None
        shell = self._ready_shell(spawner, script, env, cwd) if spawner is not None else None
        try:
            return await run_process(argv, spawner=spawner, ready=shell, **process_args)
        except SpawnerError:
            if not spawner.alive:  # it stopped answering: a new one is started for the next run
                await asyncio.to_thread(self._drop_spawner, workspace.id)
            return await run_process(argv, **process_args)
        finally:
            if spawner is not None and self.ready_shells:
                spawner.prepare_shell(argv[0], env, cwd)

    def _ready_shell(self, spawner: Spawner, script: str, env: dict[str, str], cwd: str) -> ReadyShell | None:
        """The spawner's ready shell, handed ``script``, when it fits this run; otherwise it is given up."""
        shell = spawner.take_shell()
        if shell is None:
            return None
        if shell.fits(env, cwd) and shell.start(script, env):
            return shell
        shell.discard()
        return None

    async def _spawner(self, workspace: Workspace) -> Spawner | None:
        """The workspace's ready spawner, starting one if there is none (see ``spawners``)."""
        if workspace.uid is None or self.spawner_mode == "off":
            return None
        stopped: list[Spawner] = []
        with self._lock:
            spawner = self._spawners.get(workspace.id)
            if spawner is not None and not spawner.alive:
                stopped.append(self._spawners.pop(workspace.id))
                spawner = None
            if spawner is None and self.spawner_mode == "auto" and not self._reused(workspace.id):
                return None
            if spawner is None:
                setpriv, python = find_setpriv(), spawner_python()
                if setpriv is None or python is None:
                    return None
                spawner = Spawner(workspace.uid, workspace.gid, setpriv=setpriv, python=python,
                                  hardening=SETPRIV_HARDENING, prefix=network_off_prefix())
                self._spawners[workspace.id] = spawner
                while len(self._spawners) > MAX_SPAWNERS:
                    stopped.append(self._spawners.popitem(last=False)[1])
            self._spawners.move_to_end(workspace.id)
        for old in stopped:
            await asyncio.to_thread(old.close)
        if self.spawner_mode == "eager":
            await asyncio.to_thread(spawner.wait_ready)
        return spawner if spawner.ready else None

    def _drop_spawner(self, workspace_id: str) -> None:
        with self._lock:
            spawner = self._spawners.pop(workspace_id, None)
        if spawner is not None:
            spawner.close()

    def _forget_workspace(self, workspace: Workspace) -> None:
        self._drop_spawner(workspace.id)
        if workspace.uid is not None:
            kill_user_processes(workspace.uid)

    async def idle(self) -> None:
        """Wait until background work is done: spare run folders, and the ready shells being started."""
        await super().idle()
        with self._lock:
            shells = [spawner.waiting_shell for spawner in self._spawners.values()]
        for shell in shells:
            if shell is not None:
                await shell.wait_up()

    async def close(self) -> None:
        await super().close()
        with self._lock:
            spawners = list(self._spawners.values())
            self._spawners.clear()
        for spawner in spawners:
            await asyncio.to_thread(spawner.close)
