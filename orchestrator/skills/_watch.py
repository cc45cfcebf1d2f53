"""``FolderWatch``: has anything changed in these folders? One non-blocking read, whatever their number.

A cached repository must notice an edited, added or removed skill on its next call, but checking the modification
time of every folder and ``SKILL.md`` costs two system calls per skill — tens of milliseconds per call for 2,000
skills. On Linux, inotify reports changes to the watched folders (and to the files directly in them) as they happen,
so asking costs one ``read``. Where inotify cannot be had (another system, the system's watch limit reached, or
``MAX_WATCHES`` of this process's repositories already watching: inotify instances are few, 128 per user by
default, and shared by every process of that user) ``start`` returns ``None`` and the caller falls back to
modification times.
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
import weakref
from collections.abc import Iterable

IN_MODIFY = 0x002
IN_ATTRIB = 0x004
IN_CLOSE_WRITE = 0x008
IN_MOVED_FROM = 0x040
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_DELETE = 0x200
IN_DELETE_SELF = 0x400
IN_MOVE_SELF = 0x800
MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
        | IN_DELETE_SELF | IN_MOVE_SELF)
READ_SIZE = 64 * 1024
MAX_WATCHES = 16  # inotify instances one process holds at most

_open = threading.BoundedSemaphore(MAX_WATCHES)

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class FolderWatch:
    """An inotify instance watching some folders; build it with ``start``."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._changed = False
        self._lock = threading.Lock()  # never read after close: the fd number may belong to another file by then
        self._closer = weakref.finalize(self, _release, fd)

    @classmethod
    def start(cls, folders: Iterable[str]) -> FolderWatch | None:
        """Watch ``folders``; ``None`` when inotify is unavailable or a folder cannot be watched."""
        if _libc is None or not hasattr(_libc, "inotify_init1") or not _open.acquire(blocking=False):
            return None
        fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            _open.release()
            return None
        watch = cls(fd)
        for folder in folders:
            if _libc.inotify_add_watch(fd, os.fsencode(folder), MASK) < 0:
                watch.close()
                return None
        return watch

    def changed(self) -> bool:
        """Whether anything changed since the watch started (stays true once it did)."""
        with self._lock:
            if self._changed:
                return True
            try:
                self._changed = bool(os.read(self._fd, READ_SIZE))
            except BlockingIOError:
                return False
            except OSError as exc:  # a broken watch can no longer vouch for anything
                self._changed = exc.errno != errno.EAGAIN
            return self._changed

    def close(self) -> None:
        with self._lock:
            self._changed = True
            self._closer()


def _release(fd: int) -> None:
    os.close(fd)
    _open.release()
