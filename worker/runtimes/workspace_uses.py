"""Which runs are in a workspace on this host, so that no run's workspace is removed under it by another's end.

Each run holds a shared ``flock`` on its workspace's use file (``<work root>/.skillrun/uses/<id>``, root's alone; a
lock of each process on this host, so of every worker sharing the work root) from before its workspace is found or
made until its end (``WorkspaceUses.enter``). A run that keeps its workspace marks the file *kept*; a one-off run
whose result is stored marks it *unwanted*. Leaving (``WorkspaceUse.leave``) tries the lock exclusively, without
waiting: the run that gets it is the last in the workspace, and removes it if it is unwanted and was never kept —
as a run naming a kept workspace joins it (``worker.run_store.workspaces.joining``), such a workspace is removed
only by the kept workspaces' rules (idle, deleted). A workspace's removal takes the file with it (``forget``); a
run that finds it being removed waits for that and starts in a new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from worker.roots.folders import still_at

USES_DIR = "uses"
UNWANTED_AT, KEPT_AT = 0, 1
"""The bytes of a use file that mark its workspace unwanted (a one-off run asked for its removal) and kept (a run
that keeps it was in it); each is written by one kind of run alone, so no mark overwrites the other."""
MARK = b"x"


class WorkspaceUse:
    """One run's hold on its workspace's use file (an open descriptor, locked shared until ``leave``)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd

    def mark_kept(self) -> None:
        os.pwrite(self._fd, MARK, KEPT_AT)

    def mark_unwanted(self) -> None:
        os.pwrite(self._fd, MARK, UNWANTED_AT)

    def leave(self) -> bool:
        """Leave the workspace; whether this was the last run in it and it is to be removed now: then the hold stays,
        exclusive, until ``close`` (after the removal); otherwise it is released."""
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # only once no other run holds it
        except BlockingIOError:
            self.close()
            return False
        marks = os.pread(self._fd, KEPT_AT + 1, 0).ljust(KEPT_AT + 1, b"\0")
        if marks[UNWANTED_AT:UNWANTED_AT + 1] == MARK and marks[KEPT_AT:KEPT_AT + 1] != MARK and \
                still_at(self._fd, self.path):
            return True
        self.close()
        return False

    def close(self) -> None:
        os.close(self._fd)


class WorkspaceUses:
    """The use files of the workspaces under one work root's registry folder (``registry``)."""

    def __init__(self, work_root: Path, registry: Path) -> None:
        self.work_root = work_root
        self.registry = registry

    def path(self, workspace_id: str) -> Path:
        return self.registry / USES_DIR / workspace_id

    def enter(self, workspace_id: str, *, block: bool) -> WorkspaceUse | None:
        """A shared hold on the workspace's use file, or ``None`` where it would wait (a removal holds it) and
        ``block`` is not set. A file removed while it was waited for (its workspace went) is made anew."""
        path = self.path(workspace_id)
        if not path.parent.is_dir():  # the first run under this work root
            self.work_root.mkdir(mode=0o755, parents=True, exist_ok=True)
            for folder, mode in ((self.registry, 0o755), (path.parent, 0o700)):
                with contextlib.suppress(FileExistsError):
                    folder.mkdir(mode=mode)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | (0 if block else fcntl.LOCK_NB))
            except BlockingIOError:
                os.close(fd)
                return None
            if still_at(fd, path):
                return WorkspaceUse(path, fd)
            os.close(fd)

    def forget(self, workspace_id: str) -> None:
        """The workspace is gone: its use file (and its marks) too."""
        self.path(workspace_id).unlink(missing_ok=True)


__all__ = ["USES_DIR", "WorkspaceUse", "WorkspaceUses"]
