"""The Docker runtime: one container per workspace, reused across the workspace's runs (``docker exec`` per run).

Hardened by default: no network (a request may ask for it where the operator allows it), every capability
dropped, no-new-privileges, a read-only root file system, private size-capped ``/tmp`` and ``/dev/shm``, memory
(swap included), CPU and process-count limits that hold for the container — so for the run in it — and an init
process that reaps orphans. Commands run as the workspace's own user id (allocated from 30000–59999 when the
worker is root, never a host user's), the init and keep-alive as another (``RESIDENT_UID``). Only this workspace
is mounted writable, at the same path as on the host (so the six variables mean the same inside), and the library
roots its skills come from are mounted read-only at their own paths.

Runs of one workspace take turns, so a run has the container to itself: when it ends — finished, failed, timed
out or cancelled — every process it started is killed and the scratch folders are emptied (``container_host``),
and each run gets its own limits (the container's are updated when they differ). Containers idle longer than
``idle_seconds`` are removed (the workspace stays on the host).

Engine errors are translated in one place (``map_docker_errors``) into ``RuntimeUnavailableError`` carrying the
engine's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import select
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from worker import defaults
from worker.artifacts import FileArtifactStore
from worker.cancellation import Cancellation
from worker.contract import RunRequest, RuntimeName
from worker.errors import InvalidRunRequestError, RuntimeUnavailableError
from worker.process import TIMEOUT_EXIT_CODE, ProcessOutcome, ulimit_prefix
from worker.roots import is_url, resolve_root
from worker.runtimes.base import command_environment
from worker.runtimes.container_host import CLEAN_INSIDE, RESIDENT_UID, HostView
from worker.runtimes.host import HostWorkspaceRuntime
from worker.staging import BaseSkillStager
from worker.workspace import Workspace, WorkspaceManager

DEFAULT_IMAGE = "skillrun/sandbox:latest"
DEFAULT_MEMORY_BYTES = 1024**3
DEFAULT_CPUS = 1.0
DEFAULT_PIDS = 256
DEFAULT_TMPFS_BYTES = 64 * 1024 * 1024
DEFAULT_SHM_BYTES = 64 * 1024 * 1024
RESIDENT_PROCESSES = 2
"""The container's init and keep-alive, counted in its process limit besides the run's own."""
DEFAULT_IDLE_SECONDS = 600.0
POLL_SECONDS = 0.05
LABEL = "skillrun.workspace"


@contextlib.contextmanager
def map_docker_errors(action: str) -> Iterator[None]:
    """Docker SDK errors → ``RuntimeUnavailableError`` with the engine's own reason."""
    try:
        yield
    except docker.errors.ImageNotFound as exc:
        raise RuntimeUnavailableError(f"{action}: image not found ({exc.explanation}); build it with images/build.sh") from exc
    except docker.errors.APIError as exc:
        raise RuntimeUnavailableError(f"{action}: the Docker engine refused: {exc.explanation or exc}") from exc
    except docker.errors.DockerException as exc:
        raise RuntimeUnavailableError(f"{action}: no Docker engine answers ({exc}); start dockerd") from exc


@dataclass
class _Box:
    """A workspace's container as this runtime knows it."""

    id: str
    mounts: frozenset[str]
    network: bool
    limits: tuple[int, int]  # memory bytes (swap included), processes (residents included)
    host: HostView | None  # None: the worker cannot see the container's processes (another PID namespace)


class _Frames:
    """The multiplexed output of an exec (8-byte frame headers), kept up to the run's caps."""

    def __init__(self, request: RunRequest) -> None:
        self.kept = {1: bytearray(), 2: bytearray()}
        self.caps = {1: request.limits.stdout_bytes, 2: request.limits.stderr_bytes}
        self.omitted = {1: 0, 2: 0}
        self.pending = b""

    def read(self, raw, seconds: float) -> bool:  # noqa: ANN001 - the exec's socket
        """Take what arrives within ``seconds``; ``False`` once the output is closed."""
        if not select.select([raw], [], [], seconds)[0]:
            return True
        try:
            chunk = raw.recv(65536)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self.pending += chunk
        while len(self.pending) >= 8:
            stream, size = self.pending[0], struct.unpack(">I", self.pending[4:8])[0]
            if len(self.pending) < 8 + size:
                break
            payload, self.pending = self.pending[8 : 8 + size], self.pending[8 + size :]
            target = 2 if stream == 2 else 1
            room = self.caps[target] - len(self.kept[target])
            if room > 0:
                self.kept[target] += payload[:room]
            self.omitted[target] += max(len(payload) - max(room, 0), 0)
        return True


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
        artifact_store: FileArtifactStore | None = None,
        client: docker.DockerClient | None = None,
        disk_bytes: int | None = None,
    ) -> None:
        """``memory_bytes``, ``cpus`` and ``pids`` cap every run (a request's own limits may only lower the first
        and last); ``tmpfs_bytes`` and ``shm_bytes`` size the container's ``/tmp`` and ``/dev/shm`` (memory the
        run's limit pays for)."""
        super().__init__(WorkspaceManager(work_root, disk_bytes=disk_bytes), stager=stager, artifact_store=artifact_store)
        self.image = image
        self.allow_network = allow_network
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.pids = pids
        self.tmpfs_bytes = tmpfs_bytes
        self.shm_bytes = shm_bytes
        self.idle_seconds = idle_seconds
        self._client = client
        self._boxes: dict[str, _Box] = {}
        self._turns: dict[str, tuple[asyncio.Lock, int]] = {}  # workspace → (its lock, runs holding or awaiting it)
        self._last_used: dict[str, float] = {}
        self._prefix = "skillrun-" + hashlib.sha256(str(self.work_root.resolve()).encode()).hexdigest()[:8]

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            with map_docker_errors("connecting to Docker"):
                self._client = docker.from_env()
        return self._client

    def command_environment(self, run_dir: Path, request: RunRequest, variables: dict[str, str]) -> dict[str, str]:
        return command_environment(run_dir, request, variables, path=defaults.SANDBOX_PATH, shell="/bin/bash")

    async def _execute(
        self, workspace: Workspace, request: RunRequest, cwd: str, env: dict[str, str], cancel: Cancellation,
        *, environment: Path | None = None,
    ) -> ProcessOutcome:
        if request.network and not self.allow_network:
            raise InvalidRunRequestError("network", "network access is not allowed on this runtime (allow_network=False)")
        release = await self._take_turn(workspace.id)
        try:
            job = asyncio.get_running_loop().run_in_executor(None, self._exec, workspace, request, cwd, env, cancel)
        except BaseException:
            release()
            raise
        job.add_done_callback(lambda _: release())  # the turn ends when the run has, not when its caller gives up
        try:
            return await asyncio.shield(job)
        except asyncio.CancelledError:
            cancel.set()  # the caller gave up: the thread following the command ends the run
            raise

    async def _take_turn(self, workspace_id: str) -> Callable[[], None]:
        """Wait until no other run of the workspace is in its container; the returned call ends this one's turn."""
        lock, users = self._turns.get(workspace_id, (None, 0))
        lock = lock or asyncio.Lock()
        self._turns[workspace_id] = (lock, users + 1)

        def leave() -> None:
            held, left = self._turns[workspace_id]
            if left == 1:
                del self._turns[workspace_id]
            else:
                self._turns[workspace_id] = (held, left - 1)

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
        self, workspace: Workspace, request: RunRequest, cwd: str, env: dict[str, str], cancel: Cancellation
    ) -> ProcessOutcome:
        """``docker exec`` the command, follow it, end the run (blocking: the Docker SDK is synchronous)."""
        box = self._box(workspace, request)
        script = ulimit_prefix(request.limits, dedicated_user=False) + request.command
        api = self.client.api
        oom_before = box.host.oom_kills() if box.host else None
        started = self._last_used[workspace.id] = time.monotonic()
        with map_docker_errors("starting the command"):
            exec_id = api.exec_create(
                box.id, ["/bin/bash", "-c", script], environment=env, workdir=cwd, user=self._user(workspace),
                stdout=True, stderr=True,
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        outcome = self._follow(workspace, box, exec_id, getattr(sock, "_sock", sock), request, cancel, started)
        self._last_used[workspace.id] = time.monotonic()
        if box.host is not None and (box.host.oom_kills() or 0) > (oom_before or 0):
            outcome.oom_killed = True
            outcome.notes.append(f"a process was killed for going past the run's memory limit ({box.limits[0]} bytes)")
        return outcome

    def _follow(
        self, workspace: Workspace, box: _Box, exec_id: str, raw, request: RunRequest, cancel: Cancellation,  # noqa: ANN001
        started: float,
    ) -> ProcessOutcome:
        api = self.client.api
        frames = _Frames(request)
        deadline = started + request.timeout
        timed_out = cancelled = closed = False
        code = None
        next_check = started + POLL_SECONDS
        raw.setblocking(False)
        try:
            while True:
                now = time.monotonic()
                if cancel.is_set():
                    cancelled = True
                    break
                if now >= deadline:
                    timed_out = True
                    break
                if now >= next_check:
                    with map_docker_errors("following the command"):
                        info = api.exec_inspect(exec_id)
                    if not info["Running"]:
                        code = info.get("ExitCode")
                        break
                    next_check = now + (POLL_SECONDS / 10 if closed else POLL_SECONDS)
                if closed:
                    time.sleep(POLL_SECONDS / 10)
                elif not frames.read(raw, POLL_SECONDS):
                    closed, next_check = True, now  # output closed: the exit is a moment away
            # The run is over, however it ended: everything it started goes, detached or not.
            self._end_run(workspace, box)
            drain_until = time.monotonic() + defaults.KILL_GRACE_SECONDS
            while not closed and time.monotonic() < drain_until:
                closed = not frames.read(raw, POLL_SECONDS)
        finally:
            raw.close()
        for _ in range(100):  # a killed command's exit is recorded a moment after the kill
            if code is not None:
                break
            with contextlib.suppress(docker.errors.DockerException):
                info = api.exec_inspect(exec_id)
                if not info["Running"]:
                    code = info.get("ExitCode")
                    break
            time.sleep(POLL_SECONDS)
        exit_code = TIMEOUT_EXIT_CODE if timed_out else (code if code is not None else 128 + 9)
        return ProcessOutcome(
            stdout=bytes(frames.kept[1]), stderr=bytes(frames.kept[2]), stdout_omitted=frames.omitted[1],
            stderr_omitted=frames.omitted[2], exit_code=exit_code, timed_out=timed_out, cancelled=cancelled,
            duration_ms=int((time.monotonic() - started) * 1000), notes=[],
        )

    def _end_run(self, workspace: Workspace, box: _Box) -> None:
        """Kill everything the run started and empty the scratch folders: from the host when it sees the
        container, else from inside. A container that cannot be emptied is removed (the next run gets a new one)."""
        if box.host is not None:
            if not box.host.end_run():
                self._remove(workspace.id)
            return
        api = self.client.api
        try:
            api.exec_start(api.exec_create(box.id, ["/bin/bash", "-c", CLEAN_INSIDE], user=self._user(workspace))["Id"])
        except docker.errors.DockerException:
            self._remove(workspace.id)

    @staticmethod
    def _user(workspace: Workspace) -> str:
        """The run's ``uid:gid``: the workspace's own ids (a root worker), else the worker's."""
        if workspace.uid is not None:
            return f"{workspace.uid}:{workspace.gid}"
        return f"{os.getuid()}:{os.getgid()}"

    def _box(self, workspace: Workspace, request: RunRequest) -> _Box:
        """The workspace's running container, with the run's limits; created (or re-created with new mounts or
        network) when needed."""
        self._reap_idle(keep=workspace.id)
        mounts = self._library_mounts(request)
        network = bool(request.network)
        limits = (min(self.memory_bytes, request.limits.memory_bytes),
                  min(self.pids, request.limits.processes) + RESIDENT_PROCESSES)
        box = self._boxes.get(workspace.id)
        if box is not None:
            if mounts <= box.mounts and network == box.network and self._running(box):
                if limits != box.limits:
                    self._update(box, limits)
                return box
            self._remove(workspace.id)
        return self._create(workspace, mounts | (box.mounts if box else frozenset()), network, limits)

    def _library_mounts(self, request: RunRequest) -> frozenset[str]:
        root = resolve_root(request.skill.root, expected_sha256=request.skill.digest) if is_url(request.skill.root) else Path(request.skill.root)
        return frozenset({str(root.resolve())})

    def _update(self, box: _Box, limits: tuple[int, int]) -> None:
        """Give the container the run's memory and process limits (the SDK's update lacks ``PidsLimit``)."""
        api = self.client.api
        memory, pids = limits
        with map_docker_errors("setting the run's limits"):
            response = api._post_json(api._url("/containers/{0}/update", box.id),
                                      data={"Memory": memory, "MemorySwap": memory, "PidsLimit": pids})
            api._raise_for_status(response)
        box.limits = limits

    def _create(self, workspace: Workspace, mounts: frozenset[str], network: bool, limits: tuple[int, int]) -> _Box:
        name = f"{self._prefix}-{workspace.id}"
        volumes = {str(workspace.path): {"bind": str(workspace.path), "mode": "rw"}}
        volumes.update({m: {"bind": m, "mode": "ro"} for m in mounts})
        memory, pids = limits
        with map_docker_errors(f"starting the container of workspace {workspace.id!r}"):
            self.client.images.get(self.image)  # never pull: a missing image is a build step, not a download
            with contextlib.suppress(docker.errors.NotFound):
                self.client.containers.get(name).remove(force=True)
            container = self.client.containers.run(
                self.image, ["sleep", "infinity"], name=name, detach=True, init=True,
                labels={LABEL: workspace.id, "skillrun.work_root": str(self.work_root)},
                user=f"{RESIDENT_UID}:{RESIDENT_UID}", network_mode="bridge" if network else "none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True, ipc_mode="private",
                tmpfs={"/tmp": f"size={self.tmpfs_bytes},mode=1777,nosuid,nodev"}, shm_size=self.shm_bytes,
                mem_limit=memory, memswap_limit=memory, nano_cpus=int(self.cpus * 1e9), pids_limit=pids,
                volumes=volumes, working_dir="/",
            )
            container.reload()
        box = _Box(container.id, mounts, network, limits, HostView.find(container.id, container.attrs["State"]["Pid"]))
        self._boxes[workspace.id] = box
        self._last_used[workspace.id] = time.monotonic()
        return box

    def _running(self, box: _Box) -> bool:
        if box.host is not None:
            return box.host.init_pid in box.host.pids()
        try:
            return self.client.api.inspect_container(box.id)["State"]["Running"]
        except docker.errors.NotFound:
            return False

    def _remove(self, workspace_id: str) -> None:
        box = self._boxes.pop(workspace_id, None)
        self._last_used.pop(workspace_id, None)
        if box is not None:
            with contextlib.suppress(docker.errors.DockerException):
                self.client.api.remove_container(box.id, force=True)

    def _reap_idle(self, keep: str | None = None) -> None:
        """Remove the containers of workspaces idle longer than ``idle_seconds`` (none with a run going or waiting)."""
        now = time.monotonic()
        for workspace_id, last in list(self._last_used.items()):
            if workspace_id != keep and workspace_id not in self._turns and now - last > self.idle_seconds:
                self._remove(workspace_id)

    def container_id(self, workspace_id: str) -> str | None:
        box = self._boxes.get(workspace_id)
        return box.id if box else None

    def _forget_workspace(self, workspace: Workspace) -> None:
        self._remove(workspace.id)

    def remove_containers(self) -> None:
        """Remove every container this runtime started (the workspaces stay)."""
        for workspace_id in list(self._boxes):
            self._remove(workspace_id)

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.remove_containers)
