"""Properties of the archive extractor (``worker.roots.archives``) on generated hostile tar and zip archives.

Members get generated names (absolute, ``..``, backslashes, drive letters, NUL and control characters, very long,
deep, duplicated, colliding in case, colliding with what the destination already holds), types (files, folders,
symlinks, hardlinks, devices, FIFOs, encrypted zip entries), sizes and counts around small limits; the archive's
bytes may then be corrupted. Whatever comes:

* extraction succeeds with only plain files and folders, all inside the destination, holding what the archive
  said; or it raises ``UnsafeArchiveError`` and leaves the destination as it was;
* nothing is ever created outside the destination (every ``mkdir`` and every file opened for writing is counted
  and its path checked, and the folder around the destination is compared before and after);
* the work is bounded by the limits, by count: files and folders created at most ``max_entries``, files opened for
  writing at most ``max_entries``, bytes written at most ``max_total_bytes`` (at most ``max_entry_bytes`` per
  file), compression bombs included.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
import tempfile
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from unittest import mock

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from worker.roots.archives import ArchiveLimits, extract_tar, extract_zip
from worker.errors import UnsafeArchiveError
from worker.roots.folders import remove_tree

LIMITS = ArchiveLimits(max_entries=8, max_entry_bytes=64, max_total_bytes=160, max_depth=5)
"""Small limits, so generated archives reach and pass each of them."""
FAST = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
"""A few seconds in all; each example makes its own folders under the test's ``tmp_path``."""
KEPT = {"keep.txt": b"was here before", "keepdir/inner.txt": b"so was this"}
"""What the destination holds before extraction."""

_CLEAN_PARTS = st.sampled_from(["a", "A", "b", "B", "keepdir", "keep.txt", "é", "E\u0301"])
"""Case collisions, Unicode spelled two ways, and the names ``KEPT`` already holds."""
_PARTS = st.one_of(_CLEAN_PARTS, st.sampled_from([".", "", "x" * 256]))
_HOSTILE_NAMES = st.sampled_from([
    "/etc/passwd", "//server/share", "../escape", "a/../../escape", "a/..", "..", "a\\..\\escape", "C:/x", "c:x",
    "a\x00b", "a\x1fb", "\x7f", "", ".", "./", "a//b", "./a/./b", "a/", "x" * 1100, "/".join(["d"] * 40),
])
_CLEAN_NAMES = st.lists(_CLEAN_PARTS, min_size=1, max_size=LIMITS.max_depth).map("/".join)
_NAMES = st.one_of(_CLEAN_NAMES, st.lists(_PARTS, min_size=1, max_size=LIMITS.max_depth + 2).map("/".join),
                   _HOSTILE_NAMES)
_TAR_KINDS = st.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink", "chr", "blk", "fifo"])
_ZIP_KINDS = st.sampled_from(["file", "file", "file", "dir", "symlink", "fifo", "chr", "encrypted", "executable"])
_PLAIN_KINDS = st.sampled_from(["file", "file", "dir"])
_CORRUPTION = st.one_of(st.none(), st.none(), st.tuples(st.sampled_from(["flip", "cut"]), st.integers(0, 9_999),
                                                        st.integers(1, 255)))
"""Mostly nothing, else a flipped byte or a cut: (how, where in ten-thousandths of the archive, the bits flipped)."""


@dataclass(frozen=True)
class Member:
    name: str
    kind: str
    data: bytes = b""


def _members(kinds: st.SearchStrategy[str]) -> st.SearchStrategy[list[Member]]:
    """Members of a plausible archive (plain files and folders, clean names: what fails is a limit, a duplicate or a
    collision), or of a hostile one (any name, any type)."""
    data = st.binary(max_size=LIMITS.max_entry_bytes + 8)
    plausible = st.builds(Member, _CLEAN_NAMES, _PLAIN_KINDS, data)
    hostile = st.builds(Member, _NAMES, kinds, data)
    return st.one_of(st.lists(plausible, max_size=LIMITS.max_entries),
                     st.lists(hostile, max_size=LIMITS.max_entries + 3))


def _corrupt(data: bytes, corruption: tuple[str, int, int] | None) -> bytes:
    if corruption is None or not data:
        return data
    how, where, bits = corruption
    at = where * len(data) // 10_000
    return data[:at] if how == "cut" else data[:at] + bytes([data[at] ^ bits]) + data[at + 1:]


def tar_bytes(members: list[Member], gz: bool) -> bytes:
    kinds = {"dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE, "hardlink": tarfile.LNKTYPE,
             "chr": tarfile.CHRTYPE, "blk": tarfile.BLKTYPE, "fifo": tarfile.FIFOTYPE, "file": tarfile.REGTYPE}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tar:
        for m in members:
            info = tarfile.TarInfo(m.name)
            info.type = kinds[m.kind]
            info.mode = 0o4755 if m.kind == "file" else 0o755  # a setuid bit is never kept
            if m.kind in ("symlink", "hardlink"):
                info.linkname = "../../../etc/passwd" if m.kind == "symlink" else "a"
            info.size = len(m.data) if m.kind == "file" else 0
            tar.addfile(info, io.BytesIO(m.data) if m.kind == "file" else None)
    return buf.getvalue()


def zip_bytes(members: list[Member], deflated: bool) -> bytes:
    modes = {"symlink": stat.S_IFLNK | 0o777, "fifo": stat.S_IFIFO | 0o644, "chr": stat.S_IFCHR | 0o644,
             "executable": stat.S_IFREG | 0o4755, "dir": stat.S_IFDIR | 0o755}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED if deflated else zipfile.ZIP_STORED) as zf, \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names are the point
        for m in members:
            info = zipfile.ZipInfo(m.name.rstrip("/") + "/" if m.kind == "dir" else m.name)
            info.compress_type = zf.compression
            info.external_attr = modes.get(m.kind, 0) << 16
            if m.kind == "encrypted":
                info.flag_bits |= 0x1
            zf.writestr(info, b"" if m.kind == "dir" else m.data)
    return buf.getvalue()


@dataclass
class Work:
    """What an extraction did, counted at the system calls."""

    made: list[str] = field(default_factory=list)
    """Paths of every folder made and every file created."""
    opened_for_writing: int = 0
    written: list[int] = field(default_factory=list)
    """Bytes written, per file written."""


class _CountingFile:
    def __init__(self, file, counts: list[int]) -> None:  # noqa: ANN001 - a file object
        self.file = file
        self.counts = counts
        counts.append(0)
        self.index = len(counts) - 1

    def write(self, data: bytes) -> int:
        self.counts[self.index] += len(data)
        return self.file.write(data)

    def __enter__(self) -> _CountingFile:
        return self

    def __exit__(self, *exc) -> None:  # noqa: ANN002 - the context manager protocol
        self.file.close()


@contextmanager
def counted() -> Iterator[Work]:
    """Count every folder made, file opened for writing and byte written while the block runs."""
    work = Work()
    real_open, real_mkdir, real_fdopen = os.open, os.mkdir, os.fdopen

    def open_(path, flags, *args, **kwargs):  # noqa: ANN001, ANN202 - os.open's signature
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            work.opened_for_writing += 1
            if flags & os.O_CREAT:
                work.made.append(os.path.abspath(path))
        return real_open(path, flags, *args, **kwargs)

    def mkdir(path, *args, **kwargs):  # noqa: ANN001, ANN202 - os.mkdir's signature
        work.made.append(os.path.abspath(path))
        return real_mkdir(path, *args, **kwargs)

    def fdopen(fd, *args, **kwargs):  # noqa: ANN001, ANN202 - os.fdopen's signature
        return _CountingFile(real_fdopen(fd, *args, **kwargs), work.written)

    with mock.patch.object(os, "open", open_), mock.patch.object(os, "mkdir", mkdir), \
            mock.patch.object(os, "fdopen", fdopen):
        yield work


def snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under ``top``: (``"file"``, content, mode) for a file, (kind letter, mode) otherwise; links never
    followed."""
    found = {}
    for folder, dirs, files in os.walk(top):
        for name in dirs + files:
            path = os.path.join(folder, name)
            info = os.lstat(path)
            rel = os.path.relpath(path, top)
            if stat.S_ISREG(info.st_mode):
                found[rel] = ("file", Path(path).read_bytes(), stat.S_IMODE(info.st_mode))
            else:
                found[rel] = (stat.filemode(info.st_mode)[0], stat.S_IMODE(info.st_mode))
    return found


@contextmanager
def box(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """A folder holding a destination (with ``KEPT`` in it) and a neighbour the archive must never reach."""
    top = Path(tempfile.mkdtemp(dir=tmp_path))
    dest, neighbour = top / "dest", top / "neighbour"
    for folder in (dest, neighbour):
        for rel, data in KEPT.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
    try:
        yield dest, neighbour
    finally:
        remove_tree(top)


def _expected(members: list[Member]) -> dict[str, bytes]:
    """The files a fully accepted archive holds, by normalised path (a zip name ends at a NUL; one naming the root,
    ``./``, is a folder entry for the destination itself)."""
    paths = {m: [p for p in m.name.split("\x00")[0].split("/") if p not in ("", ".")] for m in members}
    return {str(PurePosixPath(*paths[m])): m.data for m in members if m.kind in ("file", "executable") and paths[m]}


def _reason(exc: UnsafeArchiveError) -> str:
    """The kind of a refusal, without the entry's name: its message's last words."""
    text = str(exc)
    return "refused: " + (text.split("' ", 1)[-1] if text.startswith("entry ") else text.split(":")[0])[:60]


def check(tmp_path: Path, extract, data: bytes, members: list[Member] | None,  # noqa: ANN001 - the extractor
          limits: ArchiveLimits = LIMITS) -> None:
    with box(tmp_path) as (dest, neighbour):
        archive = dest.parent / "archive"
        archive.write_bytes(data)
        before, around = snapshot(dest), snapshot(neighbour)
        names_around = sorted(os.listdir(dest.parent))
        with counted() as work:
            try:
                written = extract(archive, dest, limits)
                refused = None
            except UnsafeArchiveError as exc:
                refused = exc
        event(_reason(refused) if refused else "extracted")
        # nothing outside
        assert all(os.path.commonpath([str(dest), made]) == str(dest) for made in work.made), work.made
        assert snapshot(neighbour) == around and sorted(os.listdir(dest.parent)) == names_around
        # bounded work, by count
        assert len(work.made) <= limits.max_entries and work.opened_for_writing <= limits.max_entries
        assert sum(work.written) <= limits.max_total_bytes
        assert all(n <= limits.max_entry_bytes for n in work.written)
        after = snapshot(dest)
        if refused is not None:
            assert str(refused)
            assert after == before, "a refused archive changed the destination"
            return
        assert written == sum(work.written)
        for rel, entry in after.items():
            assert entry[0] in ("file", "d"), f"{rel} is not a plain file or folder: {entry}"
            assert entry[-1] & 0o7000 == 0, f"{rel} kept a setuid, setgid or sticky bit"
        if members is not None:
            for rel, content in _expected(members).items():
                assert after[rel][:2] == ("file", content)


@FAST
@given(members=_members(_TAR_KINDS), gz=st.booleans(), corruption=_CORRUPTION)
def test_any_tar_is_extracted_inside_within_its_limits_or_refused_leaving_nothing(tmp_path, members, gz, corruption):
    data = tar_bytes(members, gz)
    check(tmp_path, extract_tar, _corrupt(data, corruption), members if corruption is None else None)


@FAST
@given(members=_members(_ZIP_KINDS), deflated=st.booleans(), corruption=_CORRUPTION)
def test_any_zip_is_extracted_inside_within_its_limits_or_refused_leaving_nothing(tmp_path, members, deflated,
                                                                                   corruption):
    data = zip_bytes(members, deflated)
    files = [m for m in members if not m.name.split("\x00")[0].endswith("/")]  # zip: a name ending in / is a folder
    check(tmp_path, extract_zip, _corrupt(data, corruption), files if corruption is None else None)


@settings(FAST, max_examples=25)
@given(kind=st.sampled_from(["tar.gz", "zip"]), sizes=st.lists(st.integers(0, 3 * 1024 * 1024), min_size=1, max_size=3),
       ratio=st.sampled_from([2.0, 50.0, 200.0]), total=st.sampled_from([64 * 1024, 1024 * 1024, 4 * 1024 * 1024]))
def test_a_compression_bomb_writes_no_more_than_its_ratio_and_total_allow(tmp_path, kind, sizes, ratio, total):
    members = [Member(f"bomb/{i}.bin", "file", b"\0" * size) for i, size in enumerate(sizes)]
    data = tar_bytes(members, gz=True) if kind == "tar.gz" else zip_bytes(members, deflated=True)
    limits = ArchiveLimits(max_entry_bytes=2 * 1024 * 1024, max_total_bytes=total, max_ratio=ratio)
    with box(tmp_path) as (dest, _):
        archive = dest.parent / "bomb"
        archive.write_bytes(data)
        before = snapshot(dest)
        allowed = min(total, max(ratio * len(data), 1024 * 1024))  # the ratio never caps below 1 MiB
        with counted() as work:
            try:
                (extract_tar if kind == "tar.gz" else extract_zip)(archive, dest, limits)
            except UnsafeArchiveError:
                assert snapshot(dest) == before
            else:
                assert sum(sizes) <= allowed
        assert sum(work.written) <= allowed
