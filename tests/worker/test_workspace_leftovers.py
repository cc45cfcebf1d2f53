"""Half-made workspace folders — a worker SIGKILLed while it created a workspace — are removed by the next manager
that creates one, once older than ``HALF_MADE_SECONDS``, with their user ids; live workspaces, young folders (a
creation may be under way) and reservations nobody took are left alone.

Before, such a folder was never removed: nothing names it (its index link was never made), so no removal found it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from worker.workspaces.manager import HALF_MADE_SECONDS, METADATA_FILE, WorkspaceManager

REPO = Path(__file__).resolve().parents[2]
KILLED_WHILE_CREATING = """
import os, signal, sys
from worker.workspaces.manager import WorkspaceManager

work_root, workspace_id, when = sys.argv[1:]
real_symlink = os.symlink

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

def symlink(source, target, *args, **kwargs):
    if f"/.skillrun/workspaces/{workspace_id}" in str(target):
        die()
    return real_symlink(source, target, *args, **kwargs)

if when == "before its index link":
    os.symlink = symlink
else:
    WorkspaceManager._lay_out = die
WorkspaceManager(work_root).acquire(workspace_id)
"""
"""A worker creating a workspace, SIGKILLed at the step ``when`` names."""


def killed_while_creating(work_root: Path, workspace_id: str, when: str) -> Path:
    """The folder a worker killed while creating workspace ``workspace_id`` left."""
    child = subprocess.run([sys.executable, "-c", KILLED_WHILE_CREATING, str(work_root), workspace_id, when],
                           cwd=REPO, capture_output=True, text=True, timeout=60)
    assert child.returncode == -signal.SIGKILL, child.stderr
    [folder] = work_root.glob(f"ws_{workspace_id}_*")
    return folder


def age(folder: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(folder, (then, then))


def uid_holders(manager: WorkspaceManager) -> set[str]:
    """The folders the host's user-id registry says hold an id (a normal account's workspaces hold none, and the
    registry, root's, may be closed to it)."""
    registry = manager.user_ids.path
    if not registry.is_dir() or (os.geteuid() != 0 and not os.access(registry, os.R_OK | os.X_OK)):
        return set()
    return {os.readlink(e.path) for e in os.scandir(manager.user_ids.path) if e.is_symlink()}


@pytest.mark.parametrize("when", ["before its index link", "while laying it out"])
def test_a_workspace_folder_a_killed_worker_left_half_made_is_removed_and_live_ones_stay(work_root, when):
    live = WorkspaceManager(work_root).acquire("live")
    (live.work_dir / "notes.txt").write_text("kept across runs")
    idle = WorkspaceManager(work_root).reserve()  # a warm container's folder, not yet taken
    half_made = killed_while_creating(work_root, "victim", when)
    young = killed_while_creating(work_root, "young", when)  # as if its creation were still under way
    for folder in (live.path, idle.path, half_made):
        age(folder, HALF_MADE_SECONDS + 60)
    assert (half_made / METADATA_FILE).exists() == (when == "before its index link")

    manager = WorkspaceManager(work_root)
    manager.acquire("next")  # a manager's first acquire that goes to disk looks for half-made folders

    assert not half_made.exists()
    assert str(half_made) not in uid_holders(manager)
    assert young.exists() and idle.path.exists()
    found = manager.find("live")
    assert found is not None and found.path == live.path
    assert (found.work_dir / "notes.txt").read_text() == "kept across runs"
    assert manager.find("victim") is None
    again = manager.acquire("victim")  # the workspace can be made again, in a folder of its own
    assert again.path != half_made and again.path.is_dir()


def test_a_folder_whose_index_link_went_with_its_metadata_is_swept_too(work_root):
    manager = WorkspaceManager(work_root)
    broken = manager.acquire("broken")
    (broken.path / METADATA_FILE).unlink()  # cleaned up from outside, in part
    assert manager.find("broken") is None  # drops the index link: the folder is named by nothing now
    age(broken.path, HALF_MADE_SECONDS + 60)
    assert manager.sweep_half_made() == [broken.path]
    assert not broken.path.exists()
