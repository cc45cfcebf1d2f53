"""Where run control groups go: this process's own groups, the ``skillrun`` folder in each hierarchy (v1
hierarchies mounted again, writable, in a container), and sweeping the folders dead processes left there.
``worker.sandbox.cgroups.groups`` makes and uses the groups."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from pathlib import Path

CGROUP_MOUNT = Path("/sys/fs/cgroup")
GROUP_FOLDER = "skillrun"
V1_MOUNTS = Path("/run/skillrun/cgroup")
OWNERS = Path("/run/skillrun/cgroup-owners")
"""One lock file per live tree (``CgroupTree``): a tree's folder whose lock nobody holds was left by a dead process."""


def sweep_abandoned(parent: Path) -> None:
    """Remove the folders (and their empty run groups) of trees whose process is gone: their lock file is missing
    or nobody holds it. A group something still runs in stays."""
    try:
        folders = [entry for entry in parent.iterdir() if entry.is_dir()]
    except FileNotFoundError:
        return
    for folder in folders:
        try:
            lock = os.open(OWNERS / folder.name, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            lock = -1
        try:
            if lock >= 0:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock)
            continue  # its process lives
        with contextlib.suppress(OSError):  # another process may be sweeping (or removing) it at the same time
            for group in [entry for entry in folder.iterdir() if entry.is_dir()]:
                with contextlib.suppress(OSError):
                    group.rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()
        if lock >= 0:
            (OWNERS / folder.name).unlink(missing_ok=True)
            os.close(lock)


def v1_parent(controllers: str, own: str) -> "Path | str":
    """The ``skillrun`` folder under this process's group of one v1 hierarchy, made if need be; or why not.

    In a container the hierarchy is mounted read-only with the container's own group at its top (while
    ``/proc/self/cgroup`` names the group by its path on the host): there a worker running as root mounts the
    hierarchy again, writable, under ``V1_MOUNTS``, and makes its groups under its own group, inside the container's
    limits."""
    mount = CGROUP_MOUNT / controllers.split(",")[0]
    try:
        parent = mount / own.lstrip("/") / GROUP_FOLDER
        parent.mkdir(exist_ok=True)
        return parent
    except OSError as exc:
        problem = f"cannot make control groups under {mount / own.lstrip('/')}: {exc.strerror}"
    if os.geteuid() != 0:
        return problem
    again = V1_MOUNTS / controllers.replace(",", "+")
    try:
        if not (again / "cgroup.procs").exists():
            again.mkdir(parents=True, exist_ok=True)
            done = subprocess.run(["mount", "-t", "cgroup", "-o", controllers, "cgroup", str(again)],
                                  capture_output=True, text=True, timeout=30)
            if done.returncode != 0:
                return f"{problem}; mounting the hierarchy again failed: {done.stderr.strip()}"
        parent = again / own.lstrip("/") / GROUP_FOLDER
        parent.mkdir(exist_ok=True)
        return parent
    except OSError as exc:
        return f"{problem}; and under {again}: {exc.strerror}"


def own_groups() -> dict[str, str]:
    """This process's groups, by controller list ("" for the v2 hierarchy)."""
    groups: dict[str, str] = {}
    with open("/proc/self/cgroup") as lines:
        for line in lines:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            groups[controllers] = path
    return groups


__all__ = ["CGROUP_MOUNT", "GROUP_FOLDER", "OWNERS", "V1_MOUNTS", "own_groups", "sweep_abandoned", "v1_parent"]
