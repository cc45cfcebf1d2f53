"""The local runtime: a ``bash -c`` subprocess in a workspace directory on this machine.

For development and the embedded default. The command's environment is built from scratch (no host variable
leaks in), it runs in its own process group under ``ulimit`` limits, in a bubblewrap sandbox
(``worker.sandbox.bubblewrap``) unless the sandbox is explicitly off (``sandbox=False``; every result then says so).
When the host runs as root, the command runs as its workspace's own unprivileged user (through the workspace's
spawner once the workspace is reused), in a sandbox of its own or, once the workspace is reused, the workspace's
held sandbox (``worker.sandbox.held``), held to the run's limits by a control group of its own
(``worker.sandbox.cgroups.groups``). As any other account it runs as that account, in a sandbox of its own made in
unprivileged user namespaces that shows it its workspace read-only but for ``work/``, ``out/``, its run folder and
its staged skill, its limits held per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import OrderedDict
from pathlib import Path
from typing import Literal

from worker import defaults
from worker.artifacts import BaseArtifactStore
from worker.cancellation import Cancellation
from worker.sandbox.cgroups.groups import CgroupError, CgroupLimits
from worker.contract import RunRequest, RuntimeName
from worker.egress import proxy_environment, run_allow_list
from worker.egress.serving import serving_sandbox
from worker.environments import NO_ENVIRONMENT, EnvironmentStatus, RunEnvironment, SkillEnvironments, local_environments
from worker.environments.builder import Progress
from worker.environments.host_packages import HostPackages
from worker.errors import DependencyError, InvalidRunRequestError, SpawnerError
from worker.outcome import ProcessOutcome
from worker.sandbox.process import find_bash, network_off_prefix, run_process, shell_argv, ulimit_prefix
from worker.sandbox.ready_shell import ReadyShell
from worker.runtimes.base import command_environment
from worker.runtimes.host import HostWorkspaceRuntime
from worker.runtimes.local.run_groups import RunGroups
from worker.sandbox.bubblewrap import SandboxSpec
from worker.sandbox.identity import Identities
from worker.sandbox.spawner import Spawner, spawner_python
from worker.workspaces.staging import BaseSkillStager
from worker.workspaces.user_ids import SETPRIV_HARDENING, find_setpriv
from worker.sandbox.user_network import find_slirp4netns
from worker.sandbox.command_watch import kill_user_processes
from worker.workspaces.manager import Workspace, WorkspaceManager

MAX_SPAWNERS = 64
"""Spawner processes kept at once (one per recently used workspace); the least recently used is stopped."""

SpawnerMode = Literal["auto", "eager", "off"]
UNSANDBOXED_NOTE = ("ran unsandboxed (the local runtime's sandbox is off: SKILLRUN_LOCAL_SANDBOX=false, or "
                    "sandbox=False): the command saw this machine's processes, files and network as its user does")
"""Said in every result of a run made without the sandbox, which only an explicit setting turns off."""


class LocalWorkspaceRuntime(HostWorkspaceRuntime):
    """Runs skill commands as local processes."""

    name = RuntimeName.LOCAL

    def __init__(
        self,
        work_root: str | os.PathLike[str] | None = None,
        *,
        stager: BaseSkillStager | None = None,
        artifact_store: BaseArtifactStore | None = None,
        isolate_users: bool | None = None,
        sandbox_path: str = defaults.SANDBOX_PATH,
        input_file_bytes: int = defaults.INPUT_FILE_BYTES,
        spawners: SpawnerMode = "auto",
        disk_bytes: int | None = None,
        allow_network: bool = False,
        ready_shells: bool = True,
        sandbox: bool = True,
        tmpfs_bytes: int = defaults.SANDBOX_TMPFS_BYTES,
        cpus: float | None = defaults.SANDBOX_CPUS,
        environments: SkillEnvironments | None = None,
    ) -> None:
        """``spawners`` applies when commands run as workspace users: ``auto`` starts a workspace's spawner when the
        workspace is used a second time and uses it once ready (a one-off run never pays for one), ``eager`` starts
        it at once and waits for it, ``off`` never uses one (every run switches user through ``setpriv``).

        With workspace users (root), commands run in a network namespace of their own, with no network, unless a
        request asks for it (``network``) and ``allow_network`` is set: then, in the sandbox, in a namespace of
        their own connected through user-mode networking (``worker.sandbox.user_network``; slirp4netns must be installed),
        and without it in the host's. A non-root host cannot take the network away: there commands share the
        host's.

        ``ready_shells``: after each run through a spawner, the spawner starts bash for the workspace's next run
        (``spawner.ReadyShell``), so that run skips a round trip and bash's start-up.

        ``sandbox`` (with workspace users): each command runs in a bubblewrap sandbox (``worker.sandbox.bubblewrap``) with
        private ``/tmp`` and ``/dev/shm`` of ``tmpfs_bytes`` each, held with everything it starts to the request's
        memory and process limits and to ``cpus`` cores (``None``: no CPU cap) by a control group of its own where
        the host has one (otherwise the result says so). It needs bubblewrap (``apt-get install bubblewrap``).

        ``environments``: skills' dependency environments (default: built for the host's ``python3`` into
        ``SKILLRUN_ENVS_DIR`` or the work root's ``.skillrun/environments``, each build sandboxed as runs are, and
        with the sandbox their Debian packages in root filesystems of their own, ``worker.environments.systems``;
        without root filesystems the host's own packages are checked)."""
        workspaces = WorkspaceManager(work_root, isolate_users=isolate_users, disk_bytes=disk_bytes)
        if environments is None:
            sandboxed_builds = sandbox and workspaces.isolate_users
            environments = local_environments(workspaces.registry / "environments", sandboxed=sandboxed_builds,
                                              systems=sandboxed_builds)
        super().__init__(
            workspaces, stager=stager, artifact_store=artifact_store, input_file_bytes=input_file_bytes,
            environments=environments,
        )
        self.sandbox_path = sandbox_path
        self.identities = Identities(self.workspaces.registry / "identities")
        self.host_packages = HostPackages()
        self.spawner_mode: SpawnerMode = spawners
        self.allow_network = allow_network
        self.ready_shells = ready_shells
        self.sandbox = sandbox
        self.tmpfs_bytes = tmpfs_bytes
        self.cpus = cpus
        self._bash: str | None = None
        self._spawners: OrderedDict[str, Spawner] = OrderedDict()
        self.groups = RunGroups(self._in_background)
        self._placements: set[asyncio.Task] = set()
        self._next_shells: dict[str, tuple[Spawner, str, dict[str, str], str]] = {}

    async def prepare_environment(self, skill_dir: Path, root: Path, name: str,
                                  progress: Progress | None = None) -> EnvironmentStatus:
        """The skill's environments (and root filesystem for its Debian packages), built now; without root
        filesystems (no sandbox), ready only where the host has its Debian packages (asked before the build:
        nothing is awaited once it is done, so the skill reads as built when its build ends)."""
        host = None
        if self.environments.systems is None:
            with contextlib.suppress(DependencyError):  # an invalid declaration is the build's to report
                declaration = await self.environments.look_up(skill_dir, root, name)
                if declaration.debian:
                    host = await asyncio.to_thread(self.host_packages.status, declaration.debian)
        status = await super().prepare_environment(skill_dir, root, name, progress)
        return status if host is None or status.state == "invalid" else status.with_image(host)

    def environment_status(self, skill_dir: Path, root: Path, name: str) -> EnvironmentStatus:
        """Where the skill's environments stand, and its Debian packages: in a root filesystem of their own, or
        without one whether the host has them (blocking)."""
        status = super().environment_status(skill_dir, root, name)
        if self.environments.systems is not None or status.state == "invalid" or not status.declaration.debian:
            return status
        return status.with_image(self.host_packages.status(status.declaration.debian))

    def command_environment(self, run_dir: Path, request: RunRequest, variables: dict[str, str]) -> dict[str, str]:
        if self._bash is None:
            self._bash = find_bash()
        # SHELL and HOME set up front also spare bash a user-database lookup of the (unlisted) workspace user.
        return command_environment(run_dir, request, variables, path=self.sandbox_path, shell=self._bash,
                                   aliased=self.sandbox)

    async def _execute(
        self, workspace: Workspace, request: RunRequest, cwd: str, env: dict[str, str], cancel: Cancellation,
        *, environment: RunEnvironment = NO_ENVIRONMENT,
    ) -> ProcessOutcome:
        if request.network and not self.allow_network:
            raise InvalidRunRequestError("network", "network access is not allowed on this runtime (allow_network=False)")
        if request.egress and (not self.sandbox or workspace.uid is None):
            raise InvalidRunRequestError(
                "egress", "an egress allow-list needs the local runtime's sandbox with workspace users (a worker "
                          "running as root, with bubblewrap: its proxy listens inside the sandbox's network "
                          "namespace); this one has none (run it as root, or use the Docker runtime)")
        no_network = workspace.uid is not None and not request.network
        sandbox = await self._sandbox(workspace, request, environment, env.get("RUN_DIR"))
        # A sandbox's user namespace counts its own processes alone: its process limit binds nothing outside it.
        script = ulimit_prefix(request.limits, dedicated_user=workspace.uid is not None or sandbox is not None,
                               memory=sandbox is None or not self.groups.available) + request.command
        argv = shell_argv(self._bash or find_bash(), script)
        if request.egress:  # a sandbox of its own, whose only way out is the proxy (never the held sandbox)
            async with serving_sandbox(run_allow_list(request.egress), workspace.uid) as proxy:
                outcome = await self._in_sandbox(workspace, request, script, argv, sandbox, cwd,
                                                 {**env, **proxy_environment()}, cancel, no_network, spawned=False)
            outcome.egress = proxy.refusals
            return outcome
        return await self._in_sandbox(workspace, request, script, argv, sandbox, cwd, env, cancel, no_network,
                                      spawned=no_network or workspace.uid is None)

    async def _in_sandbox(
        self, workspace: Workspace, request: RunRequest, script: str, argv: list[str], sandbox: SandboxSpec | None,
        cwd: str, env: dict[str, str], cancel: Cancellation, no_network: bool, *, spawned: bool,
    ) -> ProcessOutcome:
        """Run ``argv`` (the shell given ``script``) in ``sandbox`` (through the workspace's spawner where
        ``spawned``) and report its limits."""
        limits = CgroupLimits(request.limits.memory_bytes, request.limits.processes, self.cpus)
        process_args = dict(
            cwd=cwd, env=env, timeout=request.timeout, stdout_cap=request.limits.stdout_bytes,
            stderr_cap=request.limits.stderr_bytes, uid=workspace.uid, gid=workspace.gid, cancel=cancel,
            no_network=no_network, sandbox=sandbox,
        )
        spawner = await self._spawner(workspace, sandbox) if spawned else None
        held = spawner is not None and spawner.sandbox is not None
        shell = await self._ready_shell(spawner, argv[0], script, env, cwd, limits, workspace.id) if spawner else None
        if held and shell is None:  # a held sandbox's spawner starts nothing but placed shells: a sandbox of its own
            spawner = None
        launcher = self.groups.take_launcher(limits) if shell is None and sandbox is not None else None
        cgroup = shell.cgroup if shell is not None else launcher.cgroup if launcher is not None else \
            self.groups.new_group(workspace.id, limits) if sandbox is not None else None
        oom_kills = 0
        outcome: ProcessOutcome | None = None
        try:
            try:
                outcome = await run_process(argv, spawner=spawner, ready=shell, cgroup=cgroup, launcher=launcher,
                                            **process_args)
            except SpawnerError:
                if not spawner.alive:  # it stopped answering: a new one is started for the next run
                    await asyncio.to_thread(self._drop_spawner, workspace.id)
                outcome = await run_process(argv, cgroup=cgroup, **process_args)
        finally:
            if held and spawner is not None:
                await self._leave(spawner, workspace.id, outcome)
            if spawner is not None and self.ready_shells:  # started once this run's result is on its way
                self._next_shells[workspace.id] = (spawner, argv[0], env, cwd)
            if cgroup is not None:
                oom_kills = cgroup.oom_kills()
                self.groups.retire_after(outcome.gone if outcome is not None else None, workspace.id, cgroup)
        if sandbox is not None:
            self._report_limits(outcome, request, oom_kills)
        else:
            outcome.notes.append(UNSANDBOXED_NOTE)
        return outcome

    async def _ready_shell(
        self, spawner: Spawner, bash: str, script: str, env: dict[str, str], cwd: str, limits: CgroupLimits,
        workspace_id: str,
    ) -> ReadyShell | None:
        """The spawner's ready shell, held to ``limits`` and handed ``script``, when it fits this run; otherwise
        it is given up. A shell still being placed in its control group is waited for (it takes a moment). In a
        held sandbox the run takes the sandbox (``Spawner.occupied``) and a shell is started for it now if none
        fits; ``None`` if the run cannot use it (then it is left; given up where making its shell failed)."""
        held = spawner.sandbox is not None
        if held:
            spawner.occupied = True
        shell = spawner.take_shell()
        if shell is not None and shell.placement is not None:
            await asyncio.shield(shell.placement)
        if shell is not None and not shell.fits(env, cwd, spawner.sandbox):
            shell.discard()
            shell = None
        if shell is None and held:
            shell = await self._shell_now(spawner, bash, env, cwd, workspace_id)
        if shell is None:
            return None
        try:
            if shell.cgroup is not None:
                shell.cgroup.set_limits(limits)
            started = shell.start(script, env)
        except CgroupError:
            started = False
        if started:
            shell.on_release = None  # its group is this run's now, retired after it
            return shell
        shell.discard()
        spawner.occupied = False  # nothing ran in the sandbox (its shell is killed): the next run may go in
        return None

    async def _shell_now(
        self, spawner: Spawner, bash: str, env: dict[str, str], cwd: str, workspace_id: str
    ) -> ReadyShell | None:
        """A shell of the held sandbox for the run starting now, placed in a control group of its own."""
        try:
            shell = spawner.ready_shell(bash, env, cwd)
        except SpawnerError:
            await self._leave(spawner, workspace_id, None)
            return None
        cgroup = self.groups.take(workspace_id)
        shell.on_release = lambda released: self.groups.retire(workspace_id, cgroup)
        if not await shell.place(cgroup):
            await self._leave(spawner, workspace_id, None)
            return None
        return shell

    async def _leave(self, spawner: Spawner, workspace_id: str, outcome: ProcessOutcome | None) -> None:
        """A run is out of the held sandbox (its processes are gone): the next may go in. A sandbox that may still
        hold something of it (a process outlived the grace period, the spawner stopped) is given up instead."""
        if outcome is not None and not outcome.lingering and spawner.alive:
            spawner.occupied = False
            return
        with self._lock:
            if self._spawners.get(workspace_id) is spawner:
                del self._spawners[workspace_id]
        await asyncio.to_thread(spawner.close)

    async def _sandbox(
        self, workspace: Workspace, request: RunRequest, environment: RunEnvironment, run_dir: str | None
    ) -> SandboxSpec | None:
        """This run's sandbox: its workspace, the library folder its skill is linked from and its skill's
        dependency environments (all read-only), the root filesystem with its Debian packages as its system (else
        the host's); with network, a network namespace of its own behind user-mode networking (never the host's).
        A run of this process's own user (no workspace user: not root) may write only ``work/``, ``out/``, its run
        folder and its staged skill: the workspace's metadata, ``skills/`` and ``runs/`` are the worker's, which
        file modes cannot keep from the same user."""
        if not self.sandbox:
            return None
        await self.groups.start(self._bash or find_bash())
        if request.network:
            await asyncio.to_thread(find_slirp4netns)  # checked once; where it is missing the run fails
        source = self.stager.linked_source(request.skill)
        shown = tuple(str(folder) for folder in (source, *environment.folders) if folder is not None)
        writable: tuple[str, ...] = ()
        if workspace.uid is not None:
            uid, gid, home = workspace.uid, workspace.gid, str(workspace.work_dir)
        else:  # this account's id for every workspace: one home for all, the workspace's alias
            uid, gid, home = os.getuid(), os.getgid(), f"{defaults.SANDBOX_WORKSPACE_ALIAS}/work"
            staged = workspace.skills_dir / request.skill.name
            writable = tuple(str(folder) for folder in (workspace.work_dir, workspace.out_dir, run_dir, staged)
                             if folder is not None)
        identity = self.identities.known(uid, gid, home) or await asyncio.to_thread(self.identities.write, uid, gid,
                                                                                    home)
        system = str(environment.system) if environment.system is not None else None
        return SandboxSpec(str(workspace.path), shown, self.tmpfs_bytes, network=request.network,
                           served=bool(request.egress), identity=identity, system=system, writable=writable)

    def _prepare_next_run(self, workspace_id: str) -> None:
        """Once a run's result has gone out: its workspace's next run folder, and the next run's ready shell (its
        spawner's work, emptying a held sandbox first, would otherwise share the CPU with the result)."""
        super()._prepare_next_run(workspace_id)
        shell = self._next_shells.pop(workspace_id, None)
        if shell is not None:
            self._next_shell(*shell, workspace_id)

    def _next_shell(self, spawner: Spawner, bash: str, env: dict[str, str], cwd: str, workspace_id: str) -> None:
        """Have a ready shell wait for the workspace's next run; in a held sandbox (when no run is in it), placed in
        a control group of its own while nothing waits for it."""
        if spawner.occupied or not spawner.alive:
            return
        shell = spawner.prepare_shell(bash, env, cwd)
        if shell is None or shell.sandbox is None:
            return
        cgroup = self.groups.take(workspace_id)
        shell.on_release = lambda released: self.groups.retire(workspace_id, cgroup)
        task = shell.placement = asyncio.get_running_loop().create_task(shell.place(cgroup))
        self._placements.add(task)
        task.add_done_callback(self._placements.discard)

    def _report_limits(self, outcome: ProcessOutcome, request: RunRequest, oom_kills: int) -> None:
        """Say in the result when the run's limits held only per process (a root host without control groups: a
        normal account's runs never have them, as its documentation says), or when it went past its memory."""
        if self.groups.missing is not None and os.geteuid() == 0:
            outcome.notes.append(f"memory, process and CPU limits held per process only: {self.groups.missing}")
        if oom_kills:
            outcome.oom_killed = True
            outcome.notes.append(
                f"the run went past its memory limit ({request.limits.memory_bytes} bytes): the kernel killed "
                f"{oom_kills} of its processes"
            )

    async def _spawner(self, workspace: Workspace, sandbox: SandboxSpec | None) -> Spawner | None:
        """The workspace's ready spawner, starting one if there is none (see ``spawners``). A sandboxed run's is in
        the workspace's held sandbox of the run's spec (``worker.sandbox.held``; one of another spec is replaced
        once no run is in it), and only where runs get control groups of their own; ``None`` while another run is in
        it (that run, of any skill, goes on; this one gets a sandbox of its own)."""
        if workspace.uid is None or self.spawner_mode == "off":
            return None
        if sandbox is not None and not self.groups.available:
            return None
        stopped: list[Spawner] = []
        with self._lock:
            spawner = self._spawners.get(workspace.id)
            if spawner is not None and (not spawner.alive or spawner.sandbox != sandbox or spawner.uid != workspace.uid):
                if spawner.alive and spawner.occupied and spawner.uid == workspace.uid:
                    return None  # it holds a run (of another skill): this one gets a sandbox of its own
                stopped.append(self._spawners.pop(workspace.id))
                spawner = None
            if spawner is None and self.spawner_mode == "auto" and not self._reused(workspace.id):
                return None
            if spawner is None:
                setpriv, python = find_setpriv(), spawner_python()
                if setpriv is None or python is None:
                    return None
                spawner = Spawner(workspace.uid, workspace.gid, setpriv=setpriv, python=python,
                                  hardening=SETPRIV_HARDENING, sandbox=sandbox,
                                  prefix=network_off_prefix() if sandbox is None else ())  # else bwrap's own
                self._spawners[workspace.id] = spawner
                while len(self._spawners) > MAX_SPAWNERS:
                    stopped.append(self._spawners.popitem(last=False)[1])
            self._spawners.move_to_end(workspace.id)
        for old in stopped:
            await asyncio.to_thread(old.close)
        if self.spawner_mode == "eager":
            await asyncio.to_thread(spawner.wait_ready)
        return spawner if spawner.ready and not spawner.occupied else None

    def _drop_spawner(self, workspace_id: str) -> None:
        with self._lock:
            spawner = self._spawners.pop(workspace_id, None)
        if spawner is not None:
            spawner.close()

    def _forget_workspace(self, workspace: Workspace) -> None:
        self._next_shells.pop(workspace.id, None)
        self._drop_spawner(workspace.id)
        if workspace.uid is not None:
            kill_user_processes(workspace.uid)
        self.groups.drop(workspace.id)

    async def idle(self) -> None:
        """Wait until background work is done: spare run folders, the ready shells being started, and the last runs'
        control groups, handed back once their processes are gone."""
        await asyncio.sleep(0)  # the next ready shells, asked for as the last runs ended, are under way
        if self._placements:
            await asyncio.gather(*self._placements, return_exceptions=True)
        await self.groups.ended()
        await super().idle()
        with self._lock:
            shells = [spawner.waiting_shell for spawner in self._spawners.values()]
        for shell in shells:
            if shell is not None:
                await shell.wait_up()

    async def close(self) -> None:
        await self.groups.close_launchers()
        await super().close()
        with self._lock:
            spawners = list(self._spawners.values())
            self._spawners.clear()
        for spawner in spawners:
            await asyncio.to_thread(spawner.close)
        if self.groups.available:
            await self.idle()  # the groups of the runs just ended come back first
            await self.groups.close()
