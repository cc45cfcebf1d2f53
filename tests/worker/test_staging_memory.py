"""What a runtime and its stager remember about workspaces is bounded and ends with the workspace: workspaces come
and go (one per one-off run), a removed one is forgotten at once, and a forgotten workspace's skill is found staged
again from its metadata."""

from __future__ import annotations

from pathlib import Path

from worker.workspaces import staging
from worker.contract import RunRequest, SkillRef
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.workspaces.staging import LinkSkillStager
from worker.workspaces.manager import WorkspaceManager


def test_a_stager_remembers_the_latest_workspaces_only(work_root: Path, library: Path, monkeypatch):
    monkeypatch.setattr(staging, "MAX_REMEMBERED_WORKSPACES", 3)
    manager = WorkspaceManager(work_root)
    stager = LinkSkillStager()
    ref = SkillRef(name="demo", root=str(library), path="demo")
    workspaces = [manager.acquire(f"w{i}") for i in range(5)]
    for workspace in workspaces:
        stager.stage(workspace, ref)
    assert list(stager._signatures) == [str(w.path) for w in workspaces[-3:]]
    assert stager.current(workspaces[0], ref) is None  # forgotten: staging looks at the workspace again
    assert stager.stage(workspaces[0], ref) == workspaces[0].skills_dir / "demo"


def test_a_forgotten_workspace_is_staged_from_its_metadata_again(work_root: Path, library: Path):
    stager = LinkSkillStager()
    ref = SkillRef(name="demo", root=str(library), path="demo")
    workspace = WorkspaceManager(work_root).acquire("w")
    staged = stager.stage(workspace, ref)
    stager.forget(workspace)
    assert stager._signatures == {} and stager.current(workspace, ref) is None
    assert stager.stage(workspace, ref) == staged


async def test_removed_workspaces_leave_nothing_in_the_runtimes_memory(work_root: Path, library: Path):
    # A soak found each one-off run leaving ~0.9 KB here (until 4,096 workspaces were remembered).
    runtime = LocalWorkspaceRuntime(work_root / "rt")
    ref = SkillRef(name="demo", root=str(library), path="demo")
    try:
        for n in range(5):
            result = await runtime.run(RunRequest(skill=ref, command="true", workspace_id=f"gone-{n}"))
            assert result.exit_code == 0, result.stderr
            await runtime.end_workspace(f"gone-{n}")
        assert runtime._seen == {} and runtime.stager._signatures == {}
    finally:
        await runtime.close()
