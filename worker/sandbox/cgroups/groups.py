"""Per-run control groups: memory, process-count and CPU limits that hold for a run's processes together.

``ulimit`` limits hold per process: three processes may each use the whole memory limit. A control group holds
the run's sandbox (its init and everything it starts), so its limits hold for the run as a whole. Both cgroup
versions are handled:

* **v1** (separate ``memory``, ``pids`` and ``cpu`` hierarchies): run groups are made under this process's own
  group in each hierarchy, in a folder ``skillrun`` (in a container, in the hierarchy mounted again; see
  ``worker.sandbox.cgroups.hierarchies.v1_parent``).
* **v2** (one unified hierarchy): run groups are made in a folder ``skillrun`` under this process's own group,
  with the three controllers enabled for it. A v2 group that holds processes cannot hand controllers down (the
  "no internal processes" rule), so where this process does not sit in the root group or a group it may
  delegate from, v2 limits are not available and ``CgroupTree.detect`` says why.

A run group is made ahead (off the run's path), its limits are written when the run starts (only those that
changed), and once the run's processes are gone it is kept for its workspace's next run (``worker.sandbox.cgroups.pool``)
or removed. Each runtime's groups live in a folder of its own (``skillrun/<token>/run-<token>``), removed when
the runtime closes; the folders a killed worker left are swept by the next one to start on the host.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from worker.sandbox.cgroups.hierarchies import CGROUP_MOUNT, GROUP_FOLDER, OWNERS, own_groups, sweep_abandoned, v1_parent
from worker.errors import CgroupError

V2_CONTROLS = "+cpu +memory +pids"
V1_CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_MICROSECONDS = 100_000
EMPTY_ATTEMPTS = 20
EMPTY_PAUSE_SECONDS = 0.05


@dataclass(frozen=True)
class CgroupLimits:
    """What a run group holds its processes to. ``cpus`` is a share of CPU time (1.0 = one core)."""

    memory_bytes: int
    processes: int
    cpus: float | None


class CgroupTree:
    """Where this process makes run groups; ``detect`` finds it or says why there is none."""

    def __init__(self, version: int, parents: dict[str, Path]) -> None:
        self.version = version
        self.parents = parents  # controller (v1) or "unified" (v2) → this tree's own folder in it
        self._lock_fd = -1

    def _claim(self) -> "CgroupTree":
        """Make this tree a folder of its own under each ``skillrun`` folder, named by a random token and held by
        a lock file (``OWNERS``) for as long as this process lives; first, sweep the folders of processes that
        died without removing theirs."""
        OWNERS.mkdir(mode=0o700, parents=True, exist_ok=True)
        for parent in self.parents.values():
            sweep_abandoned(parent)
        token = secrets.token_hex(8)
        self._lock_fd = os.open(OWNERS / token, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self.parents = {key: parent / token for key, parent in self.parents.items()}
        for parent in self.parents.values():
            parent.mkdir()
            if self.version == 2:
                _write(parent / "cgroup.subtree_control", V2_CONTROLS)
        return self

    def close(self) -> None:
        """Remove this tree's folders (its run groups are gone first) and let go of its lock."""
        for parent in self.parents.values():
            with contextlib.suppress(OSError):
                parent.rmdir()
        if self._lock_fd >= 0:
            (OWNERS / next(iter(self.parents.values())).name).unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = -1

    @classmethod
    def detect(cls) -> "CgroupTree | str":
        """The tree, or a sentence saying why run groups cannot be made here."""
        if os.geteuid() != 0:
            return "control groups need the worker to run as root"
        try:
            own = own_groups()
        except OSError as exc:
            return f"cannot read /proc/self/cgroup: {exc.strerror}"
        if (CGROUP_MOUNT / "cgroup.controllers").exists():
            return cls._detect_v2(CGROUP_MOUNT, own.get("", "/"))
        parents: dict[str, Path] = {}
        for controller in V1_CONTROLLERS:
            names, path = next(((n, p) for n, p in own.items() if controller in n.split(",")), (None, None))
            if names is None:
                return f"this process is in no cgroup v1 group of the {controller} controller"
            parent = v1_parent(names, path)
            if isinstance(parent, str):
                return parent
            parents[controller] = parent
        return cls(1, parents)._claim()

    @classmethod
    def _detect_v2(cls, mount: Path, own: str) -> "CgroupTree | str":
        base = mount / own.lstrip("/")
        parent = base / GROUP_FOLDER
        try:
            if not set(V1_CONTROLLERS) <= set((base / "cgroup.controllers").read_text().split()):
                return f"the cgroup v2 group {base} lacks one of the memory, pids and cpu controllers"
            _write(base / "cgroup.subtree_control", V2_CONTROLS)
            parent.mkdir(exist_ok=True)
            _write(parent / "cgroup.subtree_control", V2_CONTROLS)
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return (f"the cgroup v2 group {base} holds processes, so it cannot delegate controllers; run the "
                        "worker in a group of its own (systemd: Delegate=yes) to get per-run limits")
            return f"cannot make control groups under {base}: {exc.strerror}"
        return cls(2, {"unified": parent})._claim()

    def new_group(self) -> "RunCgroup":
        """Make an empty run group (no limits yet)."""
        name = f"run-{secrets.token_hex(8)}"  # tells a run (its cgroup namespace shows it) nothing of the worker
        paths = {key: parent / name for key, parent in self.parents.items()}
        made: list[Path] = []
        try:
            for path in paths.values():
                path.mkdir()
                made.append(path)
        except OSError as exc:
            for path in made:
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise CgroupError(f"cannot make control group {name}: {exc.strerror}") from exc
        return RunCgroup(self.version, paths)


class RunCgroup:
    """One run's group: add its processes, set its limits, ask whether it ran out of memory, remove it."""

    def __init__(self, version: int, paths: dict[str, Path]) -> None:
        self.version = version
        self.paths = paths
        self.limits: CgroupLimits | None = None
        self._oom_base = 0
        self._oom_event = self._watch_oom() if version == 1 else None
        self._count = -1
        self._listing = -1

    def _watch_oom(self) -> int | None:
        """An eventfd the kernel signals when the group runs out of memory (v1), so a run that did not costs no
        read of the group's counters once it ended (they are slow to read while its processes are torn down)."""
        event = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        control = os.open(self.paths["memory"] / "memory.oom_control", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _write(self.paths["memory"] / "cgroup.event_control", f"{event} {control}")
            return event
        except OSError:
            os.close(event)
            return None
        finally:
            os.close(control)

    def begin(self) -> None:
        """A new run starts in the group: its out-of-memory kills are counted from here."""
        self._ran_out()
        self._oom_base = self._oom_total()

    def _ran_out(self) -> bool:
        """Whether the kernel signalled an out-of-memory condition since last asked (``True`` when it cannot tell)."""
        if self._oom_event is None:
            return True
        try:
            return os.eventfd_read(self._oom_event) > 0
        except BlockingIOError:
            return False

    def add(self, pid: int) -> None:
        """Move process ``pid`` into the group (its later children are born in it); ``ProcessLookupError`` if it is
        gone."""
        try:
            for path in self.paths.values():
                _write(path / "cgroup.procs", str(pid))
        except ProcessLookupError:
            raise
        except OSError as exc:
            raise CgroupError(f"cannot move process {pid} into its run's control group: {exc.strerror}") from exc

    def set_limits(self, limits: CgroupLimits) -> None:
        """Hold the group to ``limits`` (only what differs from the limits it has is written)."""
        old, self.limits = self.limits, None
        try:
            if old is None or old.memory_bytes != limits.memory_bytes:
                self._set_memory(limits.memory_bytes, None if old is None else old.memory_bytes)
            if old is None or old.processes != limits.processes:
                self._set(("pids", "pids.max"), str(limits.processes))
            if old is None or old.cpus != limits.cpus:
                self._set_cpus(limits.cpus)
        except OSError as exc:
            raise CgroupError(f"cannot set the run's control group limits: {exc.strerror}") from exc
        self.limits = limits

    def _set_memory(self, memory: int, old: int | None) -> None:
        if self.version == 2:
            self._set(("unified", "memory.max"), str(memory))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to hold
                self._set(("unified", "memory.swap.max"), "0")
            return
        # v1: memory+swap may never be below memory, so the order depends on the direction of the change.
        swap = self.paths["memory"] / "memory.memsw.limit_in_bytes"
        steps = [("memory.limit_in_bytes", memory)] + ([("memory.memsw.limit_in_bytes", memory)] if swap.exists() else [])
        if old is not None and memory > old:
            steps.reverse()
        for name, value in steps:
            _write(self.paths["memory"] / name, str(value))

    def _set_cpus(self, cpus: float | None) -> None:
        quota = -1 if cpus is None else max(int(cpus * CPU_PERIOD_MICROSECONDS), 1000)
        if self.version == 2:
            self._set(("unified", "cpu.max"), f"{'max' if quota < 0 else quota} {CPU_PERIOD_MICROSECONDS}")
            return
        _write(self.paths["cpu"] / "cpu.cfs_period_us", str(CPU_PERIOD_MICROSECONDS))
        _write(self.paths["cpu"] / "cpu.cfs_quota_us", str(quota))

    def _set(self, where: tuple[str, str], value: str) -> None:
        key, name = where
        _write(self.paths["unified" if self.version == 2 else key] / name, value)

    def oom_kills(self) -> int:
        """How many processes of the group's current run the kernel killed for going past its memory limit."""
        if not self._ran_out():
            return 0
        total = self._oom_total()
        kills, self._oom_base = total - self._oom_base, total
        return kills

    def _oom_total(self) -> int:
        events = self.paths["unified"] / "memory.events" if self.version == 2 else self.paths["memory"] / "memory.oom_control"
        return oom_kill_count(events) or 0

    def procs(self) -> list[int]:
        """The processes in the group now."""
        return group_procs(next(iter(self.paths.values())) / "cgroup.procs")

    def tasks(self) -> int:
        """How many tasks the group holds, those ended but not yet reaped or released too (``pids.current``: a
        counter, read in a microsecond); -1 if it cannot be read."""
        try:
            if self._count < 0:
                self._count = os.open(self.paths["unified" if self.version == 2 else "pids"] / "pids.current",
                                      os.O_RDONLY | os.O_CLOEXEC)
            return int(os.pread(self._count, 32, 0))
        except (OSError, ValueError):
            return -1

    def empty(self) -> bool:
        """Whether the group holds no live process. The task count is read first; it also counts processes that
        have exited but are not reaped yet (a sandbox's init, a moment after its monitor: ``worker.sandbox.orphans.reap_adopted``)
        or not released yet (an RCU grace period after the reap), so where it is not 0 the group's process list says
        (it lists no process that has exited; kept open and read anew from its start, as fast as the counter)."""
        if self.tasks() == 0:
            return True
        try:
            if self._listing < 0:
                self._listing = os.open(self.paths["unified" if self.version == 2 else "pids"] / "cgroup.procs",
                                        os.O_RDONLY | os.O_CLOEXEC)
            return not os.pread(self._listing, 64, 0).strip()
        except OSError:
            return False

    def wait_empty(self) -> bool:
        """Wait a little for the group's processes to be gone (a killed sandbox takes a moment); ``False`` if some
        remain."""
        for _ in range(EMPTY_ATTEMPTS):
            if not self.procs():
                return True
            time.sleep(EMPTY_PAUSE_SECONDS)
        return False

    def remove(self) -> bool:
        """Remove the group once its processes are gone; ``False`` if some remain."""
        self.wait_empty()
        if self._oom_event is not None:
            os.close(self._oom_event)
            self._oom_event = None
        for fd in (self._count, self._listing):
            if fd >= 0:
                os.close(fd)
        self._count = self._listing = -1
        for path in self.paths.values():
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    return False
                raise CgroupError(f"cannot remove control group {path}: {exc.strerror}") from exc
        return True


def group_procs(procs_file: str | os.PathLike[str]) -> list[int]:
    """The processes a group's ``cgroup.procs`` lists (none if it cannot be read)."""
    try:
        with open(procs_file) as f:
            return [int(pid) for pid in f.read().split()]
    except (OSError, ValueError):
        return []


def oom_kill_count(events_file: str | os.PathLike[str]) -> int | None:
    """The ``oom_kill`` count of a group's ``memory.oom_control`` (v1) or ``memory.events`` (v2); ``None`` if it
    cannot be read."""
    try:
        with open(events_file) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return None


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
