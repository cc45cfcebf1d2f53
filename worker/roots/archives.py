"""Safe extraction of skill library archives (``.tar.gz``/``.tgz``/``.tar``/``.zip``).

Every entry is checked before anything of it is written: names with NUL or control characters, absolute paths,
Windows drive letters and backslashes, ``..`` components, more than ``max_depth`` path components (default
``MAX_ARCHIVE_DEPTH``), a component over ``MAX_NAME_PART_BYTES`` or a name over ``MAX_NAME_BYTES``, a second entry
for a path already written, and any entry that is not a plain file or folder (symlinks, hardlinks, devices, FIFOs;
symlinks in zip external attributes) are refused. Limits are enforced while reading, never trusting the sizes an
archive declares: entries listed, files and folders created (those a name implies included), bytes of one entry,
total bytes written, and the ratio of bytes written to archive bytes (zip and gzip bombs, nested ones included: a
nested archive is just a file and is never opened). Files are created with ``O_EXCL | O_NOFOLLOW`` and plain modes
(no setuid bits); nothing is written through a link. Any refusal raises ``UnsafeArchiveError`` and removes what
the extraction created, so the destination is as it was (the caller still owns it).

What the readers hold before an entry is checked is bounded too. A zip's central directory, which ``ZipFile``
parses whole (every entry an object) when it opens the archive, is refused when its end record announces more than
``max_entries`` entries or more than ``MAX_CENTRAL_ENTRY_BYTES`` for each of them; the headers in front of one tar
entry (pax records, GNU long names), which ``tarfile`` reads whole and nests one in another, are refused past
``MAX_TAR_HEADER_BYTES`` before they are read, global pax records past ``MAX_GLOBAL_PAX_RECORDS``, and sparse
entries (whose maps ``tarfile`` reads unbounded) at their header.

The depth bound is what keeps every later walk of an extracted tree (``os.walk``, ``rglob``, ``shutil.rmtree``,
the skill repository's scan: each recurses once per folder level) far below Python's recursion limit.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, NoReturn

from worker.errors import UnsafeArchiveError, WorkspaceError
from worker.roots.folders import remove_tree

READ_CHUNK_BYTES = 64 * 1024
MAX_ARCHIVE_DEPTH = 64
"""Most path components of one entry (its folders and its own name). Real libraries are a few levels deep
(``skills/<name>/scripts/lib/x.py``, vendored packages a dozen or two); 64 is the depth output collection and tar
transfer stop at too, and keeps every walk of an extracted tree hundreds of frames from the recursion limit."""
MAX_NAME_PART_BYTES = 255
"""Most bytes of one path component: the file system's own ``NAME_MAX``, refused here with the entry's name."""
MAX_NAME_BYTES = 1024
"""Most bytes of one entry's whole name (with the destination, it stays under the file system's ``PATH_MAX``)."""
MAX_CENTRAL_ENTRY_BYTES = 256
"""Most bytes of a zip's central directory for each entry ``max_entries`` allows (2.5 MiB for 10,000): an entry takes
46 bytes, its name and, from ``zip -r``, 24 of extra fields (``skills/demo/SKILL.md``: 90 bytes). ``ZipFile``
reads the directory whole and makes an object of ~200 bytes for each 46 it holds, whatever its end record says:
at this bound, opening an archive costs at most ~17 MiB."""
MAX_TAR_HEADER_BYTES = 64 * 1024
"""Most bytes of the headers in front of one tar entry (pax records and GNU long names, their 512-byte headers
included): a name is at most ``MAX_NAME_BYTES``, and the pax records of real archives (times, ids, a few extended
attributes) a few hundred bytes."""
MAX_GLOBAL_PAX_RECORDS = 64
"""Most records global pax headers may hold, all told: they apply to every later entry (``git archive`` writes
one, its commit)."""
SHOWN_NAME_CHARS = 200
"""Characters of an entry's name an error message repeats."""
_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ONLY_FILES = "only files and folders are allowed"
_HEADER_TYPES = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE, tarfile.XGLTYPE,
                 tarfile.SOLARIS_XHDTYPE)
"""Tar headers that describe the entry after them (GNU long names, pax records)."""


@dataclass(frozen=True)
class ArchiveLimits:
    """What an archive may contain. Defaults suit a team's skill library."""

    max_entries: int = 10_000
    """Entries listed, and files and folders created (the folders a name implies included), each."""
    max_entry_bytes: int = 64 * 1024 * 1024
    max_total_bytes: int = 512 * 1024 * 1024
    max_ratio: float = 200.0
    """Bytes written per archive byte."""
    max_depth: int = MAX_ARCHIVE_DEPTH
    """Path components of one entry; lower it at will, never raise it past ``MAX_ARCHIVE_DEPTH`` (see above)."""


@dataclass(frozen=True)
class FetchLimits:
    """How much a URL root may cost to fetch."""

    max_download_bytes: int = 256 * 1024 * 1024
    max_redirects: int = 5
    download_seconds: float = 120.0
    connect_seconds: float = 10.0
    archive: ArchiveLimits = field(default_factory=ArchiveLimits)
    allow_private_addresses: bool = True
    """False refuses URLs (and redirects) to loopback, private, link-local and reserved addresses, however they are
    spelled, and connects only to the addresses it vetted (``worker.egress.addresses``): for URLs a remote caller names,
    so the server cannot be used to reach its own network."""


def safe_name(name: str, max_depth: int = MAX_ARCHIVE_DEPTH) -> PurePosixPath:
    """The relative path an entry may be written to, or ``UnsafeArchiveError`` saying why not."""
    shown = shown_name(name)
    if _CONTROL.search(name):
        raise UnsafeArchiveError(f"entry {shown} has a NUL or control character in its name")
    if "\\" in name:
        raise UnsafeArchiveError(f"entry {shown} uses a backslash (a Windows path)")
    if _DRIVE.match(name):
        raise UnsafeArchiveError(f"entry {shown} starts with a drive letter")
    if name.startswith("/"):
        raise UnsafeArchiveError(f"entry {shown} is an absolute path")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(f"entry {shown} climbs out of the archive with '..'")
    if not parts:
        raise UnsafeArchiveError(f"entry {shown} has no usable name")
    if len(parts) > max_depth:
        raise UnsafeArchiveError(f"entry {shown} is more than {max_depth} folders deep ({len(parts)} path components)")
    try:
        encoded = os.fsencode(name)
    except UnicodeEncodeError:
        raise UnsafeArchiveError(f"entry {shown} cannot be a file name here (it is not valid text)") from None
    if len(encoded) > MAX_NAME_BYTES:
        raise UnsafeArchiveError(f"entry {shown} has a name longer than {MAX_NAME_BYTES} bytes")
    if any(len(os.fsencode(part)) > MAX_NAME_PART_BYTES for part in parts):
        raise UnsafeArchiveError(f"entry {shown} has a path component longer than {MAX_NAME_PART_BYTES} bytes")
    return PurePosixPath(*parts)


def names_the_root(name: str) -> bool:
    """Whether ``name`` is the archive's root itself (``.``, ``./``), a folder entry that adds nothing."""
    return bool(name) and not name.startswith("/") and all(part in ("", ".") for part in name.split("/"))


def shown_name(name: str) -> str:
    """An entry's name as an error message repeats it: quoted, and cut after ``SHOWN_NAME_CHARS`` characters."""
    return repr(name) if len(name) <= SHOWN_NAME_CHARS else f"{name[:SHOWN_NAME_CHARS]!r}..."


class _Budget:
    """What an extraction has used of its limits: entries listed, files and folders created, bytes written."""

    def __init__(self, limits: ArchiveLimits, archive_bytes: int) -> None:
        self.limits = limits
        self.entries = 0
        self.created = 0
        self.total = 0
        self.ratio_cap = max(limits.max_ratio * max(archive_bytes, 1), 1024 * 1024)

    def entry(self, name: str) -> PurePosixPath:
        """Count one listed entry; the path it may be written to (``safe_name``)."""
        self.entries += 1
        if self.entries > self.limits.max_entries:
            raise UnsafeArchiveError(f"the archive has more than {self.limits.max_entries} entries")
        return safe_name(name, self.limits.max_depth)

    def create(self) -> None:
        """Count one file or folder about to be created."""
        self.created += 1
        if self.created > self.limits.max_entries:
            raise UnsafeArchiveError(f"the archive has more than {self.limits.max_entries} entries "
                                     "(files and folders, those its names imply included)")

    def take(self, name: str, written: int, n: int) -> None:
        if written + n > self.limits.max_entry_bytes:
            raise UnsafeArchiveError(f"entry {shown_name(name)} is larger than {self.limits.max_entry_bytes} bytes")
        self.total += n
        if self.total > self.limits.max_total_bytes:
            raise UnsafeArchiveError(f"the archive unpacks to more than {self.limits.max_total_bytes} bytes")
        if self.total > self.ratio_cap:
            raise UnsafeArchiveError(
                f"the archive unpacks to more than {self.limits.max_ratio:g} times its size (a compression bomb)"
            )


class _Writer:
    """Creates folders and files under ``dest``, never through a link; refuses a path written twice; on a refusal,
    removes everything it created (``undone_on_failure``)."""

    def __init__(self, dest: Path, budget: _Budget) -> None:
        self.dest = dest
        self.budget = budget
        self.files: set[PurePosixPath] = set()
        self.dirs: set[PurePosixPath] = set()
        self.made_dirs: set[PurePosixPath] = set()
        self.made: list[PurePosixPath] = []
        """What it created whose parent it did not: removing these removes all it created."""

    def folder(self, rel: PurePosixPath) -> None:
        if rel in self.files:
            raise UnsafeArchiveError(f"entry {shown_name(str(rel))} is both a file and a folder")
        for parent in [*reversed(rel.parents[:-1]), rel] if rel.parts else []:
            if parent in self.files:
                raise UnsafeArchiveError(
                    f"entry {shown_name(str(rel))} puts a folder where the file {shown_name(str(parent))} is"
                )
            if parent not in self.dirs:
                self._mkdir(parent)
                self.dirs.add(parent)

    def file(self, rel: PurePosixPath, source: BinaryIO, executable: bool) -> int:
        """Write ``rel`` from ``source``; the bytes written."""
        if rel in self.files or rel in self.dirs:
            raise UnsafeArchiveError(f"entry {shown_name(str(rel))} appears twice: a later entry would overwrite it")
        if rel.parent.parts:
            self.folder(rel.parent)
        self.budget.create()
        try:
            fd = os.open(self.dest / rel, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o755 if executable else 0o644)
        except OSError as exc:
            raise UnsafeArchiveError(f"entry {shown_name(str(rel))} cannot be written: {exc.strerror}") from None
        self.files.add(rel)
        self._made(rel)
        written = 0
        with os.fdopen(fd, "wb") as out:
            while True:
                chunk = source.read(READ_CHUNK_BYTES)
                if not chunk:
                    break
                self.budget.take(str(rel), written, len(chunk))
                written += len(chunk)
                out.write(chunk)
        return written

    def _mkdir(self, rel: PurePosixPath) -> None:
        """Create the folder ``rel``, or use the one there (never a link to one)."""
        path = self.dest / rel
        self.budget.create()
        try:
            os.mkdir(path, 0o755)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                raise UnsafeArchiveError(f"entry {shown_name(str(rel))} would be written through a file or link "
                                         "already in the destination") from None
            return
        except OSError as exc:
            raise UnsafeArchiveError(f"entry {shown_name(str(rel))} cannot be written: {exc.strerror}") from None
        self.made_dirs.add(rel)
        self._made(rel)

    def _made(self, rel: PurePosixPath) -> None:
        if rel.parent not in self.made_dirs:
            self.made.append(rel)

    @contextlib.contextmanager
    def undone_on_failure(self) -> Iterator[None]:
        """Whatever the block raises, first remove what was created: the destination is left as it was."""
        try:
            yield
        except BaseException:
            for rel in reversed(self.made):
                with contextlib.suppress(WorkspaceError):  # the caller removes the destination as well
                    remove_tree(self.dest / rel)
            raise


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


class _BoundedTarInfo(tarfile.TarInfo):
    """A tar header whose extensions are bounded before ``tarfile`` reads them: the headers in front of one entry
    (they start at the archive's ``offset``) to ``MAX_TAR_HEADER_BYTES``, global pax records to
    ``MAX_GLOBAL_PAX_RECORDS``; a sparse entry is refused at its header, before its map is read."""

    def _proc_member(self, archive: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _HEADER_TYPES:
            blocks = -(-self.size // tarfile.BLOCKSIZE)
            if self.offset + (1 + blocks) * tarfile.BLOCKSIZE - archive.offset > MAX_TAR_HEADER_BYTES:
                raise UnsafeArchiveError(f"the headers of an entry take more than {MAX_TAR_HEADER_BYTES} bytes "
                                         "(pax records or GNU long names)")
        if self.type == tarfile.GNUTYPE_SPARSE:
            self._refuse_sparse(self)
        member = super()._proc_member(archive)
        if len(archive.pax_headers) > MAX_GLOBAL_PAX_RECORDS:
            raise UnsafeArchiveError(f"the archive's global pax headers hold more than {MAX_GLOBAL_PAX_RECORDS} "
                                     "records")
        return member

    def _refuse_sparse(self, member: tarfile.TarInfo, *_: object) -> NoReturn:
        raise UnsafeArchiveError(f"entry {shown_name(member.name)} is a sparse file; store it as a plain file")

    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse  # pax's sparse formats


def extract_tar(archive: Path, dest: Path, limits: ArchiveLimits) -> int:
    """Extract a tar archive (gzip-compressed or not) into the folder ``dest``; the bytes written."""
    size = archive.stat().st_size
    budget = _Budget(limits, size)
    cap = int(min(limits.max_total_bytes + limits.max_entries * 1024 + 1024 * 1024, budget.ratio_cap + 1024 * 1024))
    writer = _Writer(dest, budget)
    with writer.undone_on_failure(), open(archive, "rb") as raw_file:
        head = raw_file.read(2)
        raw_file.seek(0)
        stream: BinaryIO = gzip.GzipFile(fileobj=raw_file) if head == b"\x1f\x8b" else raw_file
        counted = io.BufferedReader(_CountingReader(stream, cap))
        try:
            with tarfile.open(fileobj=counted, mode="r|", tarinfo=_BoundedTarInfo) as tar:
                for member in tar:
                    if names_the_root(member.name) and member.isdir():
                        continue  # "./", as tar -C dir . writes it: the destination itself
                    rel = budget.entry(member.name)
                    shown = shown_name(member.name)
                    if member.isdir():
                        writer.folder(rel)
                    elif member.isreg():
                        if member.size > limits.max_entry_bytes:
                            raise UnsafeArchiveError(f"entry {shown} is larger than {limits.max_entry_bytes} bytes")
                        writer.file(rel, tar.extractfile(member), bool(member.mode & 0o111))
                    else:
                        raise UnsafeArchiveError(f"entry {shown} is {_tar_kind(member)}; {_ONLY_FILES}")
        except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
            raise UnsafeArchiveError(f"not a readable tar archive: {exc}") from exc
    return budget.total


def extract_zip(archive: Path, dest: Path, limits: ArchiveLimits) -> int:
    """Extract a zip archive into the folder ``dest``; the bytes written."""
    budget = _Budget(limits, archive.stat().st_size)
    writer = _Writer(dest, budget)
    with writer.undone_on_failure():
        try:
            with open(archive, "rb") as file, _open_zip(file, limits) as zf:
                for info in zf.infolist():
                    if names_the_root(info.filename) and info.is_dir():
                        continue
                    rel = budget.entry(info.filename)
                    shown = shown_name(info.filename)
                    mode = info.external_attr >> 16
                    if info.flag_bits & 0x1:
                        raise UnsafeArchiveError(f"entry {shown} is encrypted")
                    if stat.S_ISLNK(mode):
                        raise UnsafeArchiveError(f"entry {shown} is a symbolic link; {_ONLY_FILES}")
                    if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):  # many zips set no type bits at all
                        raise UnsafeArchiveError(f"entry {shown} is a special file; {_ONLY_FILES}")
                    if info.is_dir():
                        writer.folder(rel)
                        continue
                    with zf.open(info) as source:
                        writer.file(rel, source, bool(mode & 0o111))
        except (zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError, ValueError, OSError) as exc:
            raise UnsafeArchiveError(f"not a readable zip archive: {exc}") from exc
    return budget.total


def _open_zip(file: BinaryIO, limits: ArchiveLimits) -> zipfile.ZipFile:
    """``file`` opened as a zip once its end record (zip64's included) announces at most ``max_entries`` entries in
    a central directory of at most ``MAX_CENTRAL_ENTRY_BYTES`` for each. The record is read with ``zipfile``'s own
    reader, so what is checked is what ``ZipFile`` then reads: a parser of ours could find another record."""
    end = zipfile._EndRecData(file)  # None when there is none: ZipFile then says it is not a zip
    if end is not None:
        entries, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]
        if entries > limits.max_entries:
            raise UnsafeArchiveError(f"the archive has more than {limits.max_entries} entries (it lists {entries})")
        if size > limits.max_entries * MAX_CENTRAL_ENTRY_BYTES:
            raise UnsafeArchiveError(f"the archive's list of entries is {size} bytes, more than "
                                     f"{limits.max_entries * MAX_CENTRAL_ENTRY_BYTES} ({MAX_CENTRAL_ENTRY_BYTES} "
                                     f"for each of {limits.max_entries} entries)")
    return zipfile.ZipFile(file)


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {shown_name(member.linkname)})"
    if member.islnk():
        return f"a hard link (to {shown_name(member.linkname)})"
    if member.ischr() or member.isblk():
        return "a device"
    if member.isfifo():
        return "a FIFO"
    return "a special entry"
