"""Safe extraction of skill library archives (``.tar.gz``/``.tgz``/``.tar``/``.zip``).

Every entry is checked before anything of it is written: names with NUL or control characters, absolute paths,
Windows drive letters and backslashes, ``..`` components, a second entry for a path already written, and any
entry that is not a plain file or folder (symlinks, hardlinks, devices, FIFOs; symlinks in zip external
attributes) are refused. Limits are enforced while reading, never trusting the sizes an archive declares: number
of entries, bytes of one entry, total bytes written, and the ratio of bytes written to archive bytes (zip and
gzip bombs, nested ones included: a nested archive is just a file and is never opened). Files are created with
``O_EXCL | O_NOFOLLOW`` and plain modes (no setuid bits). Any refusal raises ``UnsafeArchiveError``; the caller
owns the destination folder and removes it.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from worker.errors import UnsafeArchiveError

READ_CHUNK_BYTES = 64 * 1024
_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class ArchiveLimits:
    """What an archive may contain. Defaults suit a team's skill library."""

    max_entries: int = 10_000
    max_entry_bytes: int = 64 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024
    max_ratio: float = 200.0
    """Bytes written per archive byte."""


def safe_name(name: str) -> PurePosixPath:
    """The relative path an entry may be written to, or ``UnsafeArchiveError`` saying why not."""
    if _CONTROL.search(name):
        raise UnsafeArchiveError(f"entry {name!r} has a NUL or control character in its name")
    if "\\" in name:
        raise UnsafeArchiveError(f"entry {name!r} uses a backslash (a Windows path)")
    if _DRIVE.match(name):
        raise UnsafeArchiveError(f"entry {name!r} starts with a drive letter")
    if name.startswith("/"):
        raise UnsafeArchiveError(f"entry {name!r} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(f"entry {name!r} climbs out of the archive with '..'")
    if not parts:
        raise UnsafeArchiveError(f"entry {name!r} has no usable name")
    return PurePosixPath(*parts)


class _Budget:
    def __init__(self, limits: ArchiveLimits, archive_bytes: int) -> None:
        self.limits = limits
        self.entries = 0
        self.total = 0
        self.ratio_cap = max(limits.max_ratio * max(archive_bytes, 1), 1024 * 1024)

    def entry(self, name: str) -> None:
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise UnsafeArchiveError(f"the archive has more than {self.limits.max_entries} entries")

    def take(self, name: str, written: int, n: int) -> None:
        if written + n > self.limits.max_entry_bytes:
            raise UnsafeArchiveError(f"entry {name!r} is larger than {self.limits.max_entry_bytes} bytes")
        self.total += n
        if self.total > self.limits.max_total_bytes:
            raise UnsafeArchiveError(f"the archive unpacks to more than {self.limits.max_total_bytes} bytes")
        if self.total > self.ratio_cap:
            raise UnsafeArchiveError(
                f"the archive unpacks to more than {self.limits.max_ratio:g} times its size (a compression bomb)"
            )


class _Writer:
    """Creates folders and files under ``dest``; refuses a path written twice."""

    def __init__(self, dest: Path, budget: _Budget) -> None:
        self.dest = dest
        self.budget = budget
        self.files: set[PurePosixPath] = set()
        self.dirs: set[PurePosixPath] = set()

    def folder(self, rel: PurePosixPath) -> None:
        if rel in self.files:
            raise UnsafeArchiveError(f"entry {str(rel)!r} is both a file and a folder")
        for parent in [*reversed(rel.parents[:-1]), rel] if rel.parts else []:
            if parent in self.files:
                raise UnsafeArchiveError(f"entry {str(rel)!r} puts a folder where the file {str(parent)!r} is")
            if parent not in self.dirs:
                (self.dest / parent).mkdir(mode=0o755, exist_ok=True)
                self.dirs.add(parent)

    def file(self, rel: PurePosixPath, source: BinaryIO, executable: bool) -> None:
        if rel in self.files or rel in self.dirs:
            raise UnsafeArchiveError(f"entry {str(rel)!r} appears twice: a later entry would overwrite it")
        if rel.parent.parts:
            self.folder(rel.parent)
        self.files.add(rel)
        fd = os.open(self.dest / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if executable else 0o644)
        written = 0
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = source.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                self.budget.take(str(rel), written, len(chunk))
                written += len(chunk)
                out.write(chunk)


class _CountingReader(io.RawIOBase):
    """Counts and caps the decompressed bytes a tar stream reads (also its headers and padding)."""

    def __init__(self, raw: BinaryIO, cap: int) -> None:
        self.raw = raw
        self.cap = cap
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - memoryview
        data = self.raw.read(len(buffer))
        self.count += len(data)
        if self.count > self.cap:
            raise UnsafeArchiveError("the archive unpacks to more than its limits allow (a compression bomb)")
        buffer[: len(data)] = data
        return len(data)


def extract_tar(archive: Path, dest: Path, limits: ArchiveLimits) -> None:
    size = archive.stat().st_size
    budget = _Budget(limits, size)
    cap = int(min(limits.max_total_bytes + limits.max_entries * 1024 + 1024 * 1024, budget.ratio_cap + 1024 * 1024))
    writer = _Writer(dest, budget)
    with open(archive, "rb") as raw_file:
        head = raw_file.read(2)
        raw_file.seek(0)
        if head == b"\x1f\x8b":
            stream: BinaryIO = gzip.GzipFile(fileobj=raw_file)
        else:
            stream = raw_file
        counted = io.BufferedReader(_CountingReader(stream, cap))
        try:
            with tarfile.open(fileobj=counted, mode="r|") as tar:
                for member in tar:
                    budget.entry(member.name)
                    rel = safe_name(member.name)
                    if member.isdir():
                        writer.folder(rel)
                    elif member.isreg():
                        if member.size > limits.max_entry_bytes:
                            raise UnsafeArchiveError(f"entry {member.name!r} is larger than {limits.max_entry_bytes} bytes")
                        source = tar.extractfile(member)
                        writer.file(rel, source, bool(member.mode & 0o111))
                    else:
                        raise UnsafeArchiveError(f"entry {member.name!r} is {_tar_kind(member)}; only files and folders are allowed")
        except (tarfile.TarError, EOFError, OSError) as exc:
            if isinstance(exc, UnsafeArchiveError):
                raise
            raise UnsafeArchiveError(f"not a readable tar archive: {exc}") from exc


def extract_zip(archive: Path, dest: Path, limits: ArchiveLimits) -> None:
    budget = _Budget(limits, archive.stat().st_size)
    writer = _Writer(dest, budget)
    try:
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                budget.entry(info.filename)
                rel = safe_name(info.filename)
                mode = info.external_attr >> 16
                if info.flag_bits & 0x1:
                    raise UnsafeArchiveError(f"entry {info.filename!r} is encrypted")
                if stat.S_ISLNK(mode):
                    raise UnsafeArchiveError(f"entry {info.filename!r} is a symbolic link; only files and folders are allowed")
                if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):  # many zips set no type bits at all
                    raise UnsafeArchiveError(f"entry {info.filename!r} is a special file; only files and folders are allowed")
                if info.is_dir():
                    writer.folder(rel)
                    continue
                with zf.open(info) as source:
                    writer.file(rel, source, bool(mode & 0o111))
    except (zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError, ValueError) as exc:
        raise UnsafeArchiveError(f"not a readable zip archive: {exc}") from exc
    except OSError as exc:
        if isinstance(exc, UnsafeArchiveError):
            raise
        raise UnsafeArchiveError(f"not a readable zip archive: {exc}") from exc


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {member.linkname!r})"
    if member.islnk():
        return f"a hard link (to {member.linkname!r})"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return "a special entry"
