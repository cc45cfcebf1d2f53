"""Folder helpers shared by workspaces, stores and caches: removing a tree a run may have made hostile, and
whether other users can reach a folder."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from worker.errors import WorkspaceError


def remove_tree(path: Path) -> None:
    """Remove a directory tree, including read-only parts a stager left behind, never following a link out of it.
    A tree too deep for ``shutil.rmtree`` (it recurses once per level: a run's ``mkdir -p d/d/...`` 1,500 deep made
    its workspace unremovable) is handed to coreutils' ``rm``, which walks any depth. ``WorkspaceError`` when it
    cannot be removed."""

    top = os.path.abspath(path)

    def _retry_writable(func, target, exc_info):  # noqa: ANN001 - shutil's callback signature
        """A read-only folder inside the tree is made writable and the step tried again; a part removed meanwhile
        (a concurrent removal) is done; nothing outside the tree is ever changed."""
        error, parent = exc_info[1], os.path.dirname(target)
        if isinstance(error, FileNotFoundError):
            return
        if not isinstance(error, PermissionError) or not (parent == top or parent.startswith(top + os.sep)):
            raise error
        try:
            os.chmod(parent, 0o700)
            func(target)
        except FileNotFoundError:
            pass

    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
        return
    if not path.exists():
        return
    try:
        shutil.rmtree(path, onerror=_retry_writable)
    except (RecursionError, OSError):
        for command in (["rm", "-rf", "--one-file-system", "--", str(path)], ["chmod", "-R", "u+rwx", "--", str(path)],
                        ["rm", "-rf", "--one-file-system", "--", str(path)]):
            if not os.path.lexists(path):
                return
            subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, check=False)
        if os.path.lexists(path):
            raise WorkspaceError(f"{path} could not be removed") from None


def still_at(fd: int, path: Path) -> bool:
    """Whether the open file ``fd`` is the one at ``path`` now (not removed, nor made anew, meanwhile)."""
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)


def reachable_by_others(path: Path) -> bool:
    """Whether a user other than the owner may pass through every folder down to ``path``."""
    path = Path(path).resolve()
    return all(os.stat(folder).st_mode & stat.S_IXOTH for folder in [path, *path.parents])
