"""The Docker runtime: a container per workspace (and image), reused across the workspace's runs, which reach it
through the container's executor (``container_executor``; ``docker exec`` where a container has none:
``container_exec``).

Hardened by default (``container_launch``): no network unless a request asks and the operator allows it, every
capability dropped, no-new-privileges, a read-only root, private size-capped ``/tmp`` and ``/dev/shm``, memory,
CPU and process limits, the OCI runtime the operator chose (runc, or gVisor's runsc). Commands run as the
workspace's own user id (allocated from 30000–59999 when the worker is root, never a host user's). Only this
workspace is mounted writable, at the same path as on the host (so the six variables mean the same inside); the
library roots its skills come from and the dependency environments they use are mounted read-only. With
``pool_size`` a warm pool (``container_pool``) keeps containers made ahead for new workspaces.

A skill's dependencies: its Python environment is built for the sandbox image's ``python3``, each step in a
throwaway container (``container_builds``), and is mounted read-only at the same path inside as on the host
(``VIRTUAL_ENV`` and ``PATH`` name it) into the containers of workspaces that run the skill; its Debian packages
are in a derived image built once per set (``container_images``), whose container for the workspace the run then
uses. A run waits for either to be built unless it says not to.

Runs of one workspace take turns — in this worker (an ``asyncio`` lock, so one thread at most waits), and across
the workers of its work root (a ``flock``, taken by the thread that runs the command: ``container_boxes``) — so a
run has its container to itself, and the workers of one work root share one container per workspace (and image),
found by its labels and made at most once. When a run ends — finished, failed, timed out or cancelled — every
process it started is killed and the scratch folders are emptied (by the executor, checked from the host where
the worker can: ``container_host``), and each run gets its own limits (the container's are updated when they
differ). A fetched library root stays in the cache for the run (held by the host runtime's ``run``). Containers
idle longer than ``idle_seconds`` are removed (the workspace stays on the host). A run cancelled while another
worker's run of its workspace holds the turn ends when that run has.

Engine errors are translated in one place (``docker_engine.map_docker_errors``) into ``RuntimeUnavailableError``
carrying the engine's reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path

import docker

from worker import defaults
from worker.artifacts import BaseArtifactStore
from worker.cancellation import Cancellation
from worker.contract import RunLimits, RunRequest, RunResult, RuntimeName, SkillRef
from worker.egress import proxy_environment, run_allow_list
from worker.egress.proxy import PROXY_PORT
from worker.egress.relay import RELAY
from worker.egress.serving import serving_folder
from worker.environments import NO_ENVIRONMENT, BuildSettings, EnvironmentStatus, RunEnvironment
from worker.environments.builder import Progress
from worker.environments.images import ImageStatus
from worker.errors import EnvironmentBuildError, InvalidRunRequestError
from worker.roots.library_fetch import locate
from worker.outcome import ProcessOutcome
from worker.sandbox.process import ulimit_prefix
from worker.runtimes.base import command_environment
from worker.runtimes.docker.boxes import Box, Boxes
from worker.runtimes.docker.builds import DockerTargets, docker_environments
from worker.runtimes.docker.docker_exec import docker_exec_run, scrub_through_engine
from worker.runtimes.docker.executor import ExecutorLink, ExecutorLost, ExecutorUnavailable
from worker.runtimes.docker.images import DerivedImages
from worker.runtimes.docker.launch import BoxSettings
from worker.runtimes.docker.pool import WarmPool
from worker.runtimes.docker.engine import map_docker_errors
from worker.runtimes.host import HostWorkspaceRuntime
from worker.workspaces.staging import BaseSkillStager, resolve_skill_paths
from worker.workspaces.manager import Workspace, WorkspaceManager

DEFAULT_IMAGE = "skillrun/sandbox:latest"
DEFAULT_MEMORY_BYTES = 1024**3
DEFAULT_CPUS = 1.0
DEFAULT_PIDS = 256
DEFAULT_TMPFS_BYTES = 64 * 1024 * 1024
DEFAULT_SHM_BYTES = 64 * 1024 * 1024
DEFAULT_IDLE_SECONDS = 600.0
GVISOR_SANDBOX_PROCESSES = 1024
"""The least process limit of a gVisor container: its control group counts the sandbox's own threads (a few dozen
at start, more under load), so a run's count is held by a ``ulimit`` inside instead."""


class ContainerWorkspaceRuntime(HostWorkspaceRuntime):
    """Runs skill commands in a hardened container per workspace on the local Docker engine."""

    name = RuntimeName.DOCKER

    def __init__(
        self,
        work_root: str | os.PathLike[str] | None = None,
        *,
        image: str = DEFAULT_IMAGE,
        allow_network: bool = False,
        memory_bytes: int = DEFAULT_MEMORY_BYTES,
        cpus: float = DEFAULT_CPUS,
        pids: int = DEFAULT_PIDS,
        tmpfs_bytes: int = DEFAULT_TMPFS_BYTES,
        shm_bytes: int = DEFAULT_SHM_BYTES,
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        stager: BaseSkillStager | None = None,
        artifact_store: BaseArtifactStore | None = None,
        client: docker.DockerClient | None = None,
        disk_bytes: int | None = None,
        build_settings: BuildSettings | None = None,
        oci_runtime: str = "runc",
        pool_size: int = 0,
    ) -> None:
        """``memory_bytes``, ``cpus`` and ``pids`` cap every run (a request's own limits may only lower the first
        and last); ``tmpfs_bytes`` and ``shm_bytes`` size the container's ``/tmp`` and ``/dev/shm`` (memory the
        run's limit pays for). ``build_settings``: how skills' environments and derived images are built (default:
        the worker settings, ``SKILLRUN_ENV_*``); they are kept in ``SKILLRUN_ENVS_DIR`` or the work root's
        ``.skillrun/environments``, the local runtime's store."""
        if not 0 <= pool_size <= defaults.DOCKER_POOL_MAX:
            raise ValueError(f"pool_size must be from 0 to {defaults.DOCKER_POOL_MAX} (SKILLRUN_DOCKER_POOL_SIZE), "
                             f"not {pool_size}")
        if not re.fullmatch(defaults.OCI_RUNTIME_PATTERN, oci_runtime):
            raise ValueError(f"oci_runtime {oci_runtime!r} is not an OCI runtime's name (SKILLRUN_DOCKER_OCI_RUNTIME): "
                             "runc, or runsc for gVisor")
        workspaces = WorkspaceManager(work_root, disk_bytes=disk_bytes)
        self.targets = DockerTargets(lambda: self.client, image)
        environments = docker_environments(workspaces.registry / "environments", lambda: self.client, self.targets,
                                           build_settings)
        super().__init__(workspaces, stager=stager, artifact_store=artifact_store, environments=environments)
        self.image = image
        self.allow_network = allow_network
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.pids = pids
        self.tmpfs_bytes = tmpfs_bytes
        self.shm_bytes = shm_bytes
        self.idle_seconds = idle_seconds
        self.gvisor = oci_runtime == "runsc"
        self._client = client
        self.images = DerivedImages(lambda: self.client, environments.store, environments.builder.settings)
        self.boxes = Boxes(
            lambda: self.client, BoxSettings(cpus, tmpfs_bytes, shm_bytes, idle_seconds, oci_runtime),
            prefix="skillrun-" + hashlib.sha256(str(self.work_root.resolve()).encode()).hexdigest()[:8],
            work_root=self.work_root.resolve(), turns=workspaces.registry / "containers", used=self.images.mark_used,
            workspaces=workspaces,
        )
        self.pool = WarmPool(pool_size, self.boxes, workspaces, lambda: self._run_limits(RunLimits()),
                             max_age=idle_seconds / 2) if pool_size > 0 else None
        # workspace folder → (its lock, runs holding or awaiting it)
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}
        self._run_images: dict[str, str] = {}  # run id → the derived image it runs in (set just before it starts)

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            with map_docker_errors("connecting to Docker"):
                self._client = docker.from_env()
        return self._client

    def command_environment(self, run_dir: Path, request: RunRequest, variables: dict[str, str]) -> dict[str, str]:
        return command_environment(run_dir, request, variables, path=defaults.SANDBOX_PATH, shell="/bin/bash",
                                   aliased=True)

    async def _environment(self, request: RunRequest) -> RunEnvironment | None:
        """The skill's Python environment (``HostWorkspaceRuntime._environment``), and the derived image its
        Debian packages need, which the run is then executed in (both built first when the run waits). A skill
        that declares nothing asks the engine nothing; one that does has the target looked up in a thread."""
        if request.skill not in self._skill_paths:  # the host runtime's cache of the skill's folders
            self._skill_paths[request.skill] = await asyncio.to_thread(resolve_skill_paths, request.skill)
        root, source = self._skill_paths[request.skill]
        declaration = await self.environments.look_up(source, root, request.skill.name)
        if declaration.empty:
            return None
        target = await asyncio.to_thread(self.targets)  # fresh now: the environments' lookup will not block
        info = await super()._environment(request)
        if declaration.debian:
            # host._run calls _execute right after this returns (no await between): the entry cannot be left over
            self._run_images[request.run_id] = await self.images.image_for(
                target.image, declaration.debian, skill=request.skill.name, wait=request.wait_for_environment,
            )
        return info

    async def prepare_environment(self, skill_dir: Path, root: Path, name: str,
                                  progress: Progress | None = None) -> EnvironmentStatus:
        """The skill's Python environment for the sandbox image and the derived image its Debian packages need,
        built now (each tried again, even right after a failure); ready only when both are."""
        status = await super().prepare_environment(skill_dir, root, name, progress)
        packages = status.declaration.debian
        if status.state == "invalid" or not packages:
            return status
        base = (await asyncio.to_thread(self.targets)).image
        if progress is not None:
            progress(f"building the sandbox image with the Debian packages {', '.join(packages)}")
        try:
            tag = await self.images.image_for(base, packages, skill=name, wait=True, again=True)
        except EnvironmentBuildError as exc:
            return status.with_image(ImageStatus(self.images.tag(base, packages), "failed", packages, str(exc)))
        return status.with_image(ImageStatus(tag, "ready", packages))

    def environment_status(self, skill_dir: Path, root: Path, name: str) -> EnvironmentStatus:
        """Where the skill's Python environment and derived image stand (asks the engine; no build)."""
        status = super().environment_status(skill_dir, root, name)
        if status.state == "invalid" or not status.declaration.debian:
            return status
        return status.with_image(self.images.status(self.targets().image, status.declaration.debian))

    def _acquire(self, request: RunRequest) -> Workspace:
        """A new workspace takes a warm container that fits its first run, when the pool has one: it is laid out
        in the container's reserved folder (blocking)."""
        if self.pool is None or request.network or self.workspaces.find(request.workspace_id) is not None:
            return super()._acquire(request)
        warm = self.pool.take((self.image, (str(locate(request.skill).resolve()),)))
        if warm is None:
            return super()._acquire(request)
        try:
            workspace = self.workspaces.acquire(request.workspace_id, reserved=warm.folder)
        except BaseException:
            self.pool.discard(warm)
            raise
        if workspace.path != warm.folder.path:  # another worker made the workspace meanwhile
            self.pool.discard(warm)
        return workspace

    async def _execute(
        self, workspace: Workspace, request: RunRequest, cwd: str, env: dict[str, str], cancel: Cancellation,
        *, environment: RunEnvironment = NO_ENVIRONMENT,
    ) -> ProcessOutcome:
        image = self._run_images.pop(request.run_id, self.image)
        environments = environment.folders
        if request.network and not self.allow_network:
            raise InvalidRunRequestError("network",
                                         "network access is not allowed on this runtime (allow_network=False)")
        if request.egress and self.gvisor:
            raise InvalidRunRequestError("egress", "a run with an egress allow-list cannot reach the worker's proxy "
                                                   "under gVisor (runsc may make unix sockets on mounts, not connect "
                                                   "to the worker's): run it on runc (SKILLRUN_DOCKER_OCI_RUNTIME)")
        if not request.egress:
            return await self._in_turn(workspace, image, environments, request, cwd, env, cancel, None)
        # No network; the proxy's unix socket in the workspace, which a relay in the container listens in front of.
        uid = workspace.uid if workspace.uid is not None else os.getuid()
        async with serving_folder(run_allow_list(request.egress), workspace.path, uid) as (proxy, name):
            outcome = await self._in_turn(workspace, image, environments, request, cwd,
                                          {**env, **proxy_environment()}, cancel, str(workspace.path / name))
        outcome.egress = proxy.refusals
        return outcome

    async def _in_turn(
        self, workspace: Workspace, image: str, environments: tuple[Path, ...], request: RunRequest, cwd: str,
        env: dict[str, str], cancel: Cancellation, egress_socket: str | None,
    ) -> ProcessOutcome:
        """Run the command in the workspace's turn (``_exec`` in a thread), which ends when the run has."""
        release = await self._take_turn(workspace.path.name)
        try:
            job = asyncio.get_running_loop().run_in_executor(
                None, self._exec, workspace, image, environments, request, cwd, env, cancel, egress_socket
            )
        except BaseException:
            release()
            raise
        job.add_done_callback(lambda _: release())  # the turn ends when the run has, not when its caller gives up
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            cancel.set()  # the caller gave up: the thread following the command ends the run
            raise

    async def _take_turn(self, folder: str) -> Callable[[], None]:
        """Wait until no other run of the workspace is in its container; the returned call ends this one's turn."""
        lock, users = self._turns.get(folder, (None, 0))
        lock = lock or asyncio.Lock()
        self._turns[folder] = (lock, users + 1)

        def leave() -> None:
            held, left = self._turns[folder]
            if left == 1:
                del self._turns[folder]
            else:
                self._turns[folder] = (held, left - 1)

        try:
            await lock.acquire()
        except BaseException:
            leave()
            raise

        def release() -> None:
            lock.release()
            leave()

        return release

    def _exec(
        self, workspace: Workspace, image: str, environments: tuple[Path, ...], request: RunRequest, cwd: str,
        env: dict[str, str], cancel: Cancellation, egress_socket: str | None = None,
    ) -> ProcessOutcome:
        """In the workspace's turn, ``docker exec`` the command in its container of ``image`` (which mounts
        ``environments``), follow it, end the run (blocking: the Docker SDK is synchronous). With ``egress_socket``
        the command runs under the relay to that proxy socket (``worker.egress.relay``)."""
        root = locate(request.skill).resolve()  # held in the cache for the whole run by the host runtime's run()
        with self.boxes.turn(workspace.path.name):
            return self._exec_in_turn(workspace, image, environments, root, request, cwd, env, cancel, egress_socket)

    def _exec_in_turn(
        self, workspace: Workspace, image: str, environments: tuple[Path, ...], root: Path, request: RunRequest, cwd: str,
        env: dict[str, str], cancel: Cancellation, egress_socket: str | None,
    ) -> ProcessOutcome:
        box = self._box(workspace, image, root, environments, request)
        script = self._script(request)
        if egress_socket is not None:
            script = shlex.join(["exec", "python3", "-I", "-c", RELAY, egress_socket, str(PROXY_PORT), "bash", "-c",
                                 script])
        oom_before = box.host.oom_kills() if box.host else None
        problem = box.problem
        outcome = None
        if box.control is not None:
            try:
                outcome = self._through_executor(workspace, box, script, env, cwd, request, cancel)
            except ExecutorUnavailable as exc:
                problem = str(exc)  # the run did not start: docker exec it instead
        if outcome is None:
            outcome = self._through_docker_exec(workspace, box, script, env, cwd, request, cancel)
            outcome.via = f"docker exec ({problem})" if problem else "docker exec"
        if box.host is not None and (box.host.oom_kills() or 0) > (oom_before or 0):
            outcome.oom_killed = True
            limit = min(self.memory_bytes, request.limits.memory_bytes)
            outcome.notes.append(f"a process was killed for going past the run's memory limit ({limit} bytes)")
        return outcome

    def _through_executor(
        self, workspace: Workspace, box: Box, script: str, env: dict[str, str], cwd: str, request: RunRequest,
        cancel: Cancellation,
    ) -> ProcessOutcome:
        """Run the command through the container's executor; what the run left (by the executor's word, checked
        from the host where it can be) is then ended through the engine."""
        try:
            if box.link is None:
                box.link = ExecutorLink.connect(box.control, box.token)
            outcome, report = box.link.run(script, env, cwd, request, cancel)
        except ExecutorUnavailable:
            box.forget_link()
            raise
        except ExecutorLost as exc:
            self.boxes.remove((workspace.path.name, box.image))
            outcome = exc.outcome
            outcome.via = "executor"
            return outcome
        outcome.via = "executor"
        if not report.clean or (box.host is not None and not box.host.left_nothing(ready_shell=report.ready)):
            self._end_run(workspace, box)
        return outcome

    def _through_docker_exec(
        self, workspace: Workspace, box: Box, script: str, env: dict[str, str], cwd: str, request: RunRequest,
        cancel: Cancellation,
    ) -> ProcessOutcome:
        return docker_exec_run(self.client.api, box.id, self.boxes.user(workspace), script, env, cwd, request, cancel,
                               end_run=lambda: self._end_run(workspace, box))

    def _end_run(self, workspace: Workspace, box: Box) -> None:
        """Kill everything the run started and empty the scratch folders, through the engine (one ``docker exec``
        as the run's user), unless the host view shows nothing is left. A container that cannot be emptied — the
        exec cannot start (a fork bomb holds every process slot) or leaves something behind — is removed (the next
        run gets a new one)."""
        if box.host is not None and box.host.left_nothing():
            return
        if not scrub_through_engine(self.client.api, box.id, self.boxes.user(workspace)):
            self.boxes.remove((workspace.path.name, box.image))

    def _box(self, workspace: Workspace, image: str, root: Path, environments: tuple[Path, ...], request: RunRequest) -> Box:
        """The workspace's running container of ``image``, with the run's limits, library root and environment."""
        # This run's turn is held; warm containers not taken yet are the pool's.
        pool = self.pool
        self.boxes.reap_idle(keep=lambda folder: folder in self._turns or (pool is not None and pool.holds(folder)))
        folders = [str(root.resolve()), *(str(folder) for folder in environments)]
        return self.boxes.get(workspace, image, folders, bool(request.network), self._run_limits(request.limits))

    def _run_limits(self, limits: RunLimits) -> tuple[int, int]:
        """The memory and process count a container is given for a run's ``limits`` (capped by the runtime's)."""
        processes = min(self.pids, limits.processes)
        if self.gvisor:  # its control group counts the sandbox's own threads: the run's count is a ulimit there
            processes = max(processes, GVISOR_SANDBOX_PROCESSES)
        return min(self.memory_bytes, limits.memory_bytes), processes

    def _script(self, request: RunRequest) -> str:
        """The run's command under its ``ulimit``s; under gVisor with the process count too (the workspace's user
        is the sandbox's own: its processes are the run's, the executor is another user)."""
        if not self.gvisor:
            return ulimit_prefix(request.limits, dedicated_user=False) + request.command
        limits = request.limits.model_copy(update={"processes": min(self.pids, request.limits.processes)})
        return ulimit_prefix(limits, dedicated_user=True) + request.command

    def container_id(self, workspace_id: str, image: str | None = None) -> str | None:
        """The id of the workspace's container of ``image`` (default: the sandbox image), if it has one."""
        workspace = self.workspaces.find_known(workspace_id) or self.workspaces.find(workspace_id)
        return self.boxes.container_id(workspace.path.name, image or self.image) if workspace else None

    def _forget_workspace(self, workspace: Workspace) -> None:
        self.boxes.remove_workspace(workspace.path.name)

    def remove_containers(self) -> None:
        """Remove every container this runtime used, but those another worker's run is in (the workspaces stay)."""
        self.boxes.remove_all()

    async def start(self, skill: SkillRef | None = None) -> None:
        """Let the warm pool fill on the running loop (it refills on the loop the runs come on). It fills for the
        library of the first new workspace's run, or, given ``skill``, for the library of ``skill`` at once."""
        if self.pool is None:
            return
        template = None
        if skill is not None:
            template = (self.image, (str(await asyncio.to_thread(lambda: locate(skill).resolve())),))
        self.pool.start(asyncio.get_running_loop(), template)

    async def run(self, request: RunRequest, *, allow_host_paths: bool = False) -> RunResult:
        if self.pool is not None:
            self.pool.start(asyncio.get_running_loop())
        return await super().run(request, allow_host_paths=allow_host_paths)

    async def idle(self) -> None:
        """Wait until background work is done: spare run folders, and the warm pool's refill."""
        await super().idle()
        if self.pool is not None:
            await self.pool.wait_filled()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        await super().close()
        await asyncio.to_thread(self.remove_containers)
