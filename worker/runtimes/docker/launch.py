"""How a workspace's container is started: hardened, and with its executor (``container_executor``) listening
when the image can run one.

Every container gets the same hardening: no network unless the run asks and the operator allows it, every
capability dropped, no-new-privileges, a read-only root, private size-capped ``/tmp`` and ``/dev/shm``, memory
(swap included), CPU and process limits, no proxy settings of the Docker client, the OCI runtime the operator
chose (``runc``, or ``runsc`` for gVisor). With an executor, the container's first process is the executor,
started as root holding only ``CAP_SETUID``, ``CAP_SETGID``, ``CAP_SETPCAP`` and ``CAP_KILL`` until it becomes
``RESIDENT_UID`` for good with the first, second and last; its control folder and program are mounted below
``EXECUTOR_MOUNTS``, a file system only root may enter, so no command reaches them whoever the worker runs as;
the container is handed over once the executor answers on its socket. An image whose containers
cannot run the executor (no ``python3``, or it does not come up) gets one as before — ``sleep`` under an init, as
``RESIDENT_UID`` — whose runs use ``docker exec``, and the reason is kept in the container's labels (and, when
the image itself cannot, remembered for the image).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors
from docker.types import Mount

from worker import defaults
from worker.runtimes.docker.executor import (
    CONTROL_MOUNT,
    EXECUTOR_MOUNTS,
    PROGRAM,
    PROGRAM_MOUNT,
    START_SECONDS,
    ExecutorFiles,
    ExecutorLink,
    ExecutorUnavailable,
)
from worker.runtimes.docker.host import EXECUTOR_RESIDENTS, RESIDENT_PROCESSES, RESIDENT_UID
from worker.runtimes.docker.engine import ENGINE_ERRORS
from worker.errors import ExecutorError

EXECUTOR_LABEL = "skillrun.executor"
"""On a container with an executor: its control folder."""
NO_EXECUTOR_LABEL = "skillrun.no_executor"
"""On a container without one: why (its runs use ``docker exec``)."""
EXECUTOR_MEMORY_BYTES = 32 * 1024 * 1024
"""Memory a container's executor may use besides the run's limit (it takes ~10 MB)."""
LOOK_SECONDS = 0.1
"""How often a container whose executor is not listening yet is looked at (has it ended?)."""
EXECUTOR_MOUNTS_BYTES = 64 * 1024
"""The size of the tmpfs at ``EXECUTOR_MOUNTS`` (it holds nothing but two mount points)."""
EXECUTOR_MOUNTS_OPTIONS = f"size={EXECUTOR_MOUNTS_BYTES},mode=0700,nosuid,nodev"


@dataclass(frozen=True)
class BoxSettings:
    """What every container of a runtime gets (its constructor's options)."""

    cpus: float
    tmpfs_bytes: int
    shm_bytes: int
    idle_seconds: float
    oci_runtime: str = "runc"


@dataclass(frozen=True)
class Spec:
    """One container to start: its name, labels, image, user, mounts, network and limits."""

    name: str
    labels: dict[str, str]
    image: str
    user: str  # the workspace's uid:gid
    volumes: dict[str, dict[str, str]]
    """The workspace's folder (read-write) and the folders shown read-only, each at its own path."""
    network: bool
    run_limits: tuple[int, int]  # the run's memory bytes and processes
    workspace: str
    """The workspace's folder, shown at ``SANDBOX_WORKSPACE_ALIAS`` too."""


def container_limits(run_limits: tuple[int, int], *, executor: bool) -> tuple[int, int]:
    """A container's memory and process limits for a run's: its own processes (and executor's memory) on top."""
    memory, processes = run_limits
    if executor:
        return memory + EXECUTOR_MEMORY_BYTES, processes + EXECUTOR_RESIDENTS
    return memory, processes + RESIDENT_PROCESSES


class _NoExecutorError(ExecutorError):
    """The image's containers cannot run the executor (remembered for the image)."""


class Launcher:
    """Starts workspace containers (blocking: the Docker SDK is synchronous)."""

    def __init__(self, client: Callable[[], docker.DockerClient], settings: BoxSettings,
                 executors: ExecutorFiles) -> None:
        self.client = client
        self.settings = settings
        self.executors = executors
        self._no_executor: dict[str, str] = {}  # image → why its containers run no executor

    def start(self, spec: Spec) -> tuple[str, ExecutorLink | None]:
        """Start the container ``spec`` describes; its id, and a connection to its executor (``None``: it has
        none). Engine errors are the caller's to translate (``APIError`` 409: the name is taken)."""
        problem = self._no_executor.get(spec.image)
        permanent = False  # the image cannot run the executor (not a slow start)
        if problem is None:
            self.executors.install()
            control, token = self.executors.new_control()
            try:
                container_id = self._run(spec, executor=(control, token))
                try:
                    return container_id, self._await(container_id, control, token)
                except ExecutorUnavailable as exc:
                    problem = str(exc)
                    with contextlib.suppress(*ENGINE_ERRORS):
                        self.client().api.remove_container(container_id, force=True)
            except _NoExecutorError as exc:
                problem, permanent = str(exc), True
            except docker.errors.APIError as exc:
                self.executors.remove_control(control)
                if exc.status_code == 409:
                    raise
                problem, permanent = f"the executor could not start: {exc.explanation or exc}", True
                with contextlib.suppress(*ENGINE_ERRORS):
                    self.client().api.remove_container(spec.name, force=True)
            self.executors.remove_control(control)
        container_id = self._run(spec, problem=problem)
        if permanent:  # the image starts without the executor, not with it
            self._no_executor[spec.image] = problem
        return container_id, None

    def _run(self, spec: Spec, *, executor: tuple[Path, bytes] | None = None, problem: str = "") -> str:
        settings = self.settings
        memory, pids = container_limits(spec.run_limits, executor=executor is not None)
        options = dict(
            name=spec.name, detach=True, network_mode="bridge" if spec.network else "none", cap_drop=["ALL"],
            security_opt=["no-new-privileges"], read_only=True, ipc_mode="private",
            tmpfs={"/tmp": f"size={settings.tmpfs_bytes},mode=1777,nosuid,nodev"}, shm_size=settings.shm_bytes,
            mem_limit=memory, memswap_limit=memory, nano_cpus=int(settings.cpus * 1e9), pids_limit=pids,
            working_dir="/", use_config_proxy=False, runtime=settings.oci_runtime,
            mounts=[Mount(defaults.SANDBOX_WORKSPACE_ALIAS, spec.workspace, type="bind")],
        )
        if executor is not None:
            control, _ = executor
            volumes = {**spec.volumes, str(control): {"bind": CONTROL_MOUNT, "mode": "rw"},
                       str(self.executors.program): {"bind": PROGRAM_MOUNT, "mode": "ro"}}
            options["tmpfs"] = {**options["tmpfs"], EXECUTOR_MOUNTS: EXECUTOR_MOUNTS_OPTIONS}
            return self.client().containers.run(
                spec.image, [spec.user, f"{RESIDENT_UID}:{RESIDENT_UID}"], entrypoint=["python3", "-I", "-S", PROGRAM],
                user="0:0", cap_add=["SETUID", "SETGID", "SETPCAP", "KILL"], volumes=volumes,
                labels={**spec.labels, EXECUTOR_LABEL: str(control)}, **options,
            ).id
        return self.client().containers.run(
            spec.image, ["sleep", "infinity"], init=True, user=f"{RESIDENT_UID}:{RESIDENT_UID}", volumes=spec.volumes,
            labels={**spec.labels, NO_EXECUTOR_LABEL: problem[:500]}, **options,
        ).id

    def _await(self, container_id: str, control: Path, token: bytes) -> ExecutorLink:
        """The executor's connection, once it listens (``_NoExecutorError`` when the container ended first,
        ``ExecutorUnavailable`` when it did not listen in time)."""
        api = self.client().api
        deadline = time.monotonic() + START_SECONDS
        next_look = time.monotonic() + LOOK_SECONDS
        while True:
            try:
                return ExecutorLink.connect(control, token)
            except ExecutorUnavailable as exc:
                last = exc
            now = time.monotonic()
            if now >= next_look:
                state = api.inspect_container(container_id)["State"]
                if not state["Running"]:
                    said = api.logs(container_id, tail=5).decode(errors="replace").strip()
                    api.remove_container(container_id, force=True)
                    raise _NoExecutorError(f"the executor ended as it started (exit code {state['ExitCode']}): "
                                           f"{said[-300:] or 'no output'}")
                next_look = now + LOOK_SECONDS
            if now >= deadline:
                raise ExecutorUnavailable(f"the executor did not listen within {START_SECONDS:.0f} s ({last})")
            time.sleep(0.002)


__all__ = ["EXECUTOR_LABEL", "NO_EXECUTOR_LABEL", "BoxSettings", "Launcher", "Spec", "container_limits"]
