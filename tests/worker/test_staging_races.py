"""Stagers staging one skill into one workspace at the same moment — two threads with stagers of their own, two
processes — both succeed, and what is in place afterwards is a whole staged skill with nothing left beside it.

Before, the folder being built was named by the process id: two stagers of one process built into the same folder
(one removed the other's) and wrote ``metadata.json`` through the same temporary file, and two processes raced on
the rename into place (the second failed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from worker.contract import SkillRef
from worker.workspaces.staging import WORKSPACE_LINKS, CopySkillStager
from worker.workspaces.manager import Workspace, WorkspaceManager

REPO = Path(__file__).resolve().parents[2]
MEETING_SECONDS = 10.0
"""How long a stager waits for the others to reach the end of their build (they meet there, then all rename)."""
CHILD = """
import os, sys, time
from pathlib import Path
from worker.contract import SkillRef
from worker.workspaces.staging import CopySkillStager
from worker.workspaces.manager import WorkspaceManager

work_root, library, meeting, me, count, seconds = sys.argv[1:]
rename, renamed = os.rename, []

def meet_then_rename(source, target):
    if not renamed:  # the stager's first rename: wait here until every process has built its folder
        Path(meeting, me).touch()
        deadline = time.monotonic() + float(seconds)
        while len(os.listdir(meeting)) < int(count) and time.monotonic() < deadline:
            time.sleep(0.0005)
    renamed.append(target)
    rename(source, target)

os.rename = meet_then_rename
workspace = WorkspaceManager(work_root).find("raced")
CopySkillStager().stage(workspace, SkillRef(name="demo", root=library, path="demo"))
"""
"""A process staging the demo skill, meeting the others at its first rename (all of them built, none placed)."""


class _Meeting(CopySkillStager):
    """A copying stager that waits, once its folder is built, until every stager of the barrier has built its own."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier

    def _fill(self, workspace: Workspace, source: Path, staging: Path) -> None:
        super()._fill(workspace, source, staging)
        self.barrier.wait(timeout=MEETING_SECONDS)


def _ref(library: Path) -> SkillRef:
    return SkillRef(name="demo", root=str(library), path="demo")


def _files(top: Path) -> dict[str, bytes]:
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file() and not p.is_symlink()}


def assert_whole(workspace: Workspace, library: Path) -> None:
    """The staged skill is the library's, file for file, with its links; nothing else is in ``skills/``."""
    staged = workspace.skills_dir / "demo"
    assert _files(staged) == _files(library / "demo")
    assert {name: os.readlink(staged / name) for name in WORKSPACE_LINKS} == WORKSPACE_LINKS
    assert sorted(p.name for p in workspace.skills_dir.iterdir()) == ["demo"]


def stage_at_once(stagers: list[CopySkillStager], workspace: Workspace, library: Path) -> list[object]:
    """What each stager's ``stage`` returned (or raised), all started together, each in a thread."""
    outcomes: list[object] = [None] * len(stagers)

    def stage(i: int) -> None:
        try:
            outcomes[i] = stagers[i].stage(workspace, _ref(library))
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outcomes[i] = exc

    threads = [threading.Thread(target=stage, args=(i,)) for i in range(len(stagers))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=2 * MEETING_SECONDS)
    return outcomes


def test_two_threads_staging_one_skill_at_once_both_succeed_with_a_whole_staged_skill(work_root, library):
    workspace = WorkspaceManager(work_root).acquire("raced")
    for round_ in range(5):  # the first into an empty skills/, then each over the one staged before
        (library / "demo" / "round.txt").write_text(f"round {round_}\n" * (round_ + 1))
        barrier = threading.Barrier(2)
        stagers = [_Meeting(barrier), _Meeting(barrier)]  # of their own: no lock of one stager serialises them
        assert stage_at_once(stagers, workspace, library) == [workspace.skills_dir / "demo"] * 2
        assert_whole(workspace, library)


def test_two_processes_staging_one_skill_at_once_both_succeed_with_a_whole_staged_skill(work_root, library, tmp_path):
    workspace = WorkspaceManager(work_root).acquire("raced")
    for round_ in range(2):  # into an empty skills/, then over the one staged before
        (library / "demo" / "round.txt").write_text(f"round {round_}\n" * (round_ + 1))
        meeting = tmp_path / f"meeting-{round_}"
        meeting.mkdir()
        children = [
            subprocess.Popen([sys.executable, "-c", CHILD, str(work_root), str(library), str(meeting), str(i), "2",
                              str(MEETING_SECONDS)], cwd=REPO, stderr=subprocess.PIPE, text=True)
            for i in range(2)
        ]
        errors = [child.communicate(timeout=3 * MEETING_SECONDS)[1] for child in children]
        assert [child.returncode for child in children] == [0, 0], errors
        assert_whole(workspace, library)
