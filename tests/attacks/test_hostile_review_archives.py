"""Review of issue 30's archive fixes (``worker.roots.archives``): what an upload (at most 256 MiB, as the API takes it)
still makes the extractor hold before its entry limits are checked.

``ArchiveLimits`` bounds entries, depth, names and bytes written, checked entry by entry. Two readers run before
those checks and hold what the archive declares: ``zipfile.ZipFile`` parses the whole central directory (every
entry a ``ZipInfo``) before the first entry is looked at, and ``tarfile`` reads a pax (or GNU long-name) header
whole into memory, then decodes it, before the name it carries reaches ``safe_name``; it nests such headers one
call deeper each, and reads a sparse entry's map as long as the archive goes on. Each is refused before it is read
(the zip by its end record, the tar by its headers' sizes), with memory measured as a fresh process's peak
resident size.
"""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from worker.roots.archives import ArchiveLimits, extract_tar, extract_zip
from worker.errors import UnsafeArchiveError

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]

_BUILDERS = """
    import gzip, os, struct, tarfile

    def central_only_zip(path, count):
        # a central directory of ``count`` entries with empty names (46 bytes each), behind zip64 end records
        entry = struct.pack("<4s4B4HL2L5H2L", b"PK\\x01\\x02", 20, 3, 20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        with open(path, "wb") as out:
            for _ in range(count // 10000):
                out.write(entry * 10000)
            size = len(entry) * (count // 10000 * 10000)
            out.write(struct.pack("<4sQ2H2L4Q", b"PK\\x06\\x06", 44, 45, 45, 0, 0, count, count, size, 0))
            out.write(struct.pack("<4sLQL", b"PK\\x06\\x07", 0, size, 1))
            out.write(struct.pack("<4s4H2LH", b"PK\\x05\\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0))

    def long_header_tar(path, kind, size):
        # a tar.gz: random padding (so the archive is big enough for the ratio cap), then a pax or GNU long-name
        # header of ``size`` bytes naming the next entry
        def header(name, length, type_):
            info = tarfile.TarInfo(name); info.size = length; info.type = type_
            return info.tobuf(format=tarfile.USTAR_FORMAT)
        pad = os.urandom(size // 150)
        if kind == "pax":
            rest = len(b" path=") + size + 1
            length = rest + len(str(rest + len(str(rest))))
            first, last, type_, name = str(length).encode() + b" path=", b"\\n", tarfile.XHDTYPE, "././@PaxHeader"
        else:
            length, first, last, type_, name = size + 1, b"", b"\\0", tarfile.GNUTYPE_LONGNAME, "././@LongLink"
        with gzip.open(path, "wb", compresslevel=6) as out:
            out.write(header("pad.bin", len(pad), tarfile.REGTYPE) + pad + b"\\0" * (-len(pad) % 512))
            out.write(header(name, length, type_) + first)
            chunk, left = b"a" * MiB, size
            while left:
                out.write(chunk[:min(left, MiB)]); left -= min(left, MiB)
            out.write(last + b"\\0" * (-length % 512))
            out.write(header("x", 0, tarfile.REGTYPE) + b"\\0" * 1024)
"""

_EXTRACT = """
    import gc, pathlib, resource, sys, tempfile
    MiB = 1024 * 1024
    from worker.roots.archives import ArchiveLimits, extract_tar, extract_zip
    from worker.errors import UnsafeArchiveError
    folder = pathlib.Path(tempfile.mkdtemp())
    archive = folder / "archive"
    {build}
    (folder / "out").mkdir()
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        {extract}(archive, folder / "out", ArchiveLimits())
        outcome = "extracted"
    except UnsafeArchiveError as exc:
        outcome = "refused"
    left = sorted(p.name for p in (folder / "out").iterdir())
    print(outcome, archive.stat().st_size, left, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def _extract_in_fresh_process(build: str, extract: str) -> tuple[str, int, str, int]:
    """(outcome, archive bytes, what was left in the destination, peak resident growth in bytes)."""
    script = textwrap.dedent(_BUILDERS) + textwrap.dedent(_EXTRACT).format(build=build, extract=extract)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    outcome, size, *left, grown = done.stdout.split()
    return outcome, int(size), " ".join(left), int(grown) * 1024


def test_a_zip_announcing_a_million_entries_is_refused_before_they_are_read():
    outcome, size, left, grown = _extract_in_fresh_process("central_only_zip(archive, 1_000_000)", "extract_zip")
    assert outcome == "refused" and left == "[]"
    assert grown < 32 * MiB, (size, grown)


@pytest.mark.parametrize("kind", ["pax", "gnu"])
def test_a_tar_with_a_huge_long_name_header_is_refused_before_it_is_read(kind):
    outcome, size, left, grown = _extract_in_fresh_process(f"long_header_tar(archive, {kind!r}, 64 * MiB)",
                                                           "extract_tar")
    assert outcome == "refused" and left == "[]"
    assert grown < 32 * MiB, (size, grown)


def test_a_zip_of_65535_empty_names_is_refused_cheaply():
    outcome, size, left, grown = _extract_in_fresh_process("central_only_zip(archive, 60_000)", "extract_zip")
    assert outcome == "refused" and left == "[]"
    assert grown < 32 * MiB, (size, grown)


@pytest.mark.parametrize("names", [
    ["skill/a.txt", "skill//a.txt"],
    ["skill/a.txt", "skill/./a.txt"],
    ["./skill/a.txt", "skill/a.txt"],
    ["skill/a", "skill/a/b.txt"],
])
def test_names_that_normalise_to_one_path_are_refused_and_nothing_is_left(tmp_path, names):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in names:
            zf.writestr(name, b"x")
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(UnsafeArchiveError):
        extract_zip(archive, dest, ArchiveLimits())
    assert list(dest.iterdir()) == []


def test_names_differing_only_in_case_or_unicode_form_are_two_files_on_a_case_sensitive_store(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for name in ["s/Read.md", "s/read.md", "s/caf\u00e9.md", "s/cafe\u0301.md"]:
            zf.writestr(name, name.encode())
    dest = tmp_path / "out"
    dest.mkdir()
    extract_zip(archive, dest, ArchiveLimits())
    assert len(list((dest / "s").iterdir())) == 4


def test_a_tar_entry_name_at_the_limits_is_refused_without_a_pax_header_cost(tmp_path):
    archive = tmp_path / "a.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("d/" + "x" * 300)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    dest = tmp_path / "out"
    dest.mkdir()
    with pytest.raises(UnsafeArchiveError, match="longer than 255 bytes"):
        extract_tar(archive, dest, ArchiveLimits())
    assert list(dest.iterdir()) == []


def _header(name: str, size: int, type_: bytes, tar_format: int = tarfile.USTAR_FORMAT, **pax: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.pax_headers = size, type_, pax
    return info.tobuf(format=tar_format)


def _extracted_or_refused(tmp_path: Path, data: bytes, extract=extract_tar) -> str:
    """Extract ``data``; the refusal's message (nothing may be left), or "extracted"."""
    archive, dest = tmp_path / "archive", tmp_path / "out"
    archive.write_bytes(data)
    dest.mkdir()
    try:
        extract(archive, dest, ArchiveLimits())
    except UnsafeArchiveError as exc:
        assert list(dest.iterdir()) == []
        return str(exc)
    return "extracted"


@pytest.mark.parametrize("type_", [tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE, tarfile.XGLTYPE])
def test_a_tar_entry_behind_3000_small_headers_is_refused_not_a_recursion_error(tmp_path, type_):
    record = b"a\0" if type_ == tarfile.GNUTYPE_LONGNAME else b"11 path=ab\n"  # tarfile reads one header a call deeper
    header = _header("././@LongLink", len(record), type_) + record.ljust(tarfile.BLOCKSIZE, b"\0")
    data = header * 3000 + _header("x", 0, tarfile.REGTYPE) + b"\0" * 1024
    assert "take more than 65536 bytes" in _extracted_or_refused(tmp_path, data)


def test_global_pax_records_past_their_bound_are_refused(tmp_path):
    records = {f"k{i}": "v" for i in range(100)}  # each global header's records apply to every later entry
    data = b"".join(_header(f"f{i}", 0, tarfile.REGTYPE) + tarfile.TarInfo.create_pax_global_header({key: value})
                    for i, (key, value) in enumerate(records.items()))
    assert "more than 64 records" in _extracted_or_refused(tmp_path, data + b"\0" * 1024)


@pytest.mark.parametrize("sparse", ["gnu", "pax 1.0"])
def test_a_sparse_tar_entry_is_refused_at_its_header(tmp_path, sparse):
    if sparse == "gnu":  # an old GNU sparse header whose map goes on in extension blocks, one after another
        first = bytearray(_header("s", 0, tarfile.GNUTYPE_SPARSE, tarfile.GNU_FORMAT))
        first[482] = 1
        first[148:156] = b"%06o\0 " % (sum(first[:148]) + sum(first[156:]) + 8 * 32)
        data = bytes(first) + (b"\0" * 504 + b"\1").ljust(tarfile.BLOCKSIZE, b"\0") * 100
    else:  # a map (in the entry's data) that never ends its first number
        data = _header("s", 10 * tarfile.BLOCKSIZE, tarfile.REGTYPE, tarfile.PAX_FORMAT,
                       **{"GNU.sparse.major": "1", "GNU.sparse.minor": "0"}) + b"9" * 10 * tarfile.BLOCKSIZE
    assert "is a sparse file" in _extracted_or_refused(tmp_path, data + b"\0" * 1024)


def test_a_zip_whose_end_record_lists_one_entry_of_100000_is_refused_by_the_directory_size(tmp_path):
    entry = struct.pack("<4s4B4HL2L5H2L", b"PK\x01\x02", 20, 3, 20, *[0] * 15)  # 46 bytes, an empty name
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(entry) * 100_000, 0, 0)
    message = _extracted_or_refused(tmp_path, entry * 100_000 + end, extract_zip)
    assert "list of entries is 4600000 bytes" in message, message
