"""A workspace's held sandbox: one bubblewrap sandbox per workspace, its spawner inside, its runs forked there.

A sandbox made per run costs its start (bwrap makes six namespaces and a root: ~5 ms on a small VM) and, on
every run's path, its end: bwrap's init and monitor wake, reap, report and exit (~0.7 ms on two cores, more than
the 0.1 ms the rest of a warm run's end costs). A workspace's spawner (``worker.sandbox.spawner``) therefore runs in a
sandbox of the workspace's own, made once (``SandboxSpec.held_argv``: the same user, PID, mount, IPC, UTS and
cgroup namespaces, mounts, seccomp filter and no-new-privileges as a run's own), and each run of the workspace is
a ready shell it forks there: a warm run costs what a run without a sandbox does. What each run keeps:

* **Its processes end with it.** Runs through the held sandbox are held to one at a time (a concurrent run of the
  workspace gets a sandbox of its own, as a first run does). Each run is placed in a control group of its own
  before its command starts (the ready shell waits on its script until the host has moved it: ``ReadyShell.place``)
  and nothing of the run can leave that group; when its command ends, every process in the group is killed, and
  the result waits until the group is empty. No ready shell for the next run is started before that.
* **Nothing of one run is there for the next.** Before it starts the next run's shell (``fresh``), the spawner
  empties ``/tmp`` and ``/dev/shm`` (tmpfs of the held sandbox) and removes every System V IPC object of the
  namespace (POSIX message queues cannot be made: ``worker.sandbox.seccomp``); it refuses to start the shell if any is
  left, and the workspace's held sandbox is then given up for a new one.
* **The run cannot reach the spawner.** The spawner is the namespace's pid 1: the kernel delivers it no signal
  from inside the namespace but those it handles (it handles SIGCHLD alone, by reaping); it is non-dumpable, so
  no process of its user may ``ptrace`` it, read its memory or open its descriptors through ``/proc``. bwrap's
  monitor lives outside the namespace. Its socket to the worker is its own (close-on-exec). What a process of
  the same user may still set on it — resource limits (``prlimit``), niceness, CPU affinity, scheduling policy,
  I/O priority — the next shell would inherit: the worker reads them (``ProcessSettings``) before every shell
  and gives the held sandbox up when a run changed any; the namespace's IPC limits (``kernel.shm*``, ``msg*``,
  ``sem``: the workspace user owns the namespace, so a run may write them) are put back by ``fresh``.
* **The run sees its own skill.** The held sandbox shows the workspace and the folders of one spec (the skill's
  staged library folder and its dependency environment, read-only); a run whose spec differs (another skill)
  runs in a sandbox of its own, and the workspace's held sandbox is made anew for that spec.

Runs with network (their own network namespace behind user-mode networking) keep a sandbox per run. The worker
finds the host pid of each child the spawner reports (it knows it by its pid in the namespace) among the
children of the spawner's process (``host_pid``), to follow it, place it and kill its group.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
from dataclasses import dataclass

from worker.errors import SpawnerError
from worker.sandbox.seccomp import sandbox_filter

HELD_PID = re.compile(rb'"child-pid"\s*:\s*(\d+)\s*[,}]')
"""bwrap's report of the sandbox's pid 1 (the spawner, ``--as-pid-1``) as the host numbers it."""
REPORT_BYTES = 4096

FRESH_SOURCE = r"""
IPC_LIMITS = ["/proc/sys/kernel/" + name for name in ("shmmax", "shmall", "shmmni", "shm_rmid_forced", "msgmax",
              "msgmnb", "msgmni", "sem")]
def read_limits():
    found = {}
    for path in IPC_LIMITS:
        try:
            with open(path) as f:
                found[path] = f.read()
        except OSError:
            pass
    return found
started_limits = read_limits()
def limits_back():
    for path, value in started_limits.items():
        try:
            with open(path) as f:
                if f.read() == value:
                    continue
            with open(path, "w") as f:
                f.write(value)
        except OSError:
            pass
    return read_limits() == started_limits
def empty(path):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.chmod(path, 0o700)
            for name in os.listdir(path):
                empty(os.path.join(path, name))
            os.rmdir(path)
        else:
            os.unlink(path)
    except (OSError, RecursionError):
        pass
def ipc_ids(kind):
    try:
        with open("/proc/sysvipc/" + kind) as table:
            return [int(line.split()[1]) for line in table.read().splitlines()[1:]]
    except (OSError, ValueError, IndexError):
        return []
def clear(top, keep):
    clean = True
    for name in os.listdir(top):
        path = os.path.join(top, name)
        if path in keep:
            continue
        if any(k.startswith(path + "/") for k in keep) and os.path.isdir(path) and not os.path.islink(path):
            clean = clear(path, keep) and clean
        else:
            empty(path)
            clean = clean and not os.path.lexists(path)
    return clean
def fresh():
    with open("/proc/self/mountinfo") as info:
        keep = {line.split()[4] for line in info}
    clean = clear("/tmp", keep) and clear("/dev/shm", keep)
    for ident in ipc_ids("shm"):
        libc.shmctl(ident, 0, None)
    for ident in ipc_ids("msg"):
        libc.msgctl(ident, 0, None)
    for ident in ipc_ids("sem"):
        libc.semctl(ident, 0, 0)
    return clean and not (ipc_ids("shm") or ipc_ids("msg") or ipc_ids("sem")) and limits_back()
"""
"""``fresh()`` in the spawner (as the workspace user, whose every file and IPC object these are; ``0`` is
``IPC_RMID``): whether the held sandbox is as a new one would be. The folders bwrap made in ``/tmp`` on the way to
a folder it shows there (a workspace under ``/tmp``) stay, emptied of all else; the mount points stay whole. The
namespace's IPC limits read at the spawner's start, before any run, are written back where a run changed them."""

IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(platform.machine())
"""``ioprio_get``'s system call number (no Python wrapper; ``None``: the I/O priority is not compared here)."""
IOPRIO_WHO_PROCESS = 1
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class ProcessSettings:
    """What a process of the spawner's user may set on the spawner with no right to its memory, and the spawner's
    next child would inherit: every resource limit, niceness, CPU affinity, scheduling policy and priority, and
    I/O priority (read by root from outside the namespace)."""

    limits: str
    nice: int
    affinity: frozenset[int]
    policy: int
    priority: int
    io_priority: int

    @classmethod
    def of(cls, pid: int) -> "ProcessSettings":
        """``pid``'s settings; ``SpawnerError`` if it is gone."""
        try:
            with open(f"/proc/{pid}/limits") as table:  # prlimit(2) would need CAP_SYS_RESOURCE over its namespace
                limits = table.read()
            io_priority = _libc.syscall(IOPRIO_GET, IOPRIO_WHO_PROCESS, pid) if IOPRIO_GET is not None else 0
            return cls(limits, os.getpriority(os.PRIO_PROCESS, pid), frozenset(os.sched_getaffinity(pid)),
                       os.sched_getscheduler(pid), os.sched_getparam(pid).sched_priority, io_priority)
        except (OSError, ValueError) as exc:
            raise SpawnerError(f"the held sandbox's spawner is gone: {exc}") from exc

    def differences(self, other: "ProcessSettings") -> list[str]:
        """The names of the settings that differ between the two."""
        return [name for name in ("limits", "nice", "affinity", "policy", "priority", "io_priority")
                if getattr(self, name) != getattr(other, name)]



class HeldStart:
    """The host's end of a held sandbox being started: the pipe bwrap reports the spawner's host pid on, and the
    one it reads its seccomp filter from."""

    def __init__(self) -> None:
        self.info_r, self.info_w = os.pipe()
        self.seccomp_r, seccomp_w = os.pipe()
        try:
            os.write(seccomp_w, sandbox_filter())
        finally:
            os.close(seccomp_w)
        self.pid = 0
        self.settings: ProcessSettings | None = None

    def changed_settings(self) -> list[str]:
        """What a run changed of the spawner's settings its next child would inherit (``ProcessSettings``), read
        first before any run is in the sandbox (for its first shell); ``SpawnerError`` if the spawner is gone."""
        settings = ProcessSettings.of(self.pid)
        if self.settings is None:
            self.settings = settings
        return settings.differences(self.settings)

    def child_fds(self) -> tuple[int, int]:
        return self.info_w, self.seccomp_r

    def sent(self) -> None:
        """The sandbox holds its ends now."""
        os.close(self.info_w)
        os.close(self.seccomp_r)
        self.info_w = self.seccomp_r = -1

    def read_pid(self) -> int:
        """Block until bwrap has reported the spawner's host pid (0 if it ended first)."""
        report = b""
        while (match := HELD_PID.search(report)) is None:
            chunk = os.read(self.info_r, REPORT_BYTES)
            if not chunk:
                return 0
            report += chunk
        self.pid = int(match.group(1))
        return self.pid

    def close(self) -> None:
        for name in ("info_r", "info_w", "seccomp_r"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


def host_pid(spawner_pid: int, ns_pid: int) -> int:
    """The host pid of the spawner's child known in its namespace as ``ns_pid``: among the spawner's children (it
    is single-threaded), the one whose innermost pid is that. ``SpawnerError`` if there is none (it has ended)."""
    try:
        with open(f"/proc/{spawner_pid}/task/{spawner_pid}/children") as children:
            candidates = children.read().split()
    except OSError as exc:
        raise SpawnerError(f"the held sandbox's spawner is gone: {exc.strerror}") from exc
    for candidate in candidates:
        try:
            with open(f"/proc/{candidate}/status") as status:
                for line in status:
                    if line.startswith("NSpid:"):
                        if int(line.split()[-1]) == ns_pid:
                            return int(candidate)
                        break
        except (OSError, ValueError):
            continue
    raise SpawnerError(f"the spawner's child {ns_pid} has ended")
