"""The Docker runtime: one container per workspace, reused across the workspace's runs (``docker exec`` per run).

Hardened by default: no network (a request may ask for it where the operator allows it), the image's non-root
user, every capability dropped, no-new-privileges, a read-only root file system with a tmpfs for ``/tmp``,
memory (swap included), CPU and process-count limits, an init process that reaps orphans. Only this workspace
is mounted writable, at the same path as on the host (so the six variables mean the same inside), and the library
roots its skills come from are mounted read-only at their own paths. Containers idle longer than
``idle_seconds`` are removed (the workspace stays on the host). A timed-out or cancelled run's processes are
killed inside the container (every process of the sandbox user), not only the waiting call.

Engine errors are translated in one place (``map_docker_errors``) into ``RuntimeUnavailableError`` carrying the
engine's reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import select
import signal
import struct
import time
from collections.abc import Iterator
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
from worker.runtimes.host import HostWorkspaceRuntime
from worker.staging import BaseSkillStager
from worker.workspace import Workspace, WorkspaceManager

DEFAULT_IMAGE = "skillrun/sandbox:latest"
SANDBOX_UID = 1000
DEFAULT_MEMORY_BYTES = 1024**3
DEFAULT_CPUS = 1.0
DEFAULT_PIDS = 256
DEFAULT_TMPFS_BYTES = 64 * 1024 * 1024
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
        idle_seconds: float = DEFAULT_IDLE_SECONDS,
        stager: BaseSkillStager | None = None,
        artifact_store: FileArtifactStore | None = None,
        client: docker.DockerClient | None = None,
        disk_bytes: int | None = None,
    ) -> None:
        super().__init__(WorkspaceManager(work_root, fixed_uid=SANDBOX_UID, disk_bytes=disk_bytes), stager=stager,
                         artifact_store=artifact_store)
        self.image = image
        self.allow_network = allow_network
        self.memory_bytes = memory_bytes
        self.cpus = cpus
        self.pids = pids
        self.tmpfs_bytes = tmpfs_bytes
        self.idle_seconds = idle_seconds
        self._client = client
        self._containers: dict[str, tuple[str, frozenset[str], bool]] = {}  # workspace → (id, mounts, network)
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
        self, workspace: Workspace, request: RunRequest, cwd: str, env: dict[str, str], cancel: Cancellation
    ) -> ProcessOutcome:
        try:
            return await asyncio.to_thread(self._exec, workspace, request, cwd, env, cancel)
        except asyncio.CancelledError:
            cancel.set()  # the caller gave up: the thread following the command kills it
            raise

    def _exec(
        self, workspace: Workspace, request: RunRequest, cwd: str, env: dict[str, str], cancel: Cancellation
    ) -> ProcessOutcome:
        """``docker exec`` the command and follow it (blocking: the Docker SDK is synchronous)."""
        if request.network and not self.allow_network:
            raise InvalidRunRequestError("network", "network access is not allowed on this runtime (allow_network=False)")
        container_id = self._container(workspace, request)
        script = ulimit_prefix(request.limits, dedicated_user=False) + request.command
        api = self.client.api
        oom_before = _oom_kills(container_id)
        started = time.monotonic()
        with map_docker_errors("starting the command"):
            exec_id = api.exec_create(
                container_id, ["/bin/bash", "-c", script], environment=env, workdir=cwd,
                user=f"{SANDBOX_UID}:{SANDBOX_UID}", stdout=True, stderr=True,
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        raw = getattr(sock, "_sock", sock)
        outcome = self._follow(container_id, exec_id, raw, request, cancel, started)
        self._last_used[workspace.id] = time.monotonic()
        if outcome.exit_code != 0 and (_oom_kills(container_id) or 0) > (oom_before or 0):
            outcome.oom_killed = True
            outcome.notes.append(f"killed for using more than its memory limit ({self.memory_bytes} bytes)")
        return outcome

    def _follow(
        self, container_id: str, exec_id: str, raw, request: RunRequest, cancel: Cancellation, started: float  # noqa: ANN001
    ) -> ProcessOutcome:
        api = self.client.api
        buffers = {1: bytearray(), 2: bytearray()}
        caps = {1: request.limits.stdout_bytes, 2: request.limits.stderr_bytes}
        omitted = {1: 0, 2: 0}
        pending = b""
        deadline = started + request.timeout
        timed_out = cancelled = exited = False
        notes: list[str] = []
        next_check = 0.0
        drain_until = 0.0
        raw.setblocking(False)
        try:
            while True:
                now = time.monotonic()
                if not exited:
                    if cancel.is_set() and not cancelled:
                        cancelled = True
                        self._kill_group(container_id, exec_id)
                    if now >= deadline and not timed_out:
                        timed_out = True
                        self._kill_group(container_id, exec_id)
                    if now >= next_check:
                        next_check = now + POLL_SECONDS
                        if not api.exec_inspect(exec_id)["Running"]:
                            exited = True
                            # Whatever the command left running in its process group goes too.
                            self._kill_group(container_id, exec_id)
                            drain_until = now + defaults.KILL_GRACE_SECONDS
                elif now >= drain_until:
                    # A process that left the group still holds the output: end every sandbox process (the
                    # container's keep-alive too: the container is made anew for the next run).
                    self._kill_all(container_id)
                    notes.append("a background process kept the output open; it was killed")
                    break
                readable, _, _ = select.select([raw], [], [], POLL_SECONDS)
                if not readable:
                    continue
                try:
                    chunk = raw.recv(65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    break
                pending += chunk
                while len(pending) >= 8:
                    stream, size = pending[0], struct.unpack(">I", pending[4:8])[0]
                    if len(pending) < 8 + size:
                        break
                    payload, pending = pending[8 : 8 + size], pending[8 + size :]
                    target = 2 if stream == 2 else 1
                    room = caps[target] - len(buffers[target])
                    if room > 0:
                        buffers[target] += payload[:room]
                    omitted[target] += max(len(payload) - max(room, 0), 0)
        finally:
            raw.close()
        code = None
        with contextlib.suppress(docker.errors.NotFound):  # gone with its container after a kill of everything
            for _ in range(100):
                info = api.exec_inspect(exec_id)
                if not info["Running"]:
                    code = info.get("ExitCode")
                    break
                time.sleep(POLL_SECONDS)
        exit_code = TIMEOUT_EXIT_CODE if timed_out else (code if code is not None else 128 + 9)
        return ProcessOutcome(
            stdout=bytes(buffers[1]), stderr=bytes(buffers[2]), stdout_omitted=omitted[1], stderr_omitted=omitted[2],
            exit_code=exit_code, timed_out=timed_out, cancelled=cancelled,
            duration_ms=int((time.monotonic() - started) * 1000), notes=notes,
        )

    def _kill_group(self, container_id: str, exec_id: str) -> None:
        """SIGKILL the command's process group (each exec starts its own session, so the group is the command and
        what it started). From the host when it may signal the container's processes, else from inside."""
        with contextlib.suppress(docker.errors.DockerException):
            pid = 0
            for _ in range(40):  # the exec may be a moment from starting its process
                pid = self.client.api.exec_inspect(exec_id).get("Pid") or 0
                if pid:
                    break
                time.sleep(POLL_SECONDS / 2)
            if pid:
                try:
                    os.killpg(pid, signal.SIGKILL)
                    return
                except ProcessLookupError:
                    return
                except PermissionError:
                    pass
            self._kill_all(container_id)

    def _kill_all(self, container_id: str) -> None:
        """SIGKILL every sandbox-user process in the container but its init; the container stops with its
        keep-alive and is made anew on the next run."""
        with contextlib.suppress(docker.errors.DockerException):
            self.client.api.exec_start(
                self.client.api.exec_create(container_id, ["kill", "-9", "-1"], user=f"{SANDBOX_UID}:{SANDBOX_UID}")["Id"]
            )
        for workspace_id, (known_id, _, _) in list(self._containers.items()):
            if known_id == container_id:
                self._remove(workspace_id)

    def _container(self, workspace: Workspace, request: RunRequest) -> str:
        """The workspace's running container, created (or re-created with new mounts) when needed."""
        self._reap_idle(keep=workspace.id)
        mounts = self._library_mounts(workspace, request)
        network = bool(request.network)
        known = self._containers.get(workspace.id)
        if known is not None:
            container_id, have, have_network = known
            if mounts <= have and network == have_network and self._running(container_id):
                return container_id
            self._remove(workspace.id)
        return self._create(workspace, mounts | (known[1] if known else frozenset()), network)

    def _library_mounts(self, workspace: Workspace, request: RunRequest) -> frozenset[str]:
        root = resolve_root(request.skill.root, expected_sha256=request.skill.digest) if is_url(request.skill.root) else Path(request.skill.root)
        return frozenset({str(root.resolve())})

    def _create(self, workspace: Workspace, mounts: frozenset[str], network: bool) -> str:
        name = f"{self._prefix}-{workspace.id}"
        volumes = {str(workspace.path): {"bind": str(workspace.path), "mode": "rw"}}
        volumes.update({m: {"bind": m, "mode": "ro"} for m in mounts})
        with map_docker_errors(f"starting the container of workspace {workspace.id!r}"):
            self.client.images.get(self.image)  # never pull: a missing image is a build step, not a download
            with contextlib.suppress(docker.errors.NotFound):
                self.client.containers.get(name).remove(force=True)
            container = self.client.containers.run(
                self.image, ["sleep", "infinity"], name=name, detach=True, init=True,
                labels={LABEL: workspace.id, "skillrun.work_root": str(self.work_root)},
                user=f"{SANDBOX_UID}:{SANDBOX_UID}", network_mode="bridge" if network else "none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True,
                tmpfs={"/tmp": f"size={self.tmpfs_bytes},mode=1777"},
                mem_limit=self.memory_bytes, memswap_limit=self.memory_bytes, nano_cpus=int(self.cpus * 1e9),
                pids_limit=self.pids, volumes=volumes, working_dir=str(workspace.path),
            )
        self._containers[workspace.id] = (container.id, mounts, network)
        self._last_used[workspace.id] = time.monotonic()
        return container.id

    def _running(self, container_id: str) -> bool:
        try:
            return self.client.api.inspect_container(container_id)["State"]["Running"]
        except docker.errors.NotFound:
            return False

    def _remove(self, workspace_id: str) -> None:
        known = self._containers.pop(workspace_id, None)
        self._last_used.pop(workspace_id, None)
        if known is not None:
            with contextlib.suppress(docker.errors.DockerException):
                self.client.api.remove_container(known[0], force=True)

    def _reap_idle(self, keep: str | None = None) -> None:
        """Remove the containers of workspaces idle longer than ``idle_seconds``."""
        now = time.monotonic()
        for workspace_id, last in list(self._last_used.items()):
            if workspace_id != keep and now - last > self.idle_seconds:
                self._remove(workspace_id)

    def container_id(self, workspace_id: str) -> str | None:
        known = self._containers.get(workspace_id)
        return known[0] if known else None

    def _forget_workspace(self, workspace: Workspace) -> None:
        self._remove(workspace.id)

    def remove_containers(self) -> None:
        """Remove every container this runtime started (the workspaces stay)."""
        for workspace_id in list(self._containers):
            self._remove(workspace_id)

    async def close(self) -> None:
        await super().close()
        await asyncio.to_thread(self.remove_containers)


def _oom_kills(container_id: str) -> int | None:
    """How many processes the kernel killed for memory in the container's cgroup (v1 or v2), if readable."""
    for path in (f"/sys/fs/cgroup/memory/docker/{container_id}/memory.oom_control",
                 f"/sys/fs/cgroup/system.slice/docker-{container_id}.scope/memory.events"):
        try:
            with open(path) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except OSError:
            continue
    return None
