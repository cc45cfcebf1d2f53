"""The Cube runtime's ``remove_workspace`` against the E2B stand-in: a workspace's own sandbox is killed (also by a
process that never used it), a workspace in a shared sandbox loses its folder, and one-off runs leave nothing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.code_executors.cube import CubeCodeExecutor
from orchestrator.dispatch import InlineDispatcher, QueueDispatcher
from tests.conftest import IS_ROOT
from tests.integration.conftest import cube_config
from tests.services import unavailable
from worker.contract import RunRequest, SkillRef
from worker.errors import RuntimeUnavailableError
from worker.jobs.execute import remove_one_off_workspace
from worker.runtimes.cube.runtime import WORKSPACE_LABEL, CubeWorkspaceRuntime
from worker.runtimes.cube.executor import KILL_ATTEMPTS

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "skills"
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
    needs_a_sandbox_root()
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


def needs_a_sandbox_root() -> None:
    """A workspace's folder in a shared sandbox is removed by the sandbox's root, staged skill (read-only) and all;
    the stand-in's root is root only when the tests run as root."""
    if not IS_ROOT:
        unavailable("removing a workspace's folder from a shared sandbox needs the stand-in's root to be root: "
                    "run the suite as root (sudo bash .ci/test)")


ONE_OFF_RUNS = 3


def _burst(redis_url: str, env: dict[str, str]) -> None:
    """Drain the cube queue with a worker process that exits once the queue is empty."""
    subprocess.run([sys.executable, "-m", "worker", "--redis-url", redis_url, "--burst", "--runtime", "cube"],
                   env={**os.environ, **env}, cwd=REPO, check=True, timeout=120)


@pytest.mark.parametrize("path", ["inline", "queued"])
@pytest.mark.parametrize("sandboxes", ["own", "named"])
async def test_one_off_workspaces_are_removed_once_their_results_are_stored_and_a_kept_one_stays(
        cube_runtime_factory, cube_standin, request, sandboxes, path):
    """Each workspace in a sandbox of its own (killed), or all in the one ``CUBE_SANDBOX_ID`` names (their folders
    removed, the sandbox kept: it is not the runtime's), through the inline dispatcher and through a worker."""
    if sandboxes == "named":  # folders removed in a sandbox that stays
        needs_a_sandbox_root()
    named = await CubeCodeExecutor.create(cube_config(cube_standin)) if sandboxes == "named" else None
    config = {"sandbox_id": named.sandbox_id} if named is not None else {}
    runtime = cube_runtime_factory(**config)
    remote = Path(runtime.workspace_cfg.root)
    requests = [RunRequest(skill=SKILL, command="echo hi > $WORK_DIR/left", runtime="cube")
                for _ in range(ONE_OFF_RUNS)] + [RunRequest(skill=SKILL, command="true", runtime="cube",
                                                            workspace_id="kept")]
    if path == "inline":
        async with InlineDispatcher({"cube": runtime}) as dispatcher:
            results = [await dispatcher.run(one) for one in requests]
    else:
        env = {**request.getfixturevalue("worker_env"), "E2B_API_URL": cube_standin.url,
               "E2B_SANDBOX_URL": cube_standin.url, "E2B_API_KEY": cube_standin.api_key, "CUBE_ROOT": str(remote),
               **({"CUBE_SANDBOX_ID": named.sandbox_id} if named is not None else {})}
        redis_url = request.getfixturevalue("redis_url")
        dispatcher = QueueDispatcher(redis_url)
        records = [await dispatcher.submit(one) for one in requests]
        await asyncio.to_thread(_burst, redis_url, env)
        results = [(await dispatcher.wait(record.id, 5)).result for record in records]
        await dispatcher.close()
    assert [result.exit_code for result in results] == [0] * (ONE_OFF_RUNS + 1)
    one_offs = {result.workspace_id for result in results[:ONE_OFF_RUNS]}
    held = {s.metadata.get(WORKSPACE_LABEL) for s in cube_standin.sandboxes.values()}
    folders = {p.name.rsplit("_", 1)[0].removeprefix("ws_") for p in remote.iterdir() if p.name.startswith("ws_")}
    if named is None:  # killed with their workspaces, whose folders a real sandbox takes along
        assert not one_offs & held and "kept" in held
    else:
        assert not one_offs & folders and "kept" in folders and named.sandbox_id in cube_standin.sandboxes
        await named.close()


async def test_a_kill_the_service_refuses_is_asked_again_and_then_reported(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory()
    first, second = (RunRequest(skill=SKILL, command="true", runtime="cube") for _ in range(2))
    for one in (first, second):
        assert (await runtime.run(one)).exit_code == 0
    sandboxes = [(await runtime.executor_for(one.workspace_id)).sandbox_id for one in (first, second)]
    cube_standin.fail_api(500)  # the next call, the kill
    await remove_one_off_workspace(runtime, first)
    assert sandboxes[0] not in cube_standin.sandboxes
    cube_standin.fail_api(500, times=KILL_ATTEMPTS)
    with pytest.raises(RuntimeUnavailableError, match="killing the sandbox.*told to fail with 500"):
        await runtime.remove_workspace(second.workspace_id)
    assert sandboxes[1] in cube_standin.sandboxes  # still there, and said so (the fixture removes it)
