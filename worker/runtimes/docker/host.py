"""How a run in a workspace's container is ended (through the engine), and what the host may read of it.

A run ends with every process it started gone and the container's scratch file systems (``/tmp``, ``/dev/shm``,
``/dev/mqueue``) empty, whatever it did to detach (``setsid``, ``nohup``, double forks, a cleared environment):
runs of one workspace take turns in its container, across workers too (``container_boxes``), so every process of
the run's user belongs to the run that just ended, and the residents — the executor, or the init and the
keep-alive, which run as ``RESIDENT_UID``, an id no run has — are another user's. In a container with an executor
(``container_executor``), the executor ends the run itself; otherwise, or when the executor's end left
something, the end is one ``docker exec`` of ``CLEAN_INSIDE`` as the run's user: the kill happens in the
container's own PID namespace through the engine, never by a host process id, so it is the same whether the worker
runs on the host or in a container of its own (the executor, the namespace's init and another user, is out of the
kill's reach).

Where the worker shares the host's PID namespace and can read the container's control group (a worker on the
host, as root), ``HostView`` reads — and never signals or changes anything — the group's OOM-kill count, so a
run is told when the kernel killed one of its processes for memory, and whether an ended run left anything: when
only the residents are in the group and the scratch folders hold nothing but root's, there is nothing to kill or
empty and the ``docker exec`` (most of a short run's cost) is not needed. A run cannot add to the container after
that look: its processes are gone, and no other run of the workspace is in it (turns).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from worker.sandbox.cgroups.groups import group_procs, oom_kill_count
from worker.runtimes.docker.executor_inside import READY_LOADER

RESIDENT_UID = 65533
"""The user of the container's residents — its executor, or the init and keep-alive of a container without one: not
a workspace's (30000–59999), so no run can signal them, and a run's processes are told from them by it."""
RESIDENT_PROCESSES = 2
"""The init and keep-alive of a container without an executor, counted in its process limit besides the run's."""
EXECUTOR_RESIDENTS = 1
"""The one process of a container with an executor (``container_executor``): the executor, its init."""
SCRATCH_DIRS = ("tmp", "dev/shm", "dev/mqueue")
READY_SHELL_COMMAND = b"\0".join([b"/bin/bash", b"-c", READY_LOADER.encode()]) + b"\0"
KILL_ROUNDS = 3
CLEANED = "skillrun-cleaned"
CLEAN_INSIDE = (
    f"for _ in {' '.join(['x'] * KILL_ROUNDS)}; do kill -9 -1 2>/dev/null || break; done; ipcrm --all 2>/dev/null; "
    "u=$(id -u); for d in /tmp /dev/shm /dev/mqueue; do "
    "find \"$d\" -mindepth 1 -maxdepth 1 -user \"$u\" -type d -exec chmod -R u+rwx {} + 2>/dev/null; "
    "find \"$d\" -mindepth 1 -maxdepth 1 -user \"$u\" -exec rm -rf --one-file-system -- {} + 2>/dev/null; done; "
    f"[ -z \"$(find /tmp /dev/shm /dev/mqueue -xdev -mindepth 1 -user \"$u\" -print -quit 2>/dev/null)\" ] "
    f"&& echo {CLEANED}"
)
"""The end of a run, as the run's user: ``kill -9 -1`` signals every process of that user but the caller (the
kernel aborts a fork whose parent a kill reaches, so none slips through; later rounds are belts and braces), the
System V IPC objects it made go (``ipcrm``), then the scratch folders lose what that user left there, made
removable first (``chmod -R`` changes a folder before it reads it: a folder of mode 000; it follows no link). It
prints
``CLEANED`` only when nothing of that user is left there; the folders the engine made on the way to a bind mount
under ``/tmp`` are root's and stay."""


@dataclass(frozen=True)
class HostView:
    """A running container's control group as the host sees it (read only)."""

    init_pid: int
    procs: str
    oom_events: str | None
    residents: int

    @classmethod
    def find(cls, container_id: str, init_pid: int, residents: int) -> "HostView | None":
        """The view of a container whose own processes are ``residents``, or ``None`` when this process cannot see
        the container's processes and group (it runs in another PID namespace, or is not root)."""
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
            procs = f"/sys/fs/cgroup/pids{pids}/cgroup.procs"
            oom = f"/sys/fs/cgroup/memory{memory}/memory.oom_control" if memory else None
        elif "" in groups:  # cgroup v2
            procs, oom = f"/sys/fs/cgroup{groups['']}/cgroup.procs", f"/sys/fs/cgroup{groups['']}/memory.events"
        else:
            return None
        view = cls(init_pid, procs, oom, residents)
        return view if init_pid in group_procs(view.procs) else None

    def left_nothing(self, *, ready_shell: bool = False) -> bool:
        """Whether the container holds nothing of an ended run: no process but the residents (and the ready shell
        its executor says it starts for the next run: a child of the executor, running the loader or not yet),
        and nothing but root's at the top of its scratch folders (the folders the engine made on the way to a bind
        mount). (System V IPC objects are the container's IPC namespace's, which the host does not see: the
        executor removes them, and the end through the engine.)"""
        procs = group_procs(self.procs)
        if len(procs) > self.residents + ready_shell:
            return False
        if len(procs) > self.residents and not self._is_ready_shell([p for p in procs if p != self.init_pid]):
            return False
        try:
            for folder in SCRATCH_DIRS:
                fd = os.open(f"/proc/{self.init_pid}/root/{folder}",
                             os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    if any(entry.stat(follow_symlinks=False).st_uid != 0 for entry in os.scandir(fd)):
                        return False
                finally:
                    os.close(fd)
        except OSError:
            return False
        return True

    def _is_ready_shell(self, others: list[int]) -> bool:
        """Whether ``others`` is one child of the executor running the ready shell's loader (or, a moment after the
        fork, still the executor's program, or in between: during ``execve`` the kernel shows no command line)."""
        if len(others) != 1:
            return False
        try:
            with open(f"/proc/{others[0]}/stat", "rb") as f:
                parent = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{others[0]}/cmdline", "rb") as f:
                command = f.read()
            with open(f"/proc/{self.init_pid}/cmdline", "rb") as f:
                executor = f.read()
        except (OSError, ValueError, IndexError):
            return False
        return parent == self.init_pid and command in (READY_SHELL_COMMAND, executor, b"")

    def oom_kills(self) -> int | None:
        """How many processes the kernel killed in the container for going past its memory limit."""
        return oom_kill_count(self.oom_events) if self.oom_events is not None else None

