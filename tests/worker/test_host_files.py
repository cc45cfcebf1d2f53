"""``WorkspaceFiles``: a host workspace's files read and written from this process — the plain case served, and
everything else declined (``None``/``False``) with nothing changed, for a run to answer."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.services import unavailable
from worker.runtimes.host_files import FILE_MODE, WorkspaceFiles

OTHER_UID = 4242


@pytest.fixture
def as_root() -> None:
    if os.geteuid() != 0:
        unavailable("owners other than this user need root: run the suite as root")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "data.txt").write_bytes(b"hello\n")
    return tmp_path


def test_a_plain_file_is_read_and_written_and_appended(root):
    files = WorkspaceFiles(root)
    assert files.read("work/data.txt", 100) == b"hello\n"
    assert files.write("work/data.txt", b"new\n") and (root / "work/data.txt").read_bytes() == b"new\n"
    assert files.write("work/data.txt", b"more\n", append=True)
    assert (root / "work/data.txt").read_bytes() == b"new\nmore\n"
    assert files.write("made.txt", b"x") and stat.S_IMODE((root / "made.txt").stat().st_mode) == FILE_MODE


def test_a_file_past_the_limit_or_missing_is_declined(root):
    files = WorkspaceFiles(root)
    assert files.read("work/data.txt", 5) is None
    assert files.read("work/missing.txt", 100) is None
    assert not files.write("work/new/deeper.txt", b"x") and not (root / "work/new").exists()


@pytest.mark.parametrize("path", ["", ".", "..", "../x", "work/../../x", "work/.."])
def test_a_path_that_is_not_plainly_inside_is_declined(root, path):
    files = WorkspaceFiles(root)
    assert files.read(path, 100) is None
    assert not files.write(path, b"x")


def test_a_link_anywhere_on_the_path_is_never_followed(root, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret.txt").write_bytes(b"host secret\n")
    (root / "work" / "out-dir").symlink_to(outside)
    (root / "work" / "out-file").symlink_to(outside / "secret.txt")
    (root / "work" / "in-file").symlink_to("data.txt")  # inside, yet a link: a run resolves it
    (root / "in-dir").symlink_to("work")
    files = WorkspaceFiles(root)
    for path in ("work/out-dir/secret.txt", "work/out-file", "work/in-file", "in-dir/data.txt"):
        assert files.read(path, 100) is None, path
        assert not files.write(path, b"planted"), path
    assert (outside / "secret.txt").read_bytes() == b"host secret\n"
    assert (root / "work" / "data.txt").read_bytes() == b"hello\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


def test_a_fifo_a_folder_and_a_file_with_two_names_are_declined_without_waiting(root):
    os.mkfifo(root / "work" / "pipe")
    os.link(root / "work" / "data.txt", root / "work" / "twin.txt")
    files = WorkspaceFiles(root)
    for path in ("work/pipe", "work", "work/twin.txt"):
        assert files.read(path, 100) is None, path
        assert not files.write(path, b"x"), path
    assert (root / "work" / "data.txt").read_bytes() == b"hello\n"


def test_what_is_made_belongs_to_the_workspaces_user(root, as_root):
    for folder in (root, root / "work"):
        os.chown(folder, OTHER_UID, OTHER_UID)
    os.chown(root / "work" / "data.txt", OTHER_UID, OTHER_UID)
    files = WorkspaceFiles(root, OTHER_UID, OTHER_UID)
    assert files.write("work/made.txt", b"x") and files.write("top.txt", b"y")
    for made in (root / "work" / "made.txt", root / "top.txt"):
        assert (made.stat().st_uid, made.stat().st_gid) == (OTHER_UID, OTHER_UID)
    assert files.read("work/data.txt", 100) == b"hello\n"


def test_what_the_workspaces_user_does_not_own_is_declined_and_left_alone(root, as_root):
    os.chown(root, OTHER_UID, OTHER_UID)
    (root / "work" / "theirs.txt").write_bytes(b"root's\n")
    (root / "mine.txt").write_bytes(b"read-only\n")
    os.chown(root / "mine.txt", OTHER_UID, OTHER_UID)
    (root / "mine.txt").chmod(0o444)
    files = WorkspaceFiles(root, OTHER_UID, OTHER_UID)  # work/ and what is in it are root's
    assert files.read("work/data.txt", 100) is None
    assert not files.write("work/data.txt", b"x") and not files.write("work/new.txt", b"x")
    assert not files.write("mine.txt", b"x")  # owned, but not writable by its owner
    assert (root / "work" / "data.txt").read_bytes() == b"hello\n" and not (root / "work" / "new.txt").exists()
    assert (root / "mine.txt").read_bytes() == b"read-only\n"
