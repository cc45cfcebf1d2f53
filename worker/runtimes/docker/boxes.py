"""The Docker runtime's workspace containers: found by label, made once, reused, given each run's limits, reaped
when idle — shared by every worker of one work root.

A workspace has a container per image its runs need: the sandbox image, and a derived image for each set of
Debian packages its skills declare (``container_images``). Every container of a workspace mounts the same
workspace (read-write, at its host path) and runs commands as the workspace's user.

Runs of a workspace take turns across all its containers and across every worker of the work root (two workers
may both be handed runs of one workspace): a turn is an exclusive ``flock`` on the workspace's file under the
work root's ``.skillrun/containers/`` (named, like its containers, by the workspace's folder), held by the thread
that runs the command. Everything done to a workspace's containers happens within its turn: finding its
container (by its labels: workspace folder, work root, image — the engine says what exists, unless this runtime
had the last turn and its executor connection is alive), making it when there is none (so at most once; its name
is fixed by folder and image, and should the engine still answer 409 Conflict, the one its labels find is used),
updating its limits, ending a run in it (``container_host``), and removing it. A container is therefore never
removed while a run of another worker is in it. The file's time is the workspace's last use on this host: idle
containers are reaped by whichever worker looks first, each only when its turn can be had without waiting; so are
a gone worker's warm containers (``container_pool``) and executor control folders no container names.

How a container is started and hardened is ``container_launch``'s. Read-only besides the workspace, each at its
host path: the library roots its runs' skills come from, and the dependency environments they use (one folder of
the environment store's ``envs/`` each, so ``VIRTUAL_ENV`` means the same inside). Mounts are fixed when a
container is made (and recorded in a label): one that lacks a run's library root or environment, or mounts an
earlier folder at that path, is made again with the run's added.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import docker
import docker.errors

from worker.errors import RuntimeUnavailableError
from worker.runtimes.docker.executor import ExecutorFiles, ExecutorLink
from worker.runtimes.docker.host import EXECUTOR_RESIDENTS, RESIDENT_PROCESSES, HostView
from worker.runtimes.docker.launch import (
    EXECUTOR_LABEL,
    NO_EXECUTOR_LABEL,
    BoxSettings,
    Launcher,
    Spec,
    container_limits,
)
from worker.runtimes.docker.engine import ENGINE_ERRORS, map_docker_errors
from worker.workspaces.manager import METADATA_FILE, Workspace, WorkspaceManager

LABEL = "skillrun.workspace"
ROOT_LABEL = "skillrun.work_root"
IMAGE_LABEL = "skillrun.image"
MOUNTS_LABEL = "skillrun.mounts"
WARM_LABEL = "skillrun.warm"
"""On a warm pool's container: the user id of its reserved folder."""
REAP_INTERVAL_SECONDS = 30.0
"""The longest between two looks for idle containers (a look lists the work root's containers)."""

Key = tuple[str, str]
"""A container's key: its workspace's folder name (unique on the work root, and known before the workspace has an
id: a warm pool's container is made for a folder no workspace has taken yet) and its image."""


@dataclass
class Box:
    """A workspace's container as the engine describes it."""

    id: str
    image: str
    mounts: dict[str, int]  # folder mounted read-only → its inode when it was mounted
    network: bool
    limits: tuple[int, int]  # memory bytes (swap included), processes (residents included)
    host: HostView | None  # None: the worker cannot see the container's control group (another PID namespace)
    control: Path | None = None  # the executor's control folder; None: no executor (runs use docker exec)
    token: bytes = b""
    problem: str = ""  # why a container has no executor
    link: ExecutorLink | None = None  # this worker's connection to the executor, once made

    @property
    def residents(self) -> int:
        return EXECUTOR_RESIDENTS if self.control is not None else RESIDENT_PROCESSES

    def limits_for(self, run_limits: tuple[int, int]) -> tuple[int, int]:
        return container_limits(run_limits, executor=self.control is not None)

    def forget_link(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None


class Boxes:
    """The containers of a work root's workspaces, keyed by workspace and image (see the module's description).

    ``turns`` is the folder of the workspaces' turn files; ``used`` hears of an image whenever a container of it
    is made or removed (derived images' last use); ``workspaces`` gets back the reserved folders of warm
    containers no workspace took."""

    def __init__(self, client: Callable[[], docker.DockerClient], settings: BoxSettings, *, prefix: str,
                 work_root: Path, turns: Path, used: Callable[[str], None], workspaces: WorkspaceManager) -> None:
        self.client = client
        self.settings = settings
        self.prefix = prefix
        self.work_root = work_root
        self.turns = turns
        self.used = used
        self.workspaces = workspaces
        self.executors = ExecutorFiles(turns.parent)
        self.launcher = Launcher(client, settings, self.executors)
        self._lock = threading.Lock()  # guards _boxes and _next_reap: threads of many runs use them
        self._boxes: dict[Key, Box] = {}  # the containers this runtime used (what the engine said last)
        self._next_reap = 0.0
        self._instance = secrets.token_hex(8).encode()  # written into a turn file by each turn of this runtime
        self._resumed: set[str] = set()  # workspaces whose last turn on this host was this runtime's

    @contextlib.contextmanager
    def turn(self, folder: str, *, wait: bool = True) -> Iterator[bool]:
        """The workspace's turn on this host, ``True`` once held (waits for it; ``wait=False``: ``False`` at once
        when another holds it). Its end marks the workspace used, and by this runtime: a turn that follows one of
        this runtime's trusts what this runtime knows of the workspace's containers without asking the engine."""
        self.turns.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.turns / folder, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            if os.pread(fd, len(self._instance), 0) == self._instance:
                self._resumed.add(folder)
            else:
                self._resumed.discard(folder)
            try:
                yield True
            finally:
                os.pwrite(fd, self._instance, 0)  # also the workspace's last use (the file's time)
        finally:
            os.close(fd)  # releases the lock

    def get(self, workspace: Workspace, image: str, folders: list[str], network: bool,
            run_limits: tuple[int, int]) -> Box:
        """The workspace's running container of ``image`` with room for ``run_limits`` (memory bytes, processes)
        and ``folders`` mounted read-only; made (or made again with ``folders`` added to what it mounted, with the
        other network setting, or with the run's limits where the engine cannot change them) when needed. Call it
        in the workspace's turn.

        The engine is asked only when this runtime's last look may be out of date: a container whose executor this
        runtime is connected to, in a workspace no other runtime had a turn in since, is as it was (had it been
        removed or stopped, the connection would show it)."""
        key = (workspace.path.name, image)
        wanted = {folder: os.stat(folder).st_ino for folder in folders}
        with self._lock:
            box = self._boxes.get(key)
        if box is None or box.link is None or workspace.path.name not in self._resumed or not box.link.usable():
            box = self.find(key)
        if box is not None:
            if all(box.mounts.get(folder) == inode for folder, inode in wanted.items()) and network == box.network:
                limits = box.limits_for(run_limits)
                if limits == box.limits:
                    return box
                try:
                    self._update(box, limits)
                    return box
                except RuntimeUnavailableError:  # gVisor's engine cannot update a running container's limits
                    pass
            self.remove(key)
            wanted = {**_still_there(box.mounts), **wanted}
        return self._create(workspace, image, wanted, network, run_limits)

    def find(self, key: Key) -> Box | None:
        """The workspace's running container of the image, as the engine describes it now (the one this runtime
        knows, else one found by its labels); stopped ones found are removed. Call it in the workspace's turn."""
        api = self.client().api
        with self._lock:
            known = self._boxes.get(key)

        def candidates() -> Iterator[str]:
            if known is not None:
                yield known.id
            yield from (c["Id"] for c in api.containers(all=True, filters={"label": self._labels(*key)}))

        with map_docker_errors(f"finding the container of workspace {key[0]!r}"):
            for found_id in candidates():
                try:
                    attrs = api.inspect_container(found_id)
                except docker.errors.NotFound:
                    continue
                if attrs["State"]["Running"] and attrs["Config"]["Labels"].get(ROOT_LABEL) == str(self.work_root):
                    box = self._box(attrs, known)
                    with self._lock:
                        self._boxes[key] = box
                    return box
                with contextlib.suppress(docker.errors.NotFound):
                    api.remove_container(found_id, force=True)  # stopped (an engine restart, a crash): not in use
        with self._lock:
            self._boxes.pop(key, None)
        return None

    def _labels(self, folder: str, image: str) -> list[str]:
        return [f"{LABEL}={folder}", f"{ROOT_LABEL}={self.work_root}", f"{IMAGE_LABEL}={image}"]

    @staticmethod
    def _box(attrs: dict, known: Box | None) -> Box:
        config, labels = attrs["HostConfig"], attrs["Config"]["Labels"]
        control = Path(labels[EXECUTOR_LABEL]) if labels.get(EXECUTOR_LABEL) else None
        box = Box(attrs["Id"], labels[IMAGE_LABEL], json.loads(labels.get(MOUNTS_LABEL, "{}")),
                  config["NetworkMode"] != "none", (config["Memory"], config["PidsLimit"]), None, control,
                  ExecutorFiles.token(control) if control is not None else b"", labels.get(NO_EXECUTOR_LABEL, ""))
        if known is not None and known.id == attrs["Id"]:
            box.host = known.host
            if known.link is not None and known.link.usable():
                box.link = known.link
            else:
                known.forget_link()
        elif config.get("Runtime", "runc") == "runc":  # gVisor's processes are not the host's
            box.host = HostView.find(attrs["Id"], attrs["State"]["Pid"], box.residents)
        return box

    def _update(self, box: Box, limits: tuple[int, int]) -> None:
        """Give the container the run's memory and process limits (the SDK's update lacks ``PidsLimit``)."""
        api = self.client().api
        memory, pids = limits
        with map_docker_errors("setting the run's limits"):
            response = api._post_json(api._url("/containers/{0}/update", box.id),
                                      data={"Memory": memory, "MemorySwap": memory, "PidsLimit": pids})
            api._raise_for_status(response)
        box.limits = limits

    def make_warm(self, reserved: Workspace, image: str, mounts: dict[str, int], run_limits: tuple[int, int]) -> Box:
        """A container for the reserved folder of a workspace not named yet (``container_pool``); labelled as
        warm, with the folder's user id, so any worker's idle reaper can tell it and give the folder back."""
        with self.turn(reserved.path.name):
            return self._create(reserved, image, mounts, False, run_limits,
                                extra={WARM_LABEL: str(reserved.uid if reserved.uid is not None else "")})

    def _create(self, workspace: Workspace, image: str, mounts: dict[str, int], network: bool,
                run_limits: tuple[int, int], *, extra: dict[str, str] | None = None) -> Box:
        name = self.name(workspace.path.name, image)
        volumes = {str(workspace.path): {"bind": str(workspace.path), "mode": "rw"}}
        volumes.update({folder: {"bind": folder, "mode": "ro"} for folder in mounts})
        labels = dict(label.split("=", 1) for label in self._labels(workspace.path.name, image)) | (extra or {})
        spec = Spec(name, {**labels, MOUNTS_LABEL: json.dumps(mounts)}, image, self.user(workspace), volumes, network,
                    run_limits, str(workspace.path))

        with map_docker_errors(f"starting the container of workspace {workspace.id!r}"):
            self.client().images.get(image)  # never pull: a missing image is a build step, not a download
            try:
                container_id, link = self.launcher.start(spec)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:
                    raise
                theirs = self.find((workspace.path.name, image))
                if theirs is not None:
                    return theirs  # made meanwhile by a worker that did not take turns: use it, never remove it
                self._remove_earlier(workspace.path.name, name)
                container_id, link = self.launcher.start(spec)
            box = self._box(self.client().api.inspect_container(container_id), None)
        box.link = link
        with self._lock:
            self._boxes[(workspace.path.name, image)] = box
        self.used(image)
        return box

    @staticmethod
    def user(workspace: Workspace) -> str:
        """A workspace's ``uid:gid`` in its containers: its own ids (a root worker), else the worker's."""
        if workspace.uid is not None:
            return f"{workspace.uid}:{workspace.gid}"
        return f"{os.getuid()}:{os.getgid()}"

    def _remove_earlier(self, folder: str, name: str) -> None:
        """Remove the container holding ``name`` that the labels did not find, when it is this workspace's on this
        work root (one an earlier version of the runtime made, without the image's label; no run of the
        workspace is in it: the turn is held); raise the conflict for anyone else's."""
        labels = self.client().api.inspect_container(name)["Config"]["Labels"]
        if labels.get(LABEL) != folder or labels.get(ROOT_LABEL) != str(self.work_root):
            raise RuntimeUnavailableError(f"the container name {name!r} is taken by a container that is not this "
                                          "workspace's; remove it")
        self.client().api.remove_container(name, force=True)

    def name(self, folder: str, image: str) -> str:
        """The container's name: the work root's prefix, the workspace and a hash of the image."""
        return f"{self.prefix}-{folder}-{hashlib.sha256(image.encode()).hexdigest()[:12]}"

    def remove(self, key: Key) -> None:
        """Remove one container (a new one is made for the workspace's next run of its image). Call it in the
        workspace's turn."""
        with self._lock:
            box = self._boxes.pop(key, None)
        if box is not None:
            box.forget_link()
            with contextlib.suppress(*ENGINE_ERRORS):
                self.client().api.remove_container(box.id, force=True)
            if box.control is not None:
                self.executors.remove_control(box.control)
            self.used(box.image)

    def remove_workspace(self, folder: str) -> None:
        """Remove every container of the workspace (waiting for its turn), and its turn file."""
        with self.turn(folder):
            self._remove_all_of(folder)
            (self.turns / folder).unlink(missing_ok=True)

    def _remove_all_of(self, folder: str) -> None:
        """Remove every container of the workspace on this work root, whichever worker made it (in its turn)."""
        api = self.client().api
        with self._lock:
            for key in [key for key in self._boxes if key[0] == folder]:
                self._boxes.pop(key).forget_link()
        with map_docker_errors(f"removing the containers of workspace {folder!r}"):
            found = api.containers(all=True, filters={"label": [f"{LABEL}={folder}", f"{ROOT_LABEL}={self.work_root}"]})
        for container in found:
            with contextlib.suppress(*ENGINE_ERRORS):
                api.remove_container(container["Id"], force=True)
            labels = container["Labels"]
            if labels.get(EXECUTOR_LABEL):
                self.executors.remove_control(Path(labels[EXECUTOR_LABEL]))
            if IMAGE_LABEL in labels:
                self.used(labels[IMAGE_LABEL])

    def reap_idle(self, keep: Callable[[str], bool]) -> None:
        """Remove the work root's containers whose workspace went unused longer than ``idle_seconds``, but those
        of workspaces ``keep`` names and those whose turn another run holds (looks at most every
        ``REAP_INTERVAL_SECONDS``, or ``idle_seconds`` when shorter)."""
        now = time.monotonic()
        with self._lock:
            if now < self._next_reap:
                return
            self._next_reap = now + min(self.settings.idle_seconds, REAP_INTERVAL_SECONDS)
        with map_docker_errors("looking for idle containers"):
            found = self.client().api.containers(all=True, filters={"label": f"{ROOT_LABEL}={self.work_root}"})
        self.executors.sweep({container["Labels"].get(EXECUTOR_LABEL, "") for container in found})
        self.workspaces.sweep_reserved({c["Labels"].get(LABEL, "") for c in found}, self.settings.idle_seconds)
        for folder in {container["Labels"].get(LABEL, "") for container in found}:
            if not folder or keep(folder):
                continue
            warm = next((c for c in found if c["Labels"].get(LABEL) == folder and WARM_LABEL in c["Labels"]), None)
            if warm is not None and not (self.work_root / folder / METADATA_FILE).exists():
                self._reap_warm(folder, warm)  # made for a workspace that never came
            elif self._idle(folder):
                with self.turn(folder, wait=False) as held:
                    if held and self._idle(folder):
                        self._remove_all_of(folder)

    def _reap_warm(self, folder: str, container: dict) -> None:
        """Remove a warm container no workspace took, older than the idle time (its pool, which renews what it
        holds sooner, is gone), and give its reserved folder back."""
        if time.time() - container["Created"] <= self.settings.idle_seconds:
            return
        with self.turn(folder, wait=False) as held:
            if held and not (self.work_root / folder / METADATA_FILE).exists():
                self._remove_all_of(folder)
                uid = container["Labels"][WARM_LABEL]
                self.workspaces.release(Workspace(id="", path=self.work_root / folder, uid=int(uid) if uid else None,
                                                  gid=int(uid) if uid else None))
                (self.turns / folder).unlink(missing_ok=True)

    def _idle(self, folder: str) -> bool:
        try:
            last = os.stat(self.turns / folder).st_mtime
        except FileNotFoundError:
            return True  # never used on this host since it was made (a worker that crashed)
        return time.time() - last > self.settings.idle_seconds

    def container_id(self, folder: str, image: str) -> str | None:
        """The id of the workspace's container of ``image`` as this runtime last saw it."""
        with self._lock:
            box = self._boxes.get((folder, image))
        return box.id if box else None

    def remove_all(self) -> None:
        """Remove the containers this runtime used, but those a run (of another worker) is in."""
        with self._lock:
            workspaces = {key[0] for key in self._boxes}
        for folder in workspaces:
            with self.turn(folder, wait=False) as held:
                if held:
                    self._remove_all_of(folder)


def _still_there(mounts: dict[str, int]) -> dict[str, int]:
    """The mounted folders that are still the same folder at their path (not removed, not replaced)."""
    kept = {}
    for folder, inode in mounts.items():
        with contextlib.suppress(OSError):
            if os.stat(folder).st_ino == inode:
                kept[folder] = inode
    return kept
