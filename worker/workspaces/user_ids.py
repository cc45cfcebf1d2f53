"""Sandbox user ids, allocated host-wide: no two workspaces on one host hold the same id, whatever their work root.

Workspaces of different work roots (two workers, the API's embedded runtime and a worker, the local and Docker
runtimes) are different tenants' as often as not; an id they shared would let one tenant's processes count
against the other's process limit and own the other's files. The registry is one folder for the host, of links
``<uid> -> <workspace folder>``, changed under one lock (``flock``). An id is held while its workspace folder
exists: one whose folder is gone (removed, or its whole work root deleted) is handed out again. Ids that a user
or group of the host has are never handed out (a file a command writes must not belong to a real account, nor
its group give a real group's access).

Switching to such a user is ``setpriv``'s (``find_setpriv``), always with ``SETPRIV_HARDENING``.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import grp
import os
import pwd
import shutil
from collections.abc import Iterator
from pathlib import Path

from worker import defaults
from worker.config import get_worker_settings
from worker.errors import WorkspaceError

LOCK_FILE = ".lock"


class UserIdRegistry:
    """The host's registry of sandbox user ids in ``[base, base + count)``."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        base: int = defaults.SANDBOX_UID_BASE,
        count: int = defaults.SANDBOX_UID_COUNT,
    ) -> None:
        """``path`` defaults to the worker settings' ``uid_registry`` (``SKILLRUN_UID_REGISTRY``)."""
        self.path = Path(path) if path is not None else get_worker_settings().uid_registry
        self.base = base
        self.count = count

    def allocate(self, owner: Path, start: int) -> int:
        """An id for the workspace folder ``owner``, looked for from ``base + start`` on."""
        with self._locked():
            for i in range(self.count):
                uid = self.base + (start + i) % self.count
                if not host_account_exists(uid) and self._take(uid, owner):
                    return uid
        raise WorkspaceError(f"all {self.count} sandbox user ids are in use; remove idle workspaces")

    def claim(self, uid: int, owner: Path) -> bool:
        """Record that ``owner`` holds ``uid`` (a workspace made before this registry); ``False`` if another
        existing workspace holds it."""
        with self._locked():
            return self._take(uid, owner)

    def release(self, uid: int, owner: Path) -> None:
        """Give ``uid`` back, if ``owner`` holds it."""
        with self._locked():
            entry = self.path / str(uid)
            with contextlib.suppress(OSError):
                if os.readlink(entry) == str(owner):
                    entry.unlink()

    def release_owner(self, owner: Path) -> None:
        """Give back whatever id ``owner`` holds (its id unknown: the registry is looked through)."""
        with self._locked(), contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.path):
                with contextlib.suppress(OSError):
                    if entry.is_symlink() and os.readlink(entry.path) == str(owner):
                        os.unlink(entry.path)

    def _take(self, uid: int, owner: Path) -> bool:
        entry = self.path / str(uid)
        try:
            holder = os.readlink(entry)
        except FileNotFoundError:
            holder = None
        if holder == str(owner):
            return True
        if holder is not None:
            if os.path.isdir(holder):
                return False
            entry.unlink()  # its workspace is gone
        os.symlink(owner, entry)
        return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def host_account_exists(uid: int) -> bool:
    """Whether this host has a user or a group with the id ``uid``."""
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        pass
    try:
        grp.getgrgid(uid)
        return True
    except KeyError:
        return False


SETPRIV_HARDENING = ("--no-new-privs", "--bounding-set=-all", "--inh-caps=-all")
"""Also drop every capability from the bounding set and forbid setuid binaries from raising privileges."""


@functools.cache
def find_setpriv() -> str | None:
    """util-linux's ``setpriv`` switches user in the exec'd child, so the (large) host process can spawn with
    vfork instead of fork: several milliseconds less per run than ``Popen(user=...)``."""
    return shutil.which("setpriv", path=defaults.SANDBOX_PATH + ":/usr/sbin:/sbin")
