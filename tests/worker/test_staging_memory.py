"""A stager's memory of what it staged where is bounded: workspaces come and go (one per one-off run), and a
forgotten workspace's skill is found staged again from its metadata."""

from __future__ import annotations

from pathlib import Path

from worker import staging
from worker.contract import SkillRef
from worker.staging import LinkSkillStager
from worker.workspace import WorkspaceManager


def test_a_stager_remembers_the_latest_workspaces_only(work_root: Path, library: Path, monkeypatch):
    monkeypatch.setattr(staging, "MAX_REMEMBERED_SIGNATURES", 3)
    manager = WorkspaceManager(work_root)
    stager = LinkSkillStager()
    ref = SkillRef(name="demo", root=str(library), path="demo")
    workspaces = [manager.acquire(f"w{i}") for i in range(5)]
    for workspace in workspaces:
        stager.stage(workspace, ref)
    assert [path for path, _ in stager._signatures] == [w.path for w in workspaces[-3:]]
    assert stager.current(workspaces[0], ref) is None  # forgotten: staging looks at the workspace again
    assert stager.stage(workspaces[0], ref) == workspaces[0].skills_dir / "demo"
