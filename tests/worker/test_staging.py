"""Stagers: links or copies, read-only, cheap when unchanged, refusing unsafe libraries."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from worker.contract import SkillRef
from worker.errors import StagingError
from worker.workspaces.staging import CopySkillStager, LinkSkillStager
from worker.workspaces.manager import WorkspaceManager


@pytest.fixture
def workspace(work_root: Path):
    return WorkspaceManager(work_root).acquire("stage-test")


def _ref(library: Path) -> SkillRef:
    return SkillRef(name="demo", root=str(library), path="demo")


def test_link_stager_links_entries_instead_of_copying(workspace, library):
    staged = LinkSkillStager().stage(workspace, _ref(library))
    assert staged == workspace.skills_dir / "demo"
    assert os.path.islink(staged / "scripts")
    assert os.path.realpath(staged / "scripts") == str((library / "demo" / "scripts").resolve())
    assert (staged / "SKILL.md").read_text().startswith("---")


def test_link_stager_shows_library_edits_without_restaging(workspace, library):
    stager = LinkSkillStager()
    staged = stager.stage(workspace, _ref(library))
    (library / "demo" / "scripts" / "hello.sh").write_text("echo edited\n")
    assert (staged / "scripts" / "hello.sh").read_text() == "echo edited\n"


def test_copy_stager_copies_and_makes_the_copy_read_only(workspace, library):
    staged = CopySkillStager().stage(workspace, _ref(library))
    script = staged / "scripts" / "hello.sh"
    assert not os.path.islink(staged / "scripts")
    assert script.read_text().startswith("echo")
    assert not os.stat(script).st_mode & 0o222
    assert os.readlink(staged / "out") == "../../out"


def test_staging_an_unchanged_skill_again_rebuilds_nothing(workspace, library):
    stager = LinkSkillStager()
    staged = stager.stage(workspace, _ref(library))
    inode = os.stat(staged).st_ino
    stager.stage(workspace, _ref(library))
    LinkSkillStager().stage(workspace, _ref(library))  # a new stager reads the signature from metadata.json
    assert os.stat(staged).st_ino == inode


def test_adding_a_file_to_the_skill_restages_it(workspace, library):
    stager = LinkSkillStager()
    staged = stager.stage(workspace, _ref(library))
    (library / "demo" / "NEW.md").write_text("new doc")
    stager.stage(workspace, _ref(library))
    assert (staged / "NEW.md").read_text() == "new doc"


def test_a_settled_library_folder_is_checked_by_its_mtime_alone(workspace, library, monkeypatch):
    folder = library / "demo"
    an_hour_ago = os.stat(folder).st_mtime_ns - 3600 * 10**9
    os.utime(folder, ns=(an_hour_ago, an_hour_ago))
    stager = LinkSkillStager()
    staged = stager.stage(workspace, _ref(library))
    listed: list[str] = []
    real_listdir = os.listdir
    monkeypatch.setattr("worker.workspaces.staging.os.listdir", lambda path: listed.append(str(path)) or real_listdir(path))
    assert stager.current(workspace, _ref(library)) == staged
    assert listed == []
    (folder / "NEW.md").write_text("new doc")  # moves the folder's mtime
    assert stager.current(workspace, _ref(library)) is None
    assert (stager.stage(workspace, _ref(library)) / "NEW.md").read_text() == "new doc"


def test_an_entry_added_in_the_clock_tick_of_the_last_listing_is_still_noticed(workspace, library):
    folder = library / "demo"
    stager = LinkSkillStager()
    stager.stage(workspace, _ref(library))  # listed right after the fixture made the folder: not settled
    mtime = os.stat(folder).st_mtime_ns
    (folder / "NEW.md").write_text("new doc")
    os.utime(folder, ns=(mtime, mtime))  # as if the addition fell in the same tick: the mtime did not move
    assert stager.current(workspace, _ref(library)) is None
    assert (stager.stage(workspace, _ref(library)) / "NEW.md").read_text() == "new doc"


def test_copy_stager_restages_when_a_nested_file_changes(workspace, library):
    stager = CopySkillStager()
    staged = stager.stage(workspace, _ref(library))
    script = library / "demo" / "scripts" / "hello.sh"
    script.write_text("echo v2 with another length\n")
    stager.stage(workspace, _ref(library))
    assert (staged / "scripts" / "hello.sh").read_text() == "echo v2 with another length\n"


def test_skill_path_that_leaves_its_root_is_refused(workspace, library, shared_dir):
    write_skill(shared_dir, "elsewhere")
    with pytest.raises(StagingError, match="leaves the skills root"):
        LinkSkillStager().stage(workspace, SkillRef(name="elsewhere", root=str(library), path="../elsewhere"))


def test_folder_without_skill_md_is_refused(workspace, library):
    (library / "empty").mkdir()
    with pytest.raises(StagingError, match="no SKILL.md"):
        LinkSkillStager().stage(workspace, SkillRef(name="empty", root=str(library), path="empty"))


@pytest.mark.root
def test_world_writable_library_file_is_refused_when_commands_run_as_another_user(workspace, library):
    assert IS_ROOT and workspace.uid is not None
    target = library / "demo" / "scripts" / "hello.sh"
    target.chmod(0o666)
    with pytest.raises(StagingError, match="writable by everyone"):
        LinkSkillStager().stage(workspace, _ref(library))
    assert not (workspace.skills_dir / "demo").exists()
    assert [p.name for p in workspace.skills_dir.iterdir()] == []


@pytest.fixture
def private_library(shared_dir: Path) -> Path:
    """A library under a folder the workspace users cannot enter."""
    private = shared_dir / "private"
    private.mkdir(mode=0o700)
    private.chmod(0o700)
    write_skill(private, "demo", files={"scripts/hello.sh": "echo hi\n"})
    return private


@pytest.mark.root
def test_library_the_workspace_user_cannot_reach_is_copied(workspace, private_library):
    private = private_library
    staged = LinkSkillStager().stage(workspace, SkillRef(name="demo", root=str(private), path="demo"))
    assert not os.path.islink(staged / "scripts")
    assert (staged / "scripts" / "hello.sh").read_text() == "echo hi\n"
    with pytest.raises(StagingError, match="cannot read"):
        LinkSkillStager(fallback_to_copy=False).stage(
            WorkspaceManager(workspace.path.parent).acquire("other"), SkillRef(name="demo", root=str(private), path="demo")
        )


@pytest.mark.root
def test_a_copied_library_is_restaged_when_a_nested_file_changes(workspace, private_library):
    private = private_library
    ref = SkillRef(name="demo", root=str(private), path="demo")
    stager = LinkSkillStager()
    staged = stager.stage(workspace, ref)
    assert stager.current(workspace, ref) is None  # a copy is checked file by file: not on the quick path
    assert stager.stage(workspace, ref) == staged
    script = private / "demo" / "scripts" / "hello.sh"
    script.write_text("echo edited\n")
    later = os.stat(script).st_mtime_ns + 5 * 10**9
    os.utime(script, ns=(later, later))
    assert (stager.stage(workspace, ref) / "scripts" / "hello.sh").read_text() == "echo edited\n"


def test_skill_removed_from_its_root_after_staging_is_a_clear_error(workspace, library):
    stager = LinkSkillStager()
    stager.stage(workspace, _ref(library))
    shutil.rmtree(library / "demo")
    with pytest.raises(StagingError, match="is gone from its skills root"):
        stager.stage(workspace, _ref(library))
