"""The Cube runtime's ``remove_workspace`` against the E2B stand-in: a workspace's own sandbox is killed (also by a
process that never used it), a workspace in a shared sandbox loses its folder, and one-off runs leave nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.code_executors.cube import CubeCodeExecutor
from orchestrator.dispatch import InlineDispatcher
from tests.integration.conftest import cube_config
from worker.contract import RunRequest, SkillRef
from worker.runtimes.cube import CubeWorkspaceRuntime

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
SKILL = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")


@pytest.fixture
async def cube_runtime_factory(cube_runtime_factory):
    yield cube_runtime_factory
    for runtime in cube_runtime_factory.made:
        await runtime.close()


async def test_a_workspaces_own_sandbox_is_killed_by_whichever_process_removes_it(
    cube_runtime_factory, cube_standin, shared_dir
):
    runtime = cube_runtime_factory()
    await runtime.run(RunRequest(skill=SKILL, workspace_id="mine", command="echo x > $WORK_DIR/x"))
    await runtime.run(RunRequest(skill=SKILL, workspace_id="theirs", command="true"))
    mine = (await runtime.executor_for("mine")).sandbox_id
    theirs = (await runtime.executor_for("theirs")).sandbox_id
    await runtime.remove_workspace("mine")
    assert mine not in cube_standin.sandboxes and theirs in cube_standin.sandboxes

    elsewhere = CubeWorkspaceRuntime(config=runtime.config, work_root=shared_dir / "elsewhere",
                                     workspace_cfg=runtime.workspace_cfg)  # another worker: found by metadata
    await elsewhere.remove_workspace("theirs")
    assert theirs not in cube_standin.sandboxes
    await elsewhere.remove_workspace("never-made")  # nothing to remove: nothing happens
    await elsewhere.close()

    again = await runtime.run(RunRequest(skill=SKILL, workspace_id="mine", command="true"))
    assert again.exit_code == 0 and (await runtime.executor_for("mine")).sandbox_id != mine  # in a new sandbox


async def test_a_workspace_in_a_shared_sandbox_loses_its_folder_only(cube_runtime_factory, cube_standin):
    executor = await CubeCodeExecutor.create(cube_config(cube_standin))
    runtime = cube_runtime_factory(executor)
    for name in ("one", "two"):
        await runtime.run(RunRequest(skill=SKILL, workspace_id=name, command="echo x > $WORK_DIR/x"))
    assert Path(runtime.workspace_path("one"), "work", "x").exists()
    await runtime.remove_workspace("one")
    assert not Path(runtime.workspace_path("one")).exists()
    assert Path(runtime.workspace_path("two"), "work", "x").exists()
    assert executor.sandbox_id in cube_standin.sandboxes
    again = await runtime.run(RunRequest(skill=SKILL, workspace_id="one", command="ls $WORK_DIR"))
    assert again.exit_code == 0 and again.stdout == "inputs\n"  # made again, empty
    await executor.close()


async def test_one_off_runs_leave_no_sandbox(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory()
    before = set(cube_standin.sandboxes)
    async with InlineDispatcher({"cube": runtime}) as dispatcher:
        result = await dispatcher.run(RunRequest(skill=SKILL, command="echo hi", runtime="cube"))
        assert result.stdout == "hi\n"
        kept = await dispatcher.run(RunRequest(skill=SKILL, command="true", runtime="cube", workspace_id="kept"))
        assert kept.exit_code == 0
    assert set(cube_standin.sandboxes) - before == {(await runtime.executor_for("kept")).sandbox_id}
