"""The executor's hold on its container (``executor_inside``): what it does as the container's root before it
becomes a user of its own, the identities it takes, and what ends a run's traces. Standard library only, like the
executor, and mounted beside it.

Identities: the executor ends as its own user (not the workspace's) holding only ``CAP_SETUID``, ``CAP_SETGID``
and ``CAP_KILL`` (``become_executor``), with an empty bounding set, so nothing it starts can hold a capability. A
process of the workspace's user may signal, trace or read only processes of that user (on runc and on gVisor
alike, which does not drop signals to a namespace's init nor check dumpability everywhere), so a run cannot reach
the executor. What it does as the workspace's user — its commands, and emptying the scratch folders after them —
runs in children that become that user with no capability at all (``become_user``).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator

LIBC = ctypes.CDLL(None, use_errno=True)
PR_SET_DUMPABLE = 4
PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
CAP_KILL, CAP_SETGID, CAP_SETUID = 5, 6, 7
EXECUTOR_CAPABILITIES = (CAP_KILL, CAP_SETGID, CAP_SETUID)
"""What the executor keeps: to start commands as the workspace's user, and to end every process they leave."""
CAPABILITY_VERSION_3 = 0x20080522
IPC_SCAN_LIMIT = 32768
"""The most System V IPC indexes looked at for objects to remove (a namespace holds at most 32,000 of a kind)."""
SCRATCH = ("/tmp", "/dev/shm", "/dev/mqueue")
SCRUB_SECONDS = 30.0
BELOW_MOUNTS = ("/tmp", "/dev/shm")
"""Scratch folders the engine may make folders in, on the way to a bind mount below them."""


def drop_bounding_set() -> None:
    """Empty the capability bounding set (``CAP_SETPCAP`` allows it), so the run's processes cannot hold one."""
    libc = LIBC
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for capability in range(last + 1):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), f"cannot drop capability {capability} from the bounding set")


class _CapabilityHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapabilityData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def set_capabilities(kept: tuple[int, ...]) -> None:
    """Make ``kept`` this process's effective and permitted capabilities, and nothing inheritable (``capset``)."""
    data = (_CapabilityData * 2)()
    for capability in kept:
        data[capability // 32].effective |= 1 << capability % 32
        data[capability // 32].permitted |= 1 << capability % 32
    if LIBC.capset(ctypes.byref(_CapabilityHeader(CAPABILITY_VERSION_3, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), f"cannot set the capabilities {kept}")


def become_executor(uid: int, gid: int) -> None:
    """From the container's root: become ``uid``:``gid`` for good, keeping ``EXECUTOR_CAPABILITIES`` only, with an
    empty bounding set and not dumpable."""
    drop_bounding_set()
    if LIBC.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "cannot keep capabilities across the change of user")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)  # the permitted set stays (kept), the effective one is empty
    LIBC.prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0)
    set_capabilities(EXECUTOR_CAPABILITIES)
    LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.umask(0o022)


def become_user(uid: int, gid: int) -> None:
    """In a child of the executor: become the workspace's user with no capability left."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    set_capabilities(())


@contextlib.contextmanager
def acting_as(uid: int, gid: int) -> Iterator[None]:
    """Act as ``uid``:``gid`` for what the block makes (the effective ids: files, sockets and pipes are theirs), and
    as before after it. The real and saved ids stay, so no process of ``uid`` may signal or trace this one meanwhile,
    and so does the permitted set (root's effective capabilities come back with its effective id)."""
    euid, egid = os.geteuid(), os.getegid()
    if (euid, egid) == (uid, gid):
        yield
        return
    os.setegid(gid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(euid)
        os.setegid(egid)


def remove_ipc_objects() -> bool:
    """Remove every System V message queue, semaphore set and shared memory segment of the container's IPC
    namespace; whether none is left. Asks the kernel (``*_INFO``, ``*_STAT``), not ``/proc/sysvipc``, which gVisor
    has not; an object's index is tried as its id too (gVisor's ``*_STAT`` answers 0 for the id)."""
    libc = LIBC
    buf = (ctypes.c_long * 64)()
    left = 0
    for name, info, stat_command, count_at in (("shm", 14, 13, 0), ("msg", 12, 11, 0), ("sem", 19, 18, 7)):
        def ctl(ident: int, command: int, arg=buf) -> int:  # noqa: ANN001 - a ctypes buffer or None
            if name == "sem":
                return libc.semctl(ident, 0, command, arg)
            return getattr(libc, f"{name}ctl")(ident, command, arg)

        def count() -> int:
            ints = (ctypes.c_int * 128)()
            return ints[count_at] if ctl(0, info, ints) >= 0 else 0

        if not count():
            continue
        top = max(ctl(0, info), 0)
        for index in range(IPC_SCAN_LIMIT):
            if index > top and index % 256 == 0 and not count():
                break
            ident = ctl(index, stat_command)
            if ident >= 0:
                for candidate in {ident, index}:
                    ctl(candidate, 0, None)  # IPC_RMID
        left += count()
    return left == 0


def kill_all() -> None:
    """SIGKILL every process this one may signal (all but itself: it is the namespace's init), until none is
    left; a fork under way when a kill reaches its parent is aborted by the kernel."""
    for _ in range(100):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            return
        except OSError as exc:
            if exc.errno == errno.ESRCH:
                return
            raise
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass
        time.sleep(0.001)


def close_paths_to_mounts() -> None:
    """Make the root's folders between a scratch folder and a mount point below it (the engine makes them on the way
    to a bind mount under ``/tmp``; gVisor makes them writable by all) 0755, so a run can neither move a mount
    aside and put its own files in its place nor leave files there."""
    with open("/proc/self/mountinfo") as f:
        points = [field.encode().decode("unicode_escape") for field in (line.split()[4] for line in f)]
    for point in points:
        for scratch in BELOW_MOUNTS:
            if not point.startswith(scratch + "/"):
                continue
            path = scratch
            for part in point[len(scratch) + 1 :].split("/")[:-1]:
                path = f"{path}/{part}"
                info = os.lstat(path)
                if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and info.st_mode & 0o022:
                    os.chmod(path, 0o755)


def clean_up(uid: int, gid: int, scrub: str) -> bool:
    """Empty the scratch folders of what ``uid`` left (``scrub``, a shell script the worker gives, does it when
    there is anything: coreutils handle folders of any depth and mode) and remove the System V IPC objects of the
    container (all the runs': nothing else makes one); whether nothing is left. Done as the workspace's user, who
    owns what is to go, in a child of its own holding none of the executor's files (every process of the run is
    gone by then)."""
    try:
        pid = os.fork()
    except OSError:
        return False
    if pid == 0:
        code = 1
        try:
            for name in os.listdir("/proc/self/fd"):
                if int(name) > 2:
                    with contextlib.suppress(OSError):
                        os.close(int(name))
            become_user(uid, gid)
            code = 0 if _clean_up_as_user(uid, scrub) else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def _clean_up_as_user(uid: int, scrub: str) -> bool:
    left = _left_in_scratch(uid)
    if left:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["/bin/bash", "-c", scrub], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, close_fds=True,
                           timeout=SCRUB_SECONDS)
        left = _left_in_scratch(uid)
    return remove_ipc_objects() and not left


def _left_in_scratch(uid: int) -> bool:
    for folder in SCRATCH:
        try:
            with os.scandir(folder) as entries:
                if any(entry.stat(follow_symlinks=False).st_uid == uid for entry in entries):
                    return True
        except OSError:
            continue
    return False
