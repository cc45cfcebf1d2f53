"""The Docker runtime's workspace containers: made hardened, reused, given each run's limits, reaped when idle.

A workspace has a container per image its runs need: the sandbox image, and a derived image for each set of
Debian packages its skills declare (``container_images``). Every container of a workspace mounts the same
workspace (read-write, at its host path) and runs commands as the workspace's user; runs of a workspace take turns
across all of them (``container``), so a run has its container to itself.

Hardened by default: no network (a run may ask for it where the operator allows it), every capability dropped,
no-new-privileges, a read-only root, private size-capped ``/tmp`` and ``/dev/shm``, memory (swap included), CPU
and process limits, an init that reaps orphans, the init and keep-alive as ``RESIDENT_UID``, and no proxy settings
of the Docker client. Read-only besides the workspace, each at its host path: the library roots its runs' skills
come from, and the dependency environments they use (one folder of the environment store's ``envs/`` each, so
``VIRTUAL_ENV`` means the same inside). A run sees the environments of the skills its workspace ran in that
container and no other: not the store's other environments, locks or builds, and in a workspace whose skills
declare nothing, nothing of the store at all.

Mounts are fixed when a container is made: one that lacks a run's library root or environment, or mounts an
earlier folder at that path (an environment removed and built again), is made again with the run's added (runs
take turns, so none is in it then).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from worker.runtimes.container_host import RESIDENT_UID, HostView
from worker.runtimes.docker_engine import map_docker_errors
from worker.workspace import Workspace

LABEL = "skillrun.workspace"

Key = tuple[str, str]
"""A container's key: its workspace's id and its image."""


@dataclass
class Box:
    """A workspace's container as the runtime knows it."""

    id: str
    image: str
    mounts: dict[str, int]  # folder mounted read-only → its inode when it was mounted
    network: bool
    limits: tuple[int, int]  # memory bytes (swap included), processes (residents included)
    host: HostView | None  # None: the worker cannot see the container's processes (another PID namespace)


@dataclass(frozen=True)
class BoxSettings:
    """What every container of a runtime gets (its constructor's options)."""

    cpus: float
    tmpfs_bytes: int
    shm_bytes: int
    idle_seconds: float


class Boxes:
    """The containers of a runtime's workspaces, keyed by workspace and image (see the module's description).

    ``used`` hears of an image whenever a container of it starts or goes (derived images' last use)."""

    def __init__(self, client: Callable[[], docker.DockerClient], settings: BoxSettings, *, prefix: str,
                 work_root: Path, used: Callable[[str], None]) -> None:
        self.client = client
        self.settings = settings
        self.prefix = prefix
        self.work_root = work_root
        self.used = used
        self._boxes: dict[Key, Box] = {}
        self._last_used: dict[Key, float] = {}

    def get(self, workspace: Workspace, image: str, folders: list[str], network: bool,
            limits: tuple[int, int]) -> Box:
        """The workspace's running container of ``image`` with ``limits`` and ``folders`` mounted read-only; made
        (or made again with ``folders`` added to what it mounted, or with the other network setting) when needed."""
        key = (workspace.id, image)
        wanted = {folder: os.stat(folder).st_ino for folder in folders}
        box = self._boxes.get(key)
        if box is not None:
            mounted = all(box.mounts.get(folder) == inode for folder, inode in wanted.items())
            if mounted and network == box.network and self.running(box):
                if limits != box.limits:
                    self._update(box, limits)
                self.touch(key)
                return box
            self.remove(key)
            wanted = {**_still_there(box.mounts), **wanted}
        return self._create(workspace, image, wanted, network, limits)

    def touch(self, key: Key) -> None:
        self._last_used[key] = time.monotonic()

    def _update(self, box: Box, limits: tuple[int, int]) -> None:
        """Give the container the run's memory and process limits (the SDK's update lacks ``PidsLimit``)."""
        api = self.client().api
        memory, pids = limits
        with map_docker_errors("setting the run's limits"):
            response = api._post_json(api._url("/containers/{0}/update", box.id),
                                      data={"Memory": memory, "MemorySwap": memory, "PidsLimit": pids})
            api._raise_for_status(response)
        box.limits = limits

    def _create(self, workspace: Workspace, image: str, mounts: dict[str, int], network: bool,
                limits: tuple[int, int]) -> Box:
        client = self.client()
        name = self.name(workspace.id, image)
        volumes = {str(workspace.path): {"bind": str(workspace.path), "mode": "rw"}}
        volumes.update({folder: {"bind": folder, "mode": "ro"} for folder in mounts})
        memory, pids = limits
        settings = self.settings
        with map_docker_errors(f"starting the container of workspace {workspace.id!r}"):
            client.images.get(image)  # never pull: a missing image is a build step, not a download
            with contextlib.suppress(docker.errors.NotFound):
                client.containers.get(name).remove(force=True)
            container = client.containers.run(
                image, ["sleep", "infinity"], name=name, detach=True, init=True,
                labels={LABEL: workspace.id, "skillrun.work_root": str(self.work_root)},
                user=f"{RESIDENT_UID}:{RESIDENT_UID}", network_mode="bridge" if network else "none",
                cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True, ipc_mode="private",
                tmpfs={"/tmp": f"size={settings.tmpfs_bytes},mode=1777,nosuid,nodev"}, shm_size=settings.shm_bytes,
                mem_limit=memory, memswap_limit=memory, nano_cpus=int(settings.cpus * 1e9), pids_limit=pids,
                volumes=volumes, working_dir="/", use_config_proxy=False,
            )
            container.reload()
        box = Box(container.id, image, mounts, network, limits,
                  HostView.find(container.id, container.attrs["State"]["Pid"]))
        self._boxes[(workspace.id, image)] = box
        self.touch((workspace.id, image))
        self.used(image)
        return box

    def name(self, workspace_id: str, image: str) -> str:
        """The container's name: the runtime's prefix, the workspace and a hash of the image."""
        return f"{self.prefix}-{workspace_id}-{hashlib.sha256(image.encode()).hexdigest()[:12]}"

    def running(self, box: Box) -> bool:
        if box.host is not None:
            return box.host.init_pid in box.host.pids()
        try:
            return self.client().api.inspect_container(box.id)["State"]["Running"]
        except docker.errors.NotFound:
            return False

    def remove(self, key: Key) -> None:
        """Remove one container (a new one is made for the workspace's next run of its image)."""
        box = self._boxes.pop(key, None)
        self._last_used.pop(key, None)
        if box is not None:
            with contextlib.suppress(docker.errors.DockerException):
                self.client().api.remove_container(box.id, force=True)
            self.used(box.image)

    def remove_workspace(self, workspace_id: str) -> None:
        """Remove every container of the workspace."""
        for key in [key for key in self._boxes if key[0] == workspace_id]:
            self.remove(key)

    def reap_idle(self, keep: Callable[[str], bool]) -> None:
        """Remove the containers idle longer than ``idle_seconds`` but those of workspaces ``keep`` names."""
        now = time.monotonic()
        for key, last in list(self._last_used.items()):
            if not keep(key[0]) and now - last > self.settings.idle_seconds:
                self.remove(key)

    def container_id(self, workspace_id: str, image: str) -> str | None:
        box = self._boxes.get((workspace_id, image))
        return box.id if box else None

    def remove_all(self) -> None:
        for key in list(self._boxes):
            self.remove(key)


def _still_there(mounts: dict[str, int]) -> dict[str, int]:
    """The mounted folders that are still the same folder at their path (not removed, not replaced)."""
    kept = {}
    for folder, inode in mounts.items():
        with contextlib.suppress(OSError):
            if os.stat(folder).st_ino == inode:
                kept[folder] = inode
    return kept
