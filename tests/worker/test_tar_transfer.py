"""Archives to and from a remote sandbox: what goes up keeps modes and links; what comes down from an untrusted
machine is laid out beneath the mirror and nowhere else."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path, PurePosixPath

import pytest

from worker.errors import UnsafeArchiveError
from worker.workspaces.tar_transfer import SIZES_MEMBER, UploadArchive, extract_mirror

REMOTE = "/workspace/cube_agent/ws_a_1234"


def archive(*entries: tuple[str, str, bytes | str]) -> bytes:
    """A tar of (type, name, data-or-link-target) entries: type is f, d, l (symlink), h (hardlink) or p (FIFO)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for kind, name, payload in entries:
            info = tarfile.TarInfo(name)
            if kind == "f":
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
                continue
            info.type = {"d": tarfile.DIRTYPE, "l": tarfile.SYMTYPE, "h": tarfile.LNKTYPE, "p": tarfile.FIFOTYPE}[kind]
            info.linkname = payload if isinstance(payload, str) else ""
            tar.addfile(info)
    return buffer.getvalue()


def extract(data: bytes, mirror: Path, **limits) -> dict[str, int]:
    options = {"remote_root": REMOTE, "max_members": 100, "max_bytes": 10_000, **limits}
    return extract_mirror(data, mirror, **options)


def test_an_upload_keeps_modes_links_and_the_workspace_links(tmp_path):
    skill = tmp_path / "demo"
    (skill / "scripts").mkdir(parents=True)
    (skill / "SKILL.md").write_text("---\nname: demo\n---\n")
    (skill / "scripts" / "run.sh").write_text("echo hi\n")
    (skill / "scripts" / "run.sh").chmod(0o755)
    os.symlink("SKILL.md", skill / "README.md")
    os.symlink("/elsewhere", skill / "out")  # a skill's own "out" never replaces the workspace link
    (skill / "work").mkdir()
    (skill / "work" / "planted.txt").write_text("x")  # nor does its own "work" folder, or what is in it
    upload = UploadArchive()
    upload.add_skill(skill, "demo")
    upload.add_input(PurePosixPath("sub/n.txt"), b"123", 3)
    with tarfile.open(fileobj=io.BytesIO(upload.getvalue())) as tar:
        members = {m.name: m for m in tar}
    assert stat.S_IMODE(members["skills/demo/scripts/run.sh"].mode) == 0o555
    assert stat.S_IMODE(members["skills/demo/SKILL.md"].mode) == 0o444
    assert members["skills/demo/README.md"].linkname == "SKILL.md"
    assert {n: members[n].linkname for n in ("skills/demo/out", "skills/demo/work", "skills/demo/inputs")} == {
        "skills/demo/out": "../../out",
        "skills/demo/work": "../../work",
        "skills/demo/inputs": "../../work/inputs",
    }
    assert members["work/inputs/sub/n.txt"].size == 3 and members["work/inputs/sub"].isdir()
    assert not [name for name in members if name.startswith("skills/demo/work/")]


def test_files_links_fifos_and_true_sizes_are_laid_out(tmp_path):
    data = archive(
        ("f", "out/a.txt", b"head"),
        ("l", "out/in", f"{REMOTE}/out/a.txt"),
        ("l", "out/etc", "/etc/passwd"),
        ("p", "out/pipe", b""),
        ("f", SIZES_MEMBER, b"out/a.txt\x0050000\x00"),
    )
    true_sizes = extract(data, tmp_path)
    assert (tmp_path / "out/a.txt").read_bytes() == b"head"
    assert os.readlink(tmp_path / "out/in") == f"{tmp_path}/out/a.txt"  # into the remote workspace: into the mirror
    assert os.readlink(tmp_path / "out/etc") == "/etc/passwd"  # left as it is, for collection to refuse
    assert stat.S_ISFIFO(os.lstat(tmp_path / "out/pipe").st_mode)
    assert true_sizes == {str(tmp_path / "out/a.txt"): 50000}


@pytest.mark.parametrize("name", ["/etc/cron.d/x", "../escape", "out/../../escape"])
def test_unsafe_names_are_refused(tmp_path, name):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    with pytest.raises(UnsafeArchiveError, match="unsafe name"):
        extract(archive(("f", name, b"x")), mirror)
    assert not (tmp_path / "escape").exists()


def test_nothing_is_written_through_a_link(tmp_path):
    mirror, outside = tmp_path / "mirror", tmp_path / "outside"
    mirror.mkdir()
    outside.mkdir()
    extract(
        archive(
            ("l", "out", str(outside)),
            ("f", "out/planted", b"x"),
            ("l", "work", "../outside"),
            ("d", "work/sub", b""),
            ("f", "work/sub/y", b"y"),
        ),
        mirror,
    )
    assert os.listdir(outside) == []


def test_the_first_entry_of_a_name_wins_and_hardlinks_are_ignored(tmp_path):
    extract(archive(("f", "out/a", b"first"), ("f", "out/a", b"second"), ("h", "out/b", "out/a")), tmp_path)
    assert (tmp_path / "out/a").read_bytes() == b"first" and not (tmp_path / "out/b").exists()


def test_count_and_byte_limits_hold(tmp_path):
    with pytest.raises(UnsafeArchiveError, match="more than 2 output entries"):
        extract(archive(*[("f", f"out/{i}", b"x") for i in range(3)]), tmp_path, max_members=2)
    with pytest.raises(UnsafeArchiveError, match="more than 5 bytes"):
        extract(archive(("f", "work/a", b"123"), ("f", "work/b", b"456")), tmp_path, max_bytes=5)


def test_garbage_is_an_unreadable_archive(tmp_path):
    with pytest.raises(UnsafeArchiveError, match="unreadable"):
        extract(b"not a tar at all" * 100, tmp_path)


def test_deep_names_and_bad_sizes_are_refused(tmp_path):
    with pytest.raises(UnsafeArchiveError, match="more than 64 folders deep"):
        extract(archive(("f", "out/" + "d/" * 70 + "x", b"x")), tmp_path)
    with pytest.raises(UnsafeArchiveError, match="not a number"):
        extract(archive(("f", SIZES_MEMBER, b"out/a\x00lots\x00")), tmp_path)
    with pytest.raises(UnsafeArchiveError, match="unsafe name"):
        extract(archive(("f", SIZES_MEMBER, b"/etc/passwd\x0012\x00")), tmp_path)
