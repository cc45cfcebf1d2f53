"""The executor's hold on its container (``executor_inside``): what it does as root before it becomes the
workspace's user, and what ends a run's traces. Standard library only, like the executor, and mounted beside it.
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

LIBC = ctypes.CDLL(None, use_errno=True)
PR_CAPBSET_DROP = 24
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


def clean_up(uid: int, scrub: str) -> bool:
    """Empty the scratch folders of what ``uid`` left (``scrub``, a shell script the worker gives, does it when
    there is anything: coreutils handle folders of any depth and mode) and remove the System V IPC objects of the
    container (all the runs': nothing else makes one); whether nothing is left."""
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
