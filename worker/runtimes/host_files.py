"""A host workspace's files read and written from this process, confined to the workspace and to what its own user
may do — the file tools' fast path (``HostWorkspaceRuntime.workspace_files``), with no run and no process.

It serves only the plain case and declines (``None``, ``False``) everything else, for a run in the workspace to
answer as it always does: a path is walked one folder at a time from the workspace's root, each step opened
relative to the last without following a link, so a link anywhere on the path (even one that stays inside), a
planted one included, is never followed here. A file that is not regular, a folder that is missing, a file with
more than one name, or one (or a folder) the workspace's user does not own is declined too, and so is a write that
the run would be refused for its file-size limit or a disk full for that user; what is made here is given to that
user, as if a command of the workspace had made it, and a write clears the set-id bits as that user's would.
Everything here blocks (call it in a thread).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

WALK_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_MODE = 0o644
"""A new file's mode: what a command with the sandbox's umask (022) makes."""
DISK_MARGIN_BYTES = 1024 * 1024
"""Free room a write leaves, beyond its bytes, for the blocks that hold where they are (a write with less is a run's)."""
CLEARED_ON_WRITE = stat.S_ISUID | stat.S_ISGID
"""Bits a write by the file's user clears (``S_ISGID`` only with group execute), which root's would keep."""
DECLINED = frozenset({errno.ELOOP, errno.ENOTDIR, errno.ENOENT, errno.EACCES, errno.EPERM, errno.EEXIST,
                      errno.EISDIR, errno.ENXIO, errno.EXDEV, errno.EMLINK, errno.ETXTBSY, errno.EAGAIN,
                      errno.ENAMETOOLONG})
"""What a path met here means "not the plain case": a run answers instead."""


class WorkspaceFiles:
    """The files of the workspace folder ``root`` (on this host), owned by ``uid``/``gid`` (``None``: this
    process's user runs its commands, and owns what it makes)."""

    def __init__(self, root: Path, uid: int | None = None, gid: int | None = None) -> None:
        self.root = root
        self.uid = uid
        self.gid = gid

    def read(self, path: str, limit: int) -> bytes | None:
        """The bytes of the regular file at ``path`` (relative to the root, normalised) when it has at most ``limit``
        bytes; ``None`` when this is not the plain case (a run reads it, or says why not)."""
        with self._declining(), self._folder(path) as (folder, name):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
            try:
                info = os.fstat(fd)
                if not self._plain(info) or info.st_size > limit:
                    return None
                chunks, size = [], 0
                while size <= limit and (chunk := os.read(fd, min(limit + 1 - size, 1 << 20))):
                    chunks.append(chunk)
                    size += len(chunk)
                return None if size > limit else b"".join(chunks)
            finally:
                os.close(fd)
        return None

    def write(self, path: str, data: bytes, *, append: bool = False, max_size: int | None = None) -> bool:
        """Write (or append) ``data`` to the file at ``path`` in a folder that exists; whether it was written here
        (``False``: not the plain case, nothing was changed — a run writes it, or says why not). Declined as well:
        a file that would end up over ``max_size`` (the run's ``file_size_bytes``), and ``data`` more than the
        disk has free for anyone but root (this process may be root, and would take root's reserved blocks)."""
        with self._declining(), self._folder(path) as (folder, name):
            disk = os.fstatvfs(folder)
            too_large = max_size is not None and len(data) > max_size
            room = disk.f_bavail * disk.f_frsize - DISK_MARGIN_BYTES
            if not self._owned(os.fstat(folder)) or too_large or len(data) > room:
                return False
            try:
                fd = os.open(name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
                made = False
            except FileNotFoundError:
                fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE,
                             dir_fd=folder)
                made = True
            try:
                info = os.fstat(fd)
                if not made and not (self._plain(info) and self._owned(info)):
                    return False
                if append and max_size is not None and info.st_size + len(data) > max_size:
                    return False
                if made and self.uid is not None:
                    os.fchown(fd, self.uid, self.gid if self.gid is not None else self.uid)
                elif info.st_mode & CLEARED_ON_WRITE:
                    os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~_cleared(info.st_mode))
                if append:
                    os.lseek(fd, 0, os.SEEK_END)
                else:
                    os.ftruncate(fd, 0)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            return True
        return False

    @contextlib.contextmanager
    def _folder(self, path: str) -> Iterator[tuple[int, str]]:
        """The folder holding ``path``'s last part, open (every folder on the way walked without following a link
        and owned by the workspace's user), and that part's name."""
        parts = [part for part in path.split("/") if part not in ("", ".")]
        if not parts or ".." in parts or "\0" in path or not path.isprintable() or _unencodable(path):
            raise OSError(errno.EPERM, "not a plain path inside the workspace")
        fd = os.open(self.root, WALK_FLAGS)
        try:
            for part in parts[:-1]:
                step = os.open(part, WALK_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = step
                if not self._owned(os.fstat(fd)):
                    raise OSError(errno.EACCES, "a folder the workspace's user does not own")
            yield fd, parts[-1]
        finally:
            os.close(fd)

    def _owned(self, info: os.stat_result) -> bool:
        return self.uid is None or (info.st_uid == self.uid and bool(info.st_mode & stat.S_IWUSR))

    def _plain(self, info: os.stat_result) -> bool:
        """A regular file with one name, owned by the workspace's user."""
        return stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and (self.uid is None or info.st_uid == self.uid)

    @staticmethod
    @contextlib.contextmanager
    def _declining() -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            if exc.errno not in DECLINED:
                raise


def _cleared(mode: int) -> int:
    return stat.S_ISUID | (stat.S_ISGID if mode & stat.S_IXGRP else 0)


def _unencodable(path: str) -> bool:
    try:
        os.fsencode(path)
    except UnicodeEncodeError:
        return True
    return False


__all__ = ["WorkspaceFiles"]
