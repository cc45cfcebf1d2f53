"""What the host sees of a workspace's container, and how a run is ended through it.

A run ends with every process it started gone and the container's scratch file systems (``/tmp``, ``/dev/shm``,
``/dev/mqueue``) empty, whatever it did to detach (``setsid``, ``nohup``, double forks, a cleared environment):
runs of one workspace take turns in its container, so everything in the container but its residents — the init
and the keep-alive, which run as ``RESIDENT_UID``, an id no run has — belongs to the run that just ended.

Where the worker shares the host's PID namespace and can read the container's control group (a worker on the
host, as root), this costs no ``docker exec``: the processes are read from the group's ``cgroup.procs`` and
killed through pidfds (a process id reused in the meantime is never signalled), and the scratch folders are
emptied through ``/proc/<init>/root`` without following any link in them. Elsewhere (a worker in a container
of its own) one ``docker exec`` as the run's user does both (``kill -9 -1`` spares the residents, another user).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

from worker.cgroups import group_procs, oom_kill_count

RESIDENT_UID = 65533
"""The user of the container's init and keep-alive: not a workspace's (30000–59999), so no run can signal them,
and a run's processes are told from them by it."""
SCRATCH_DIRS = ("tmp", "dev/shm", "dev/mqueue")
SCRATCH_ENTRIES = 10_000
SCRATCH_DEPTH = 64
KILL_ROUNDS = 200
ROUND_PAUSE_SECONDS = 0.005
CLEAN_INSIDE = (
    "kill -9 -1 2>/dev/null; for d in /tmp /dev/shm /dev/mqueue; do find \"$d\" -mindepth 1 -maxdepth 1 "
    "-user \"$(id -u)\" -exec rm -rf --one-file-system -- {} + 2>/dev/null; done; true"
)
"""The same clean-up from inside, as the run's user (who owns everything a run could leave there; the folders
the engine made on the way to a bind mount under ``/tmp`` are root's and stay)."""


@dataclass(frozen=True)
class HostView:
    """A running container as the host sees it: its init's process id and its control group's files."""

    init_pid: int
    group: str
    procs: str
    oom_events: str | None

    @classmethod
    def find(cls, container_id: str, init_pid: int) -> "HostView | None":
        """The view, or ``None`` when this process cannot see the container's processes and group (it runs in
        another PID namespace, or is not root)."""
        try:
            with open(f"/proc/{init_pid}/cgroup") as f:
                lines = [line.rstrip("\n").split(":", 2) for line in f]
        except OSError:
            return None
        groups = {controllers: path for _, controllers, path in lines}
        if container_id not in "".join(groups.values()):
            return None  # another process has that id here: not the host's PID namespace
        pids = next((p for c, p in groups.items() if "pids" in c.split(",")), None)
        memory = next((p for c, p in groups.items() if "memory" in c.split(",")), None)
        if pids is not None:  # cgroup v1
            group, procs = pids, f"/sys/fs/cgroup/pids{pids}/cgroup.procs"
            oom = f"/sys/fs/cgroup/memory{memory}/memory.oom_control" if memory else None
        elif "" in groups:  # cgroup v2
            group, procs = groups[""], f"/sys/fs/cgroup{groups['']}/cgroup.procs"
            oom = f"/sys/fs/cgroup{groups['']}/memory.events"
        else:
            return None
        view = cls(init_pid, group, procs, oom)
        return view if init_pid in view.pids() else None

    def pids(self) -> list[int]:
        return group_procs(self.procs)

    def oom_kills(self) -> int | None:
        """How many processes the kernel killed in the container for going past its memory limit."""
        return oom_kill_count(self.oom_events) if self.oom_events is not None else None

    def end_run(self) -> bool:
        """Kill every process in the container but the residents, then empty its scratch folders; ``False``
        when processes keep appearing or the leftovers are too many or too deep (the caller then removes the
        container: a new one is cheaper than a long clean-up)."""
        if not self._kill_all():
            return False
        try:
            for folder in SCRATCH_DIRS:
                self._empty(folder)
        except OSError:
            return False
        return True

    def _kill_all(self) -> bool:
        for _ in range(KILL_ROUNDS):
            left = [pid for pid in self.pids() if pid != self.init_pid and _kill_if_not_resident(pid, self.group)]
            if not left:
                return True
            time.sleep(ROUND_PAUSE_SECONDS)  # killed processes leave the group once they have exited
        return False

    def _empty(self, folder: str) -> None:
        """Remove what runs left in a scratch folder: every entry not root's (root's are the folders the engine
        made on the way to a bind mount under ``/tmp``, which a run can neither write nor rename)."""
        fd = os.open(f"/proc/{self.init_pid}/root/{folder}", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        budget = [SCRATCH_ENTRIES]
        try:
            for entry in os.scandir(fd):
                if entry.stat(follow_symlinks=False).st_uid != 0:
                    _remove(fd, entry.name, entry.is_dir(follow_symlinks=False), budget, 0)
        finally:
            os.close(fd)


def _remove(dir_fd: int, name: str, is_dir: bool, budget: list[int], depth: int) -> None:
    """Remove ``name`` (a whole tree, never following a link); raises ``OSError`` past the budget or depth."""
    budget[0] -= 1
    if budget[0] < 0 or depth > SCRATCH_DEPTH:
        raise OSError(f"more than {SCRATCH_ENTRIES} entries or {SCRATCH_DEPTH} levels to remove")
    if not is_dir:
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        for entry in os.scandir(fd):
            _remove(fd, entry.name, entry.is_dir(follow_symlinks=False), budget, depth + 1)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _kill_if_not_resident(pid: int, group: str) -> bool:
    """SIGKILL ``pid`` unless it is a resident; ``True`` if it was (or may still be) a run's process. The pidfd
    is taken before the checks, so a process id reused meanwhile by a process outside the group is left alone."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False  # gone
    try:
        with open(f"/proc/{pid}/status") as f:
            uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        with open(f"/proc/{pid}/cgroup") as f:
            if uid == RESIDENT_UID or f":{group}\n" not in f.read():
                return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except (OSError, StopIteration, ValueError):
        return False
    finally:
        os.close(pidfd)

