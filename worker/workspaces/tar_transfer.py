"""Workspace files to and from a remote sandbox as tar archives: one archive up, one down.

Up: ``UploadArchive`` holds what a run needs in the sandbox (the staged skill, read-only, with its ``work``,
``out`` and ``inputs`` links; the run's input files under ``work/inputs``), named relative to the workspace,
symlinks kept as symlinks and file modes kept.

Down: the sandbox packs the files that output patterns may match; ``extract_mirror`` lays them out in a local
mirror of the workspace, where the same collection as on the other runtimes runs. The archive comes from an
untrusted machine, so extraction refuses absolute names and ``..``, never writes through a link, keeps within a
member count and a byte budget, and leaves nothing behind on failure (the mirror is the caller's to remove).
A symlink whose target is inside the remote workspace is pointed at the same place in the mirror; any other
symlink, FIFO or device is recreated as such, for collection to refuse as it would anywhere else.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path, PurePosixPath

from worker.errors import UnsafeArchiveError
from worker.workspaces.staging import WORKSPACE_LINKS, walk_tree

SIZES_MEMBER = ".skillrun-sizes"
"""A member of a download archive listing ``path NUL size NUL`` for files sent only in part."""
MAX_DEPTH = 64
"""Most path components of one entry of a download archive."""


class UploadArchive:
    """A tar archive of workspace-relative entries, built in memory."""

    def __init__(self) -> None:
        self._buffer = io.BytesIO()
        self._tar = tarfile.open(fileobj=self._buffer, mode="w", format=tarfile.PAX_FORMAT)
        self._dirs: set[str] = set()
        self.members = 0

    def add_skill(self, source: Path, name: str) -> None:
        """``skills/<name>/``: the skill folder's files (read-only), its own symlinks as they are, and the links
        to the workspace's ``work``, ``out`` and ``inputs``."""
        top = f"skills/{name}"
        self._dir("skills", 0o755)
        self._dir(top, 0o555)
        for rel, path, info in walk_tree(source):
            if rel.split("/", 1)[0] in WORKSPACE_LINKS:  # the skill's own work/out/inputs give way to the links
                continue
            member = f"{top}/{rel}"
            if stat.S_ISLNK(info.st_mode):
                self._link(member, os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                self._dir(member, 0o555)
            elif stat.S_ISREG(info.st_mode):
                with open(path, "rb") as f:
                    self._file(member, f, info.st_size, (stat.S_IMODE(info.st_mode) & 0o555) | 0o444)
        for entry, target in WORKSPACE_LINKS.items():
            self._link(f"{top}/{entry}", target)

    def add_input(self, name: PurePosixPath, data: io.BufferedIOBase | bytes, size: int) -> None:
        """``work/inputs/<name>``, with its folders."""
        parts = ("work", "inputs", *name.parts[:-1])
        for i in range(1, len(parts) + 1):
            self._dir("/".join(parts[:i]), 0o755)
        stream = io.BytesIO(data) if isinstance(data, bytes) else data
        self._file("/".join(("work", "inputs", *name.parts)), stream, size, 0o644)

    def getvalue(self) -> bytes:
        self._tar.close()
        return self._buffer.getvalue()

    def _dir(self, name: str, mode: int) -> None:
        if name in self._dirs:
            return
        self._dirs.add(name)
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, mode
        self._add(info)

    def _link(self, name: str, target: str) -> None:
        info = tarfile.TarInfo(name)
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
        self._add(info)

    def _file(self, name: str, stream: io.BufferedIOBase, size: int, mode: int) -> None:
        info = tarfile.TarInfo(name)
        info.size, info.mode = size, mode
        self._add(info, stream)

    def _add(self, info: tarfile.TarInfo, stream: io.BufferedIOBase | None = None) -> None:
        info.uname = info.gname = ""
        self._tar.addfile(info, stream)
        self.members += 1


def extract_mirror(
    data: bytes | os.PathLike[str], mirror: Path, *, remote_root: str, max_members: int, max_bytes: int
) -> dict[str, int]:
    """Lay out the download archive ``data`` (its bytes, or the file holding it) under ``mirror``; return the true
    sizes (mirror path → bytes) of files that came only in part."""
    sizes: dict[str, int] = {}
    total = 0
    try:
        if isinstance(data, bytes):
            archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
        else:
            archive = tarfile.open(os.fspath(data), mode="r:")
    except tarfile.TarError as exc:
        raise UnsafeArchiveError(f"the sandbox sent an unreadable archive of outputs: {exc}") from exc
    with archive:
        for count, member in enumerate(archive, start=1):
            if count > max_members:
                raise UnsafeArchiveError(f"the sandbox sent more than {max_members} output entries")
            parts = _safe_parts(member.name)
            if parts == [SIZES_MEMBER]:
                sizes_data = archive.extractfile(member).read(1024 * 1024) if member.isfile() else b""
                fields = sizes_data.split(b"\0")
                for path, size in zip(fields[0::2], fields[1::2]):
                    if not size.isdigit():
                        raise UnsafeArchiveError(f"the sandbox sent a size that is not a number: {size[:40]!r}")
                    sizes[str(mirror.joinpath(*_safe_parts(os.fsdecode(path))))] = int(size)
                continue
            if member.isfile():
                total += member.size
                if total > max_bytes:
                    raise UnsafeArchiveError(f"the sandbox sent more than {max_bytes} bytes of outputs")
            _place(archive, member, mirror, parts, remote_root)
    return {path: size for path, size in sizes.items() if os.path.lexists(path)}


def _safe_parts(name: str) -> list[str]:
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if name.startswith("/") or ".." in parts or not parts or any("\0" in p for p in parts):
        raise UnsafeArchiveError(f"the sandbox sent an output entry with an unsafe name: {name!r}")
    if len(parts) > MAX_DEPTH:
        raise UnsafeArchiveError(f"the sandbox sent an output entry more than {MAX_DEPTH} folders deep: {name[:200]!r}")
    return parts


def _place(archive: tarfile.TarFile, member: tarfile.TarInfo, mirror: Path, parts: list[str], remote_root: str) -> None:
    """Create one entry beneath ``mirror``, one component at a time; an entry under a link is dropped."""
    fd = os.open(mirror, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            try:
                next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                return  # a link or a file is in the way: the entry is beyond it
            os.close(fd)
            fd = next_fd
        try:
            _create(archive, member, fd, parts[-1], mirror, remote_root)
        except FileExistsError:
            pass  # the first entry of a name wins
    finally:
        os.close(fd)


def _create(
    archive: tarfile.TarFile, member: tarfile.TarInfo, fd: int, leaf: str, mirror: Path, remote_root: str
) -> None:
    if member.isdir():
        os.mkdir(leaf, 0o755, dir_fd=fd)
    elif member.isfile():
        out = os.open(leaf, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
        with os.fdopen(out, "wb") as f, archive.extractfile(member) as src:
            while chunk := src.read(1024 * 1024):
                f.write(chunk)
    elif member.issym():
        target, root = member.linkname, remote_root.rstrip("/")
        if target == root or target.startswith(root + "/"):
            target = str(mirror) + target[len(root) :]
        os.symlink(target, leaf, dir_fd=fd)
    elif member.isfifo():
        os.mkfifo(leaf, dir_fd=fd)
    elif member.ischr() or member.isblk():
        kind = stat.S_IFCHR if member.ischr() else stat.S_IFBLK
        try:
            os.mknod(leaf, kind | 0o600, os.makedev(member.devmajor, member.devminor), dir_fd=fd)
        except PermissionError:
            os.mkfifo(leaf, dir_fd=fd)  # not a plain file either way: collection refuses it
