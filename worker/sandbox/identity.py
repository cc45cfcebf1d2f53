"""The run's user as a user: a ``passwd`` and ``group`` entry for a workspace's id in its sandboxes.

A workspace's commands run as an id of its own (30000–59999) that no host user has, so a program that looks itself
up (``getpwuid``: LibreOffice making its profile, ssh, git, ``whoami``, many CLIs) found nothing and failed. Each
sandbox now sees the host's ``/etc/passwd`` and ``/etc/group`` with one more entry each, ``skillrun-<id>`` (as in
the Docker runtime's sandbox image, which has one for every id of the range), its home the workspace's ``work``
folder (``HOME`` stays the run's folder). The two files are written
once per id and home, under the runtime's registry, owned by root and read-only to the run (``SandboxSpec.identity``):
one folder per workspace id of the range at most, rewritten when the id goes to another workspace.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from pathlib import Path

def user_name(uid: int) -> str:
    """The name of the run's user (and of its group, of the same id) in every sandbox."""
    return f"skillrun-{uid}"
HOST_PASSWD = "/etc/passwd"
HOST_GROUP = "/etc/group"


def _host_lines(path: str, id_field: int, own_id: int) -> list[str]:
    """The host file's entries, less any of the run's name or id (a host user of that name is not the run)."""
    own_name = user_name(own_id)
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as file:
            lines = file.read().splitlines()
    except FileNotFoundError:
        return []
    kept = []
    for line in lines:
        fields = line.split(":")
        if len(fields) > id_field and (fields[0] == own_name or fields[id_field] == str(own_id)):
            continue
        kept.append(line)
    return kept


def _write(path: Path, lines: list[str]) -> None:
    """Replace ``path`` with ``lines`` at once: a sandbox starting meanwhile binds the old file or the new one."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".identity-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as file:
            file.write("\n".join(lines) + "\n")
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class Identities:
    """The identity files of a runtime's workspace ids, in ``folder`` (one sub-folder per id)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._written: dict[int, tuple[int, str]] = {}
        self._lock = threading.Lock()

    def known(self, uid: int, gid: int, home: str) -> str | None:
        """The folder of ``uid``'s files when this runtime wrote them for ``gid`` and ``home`` (no disk access)."""
        return str(self.folder / str(uid)) if self._written.get(uid) == (gid, home) else None

    def write(self, uid: int, gid: int, home: str) -> str:
        """Write ``uid``'s ``passwd`` and ``group`` (blocks: a thread's) and return their folder."""
        with self._lock:
            folder = self.folder / str(uid)
            folder.mkdir(parents=True, exist_ok=True, mode=0o755)
            passwd = _host_lines(HOST_PASSWD, 2, uid) + [f"{user_name(uid)}:x:{uid}:{gid}:Skillrun run:{home}:/bin/bash"]
            group = _host_lines(HOST_GROUP, 2, gid) + [f"{user_name(gid)}:x:{gid}:"]
            _write(folder / "passwd", passwd)
            _write(folder / "group", group)
            self._written[uid] = (gid, home)
            return str(folder)
