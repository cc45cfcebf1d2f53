"""The Cube runtime against the E2B stand-in: sandboxes per workspace and shared with an executor, transfers,
timeouts, cancellation, and each failure of the remote side as a clear error."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.code_executors.cube import CubeCodeExecutor, create_cube_workspace_runtime
from tests.conftest import write_skill
from tests.integration.conftest import cube_config, cube_remote_root
from worker.config import CubeWorkspaceConfig
from worker.contract import RunLimits, RunRequest, SkillRef
from worker.errors import RuntimeUnavailableError, StagingError, UnsafeArchiveError
from worker.roots.folders import remove_tree

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
SKILL = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")


@pytest.fixture
async def cube_runtime_factory(cube_runtime_factory):
    """The shared factory, whose runtimes are closed on this test's loop (their clean-up in the sandbox done)."""
    yield cube_runtime_factory
    for runtime in cube_runtime_factory.made:
        await runtime.close()


def running(marker: str) -> list[int]:
    """Processes on this machine (where the stand-in runs sandbox commands) whose command line holds ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def mirrors_left(runtime) -> list[str]:
    parent = runtime.local_root / ".skillrun" / "cube-mirrors"
    return os.listdir(parent) if parent.exists() else []


async def test_a_workspace_keeps_its_sandbox_and_others_get_their_own(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory()
    first = await runtime.run(RunRequest(skill=SKILL, workspace_id="a", command="echo 1 > $WORK_DIR/n"))
    second = await runtime.run(RunRequest(skill=SKILL, workspace_id="a", command="cat $WORK_DIR/n"))
    other = await runtime.run(RunRequest(skill=SKILL, workspace_id="b", command="cat $WORK_DIR/n"))
    assert (first.exit_code, second.stdout) == (0, "1\n")
    assert other.exit_code != 0  # another workspace, another sandbox: nothing of "a" is there
    a, b = (await runtime.executor_for("a")).sandbox_id, (await runtime.executor_for("b")).sandbox_id
    assert a != b and {a, b} <= set(cube_standin.sandboxes)
    assert cube_standin.sandboxes[a].metadata["skillrun.workspace"] == "a"
    assert mirrors_left(runtime) == []


async def test_another_worker_finds_the_workspace_sandbox_by_its_metadata(
    cube_runtime_factory, cube_standin, shared_dir
):
    mine = cube_runtime_factory()
    await mine.run(RunRequest(skill=SKILL, workspace_id="shared", command="echo from-one > $WORK_DIR/note"))
    theirs = create_cube_workspace_runtime(
        config=mine.config, workspace_cfg=mine.workspace_cfg, work_root=shared_dir / "w2"
    )
    result = await theirs.run(RunRequest(skill=SKILL, workspace_id="shared", command="cat $WORK_DIR/note"))
    assert result.stdout == "from-one\n"
    assert (await theirs.executor_for("shared")).sandbox_id == (await mine.executor_for("shared")).sandbox_id
    await theirs.close()


async def test_a_workspace_removed_from_outside_is_made_again(cube_runtime_factory):
    runtime = cube_runtime_factory()
    await runtime.run(RunRequest(skill=SKILL, workspace_id="gone", command="true"))
    remove_tree(Path(runtime.workspace_path("gone")))  # read-only staged skill: rmtree does only as root
    result = await runtime.run(RunRequest(skill=SKILL, workspace_id="gone", command="python3 scripts/fib.py 5"))
    assert (result.exit_code, result.stdout.split()) == (0, ["0", "1", "1", "2", "3"])
    assert Path(runtime.workspace_path("gone")).name.startswith("ws_gone_")


async def test_one_sandbox_serves_the_executor_and_the_workspace_runtime(cube_standin, shared_dir):
    before = set(cube_standin.sandboxes)
    executor = await CubeCodeExecutor.create(cube_config(cube_standin, execute_timeout=5))
    try:
        runtime = create_cube_workspace_runtime(
            executor,
            workspace_cfg=CubeWorkspaceConfig(root=str(cube_remote_root(shared_dir, "remote", cube_standin))),
            work_root=shared_dir / "local",
        )
        code = await executor.execute_code("import sys; print(sum(range(10))); sys.exit(2)")
        run = await runtime.run(RunRequest(skill=SKILL, workspace_id="w", command="python3 scripts/fib.py 3"))
        slow = await executor.execute_code("sleep 30", language="bash", timeout=1)
        assert (code.stdout, code.exit_code) == ("45\n", 2)
        assert run.stdout.split() == ["0", "1", "1"]
        assert (slow.timed_out, slow.exit_code) == (True, 124)
        assert set(cube_standin.sandboxes) - before == {executor.sandbox_id}
        await runtime.close()
        assert executor.sandbox_id in cube_standin.sandboxes  # the executor's sandbox is the executor's to close
    finally:
        await executor.close()
    assert executor.sandbox_id not in cube_standin.sandboxes


async def test_execute_timeout_bounds_every_command_and_kills_it(cube_runtime_factory):
    runtime = cube_runtime_factory(execute_timeout=1)
    result = await runtime.run(
        RunRequest(skill=SKILL, workspace_id="t", command="sleep 47.25 & sleep 47.5", timeout=60)
    )
    assert (result.timed_out, result.exit_code) == (True, 124)
    assert running("47.25") == [] and running("47.5") == []


async def test_a_cancelled_run_stops_its_command(cube_runtime_factory):
    runtime = cube_runtime_factory()
    request = RunRequest(skill=SKILL, workspace_id="c", command="sleep 48.5", timeout=60)
    task = asyncio.create_task(runtime.run(request))
    while not running("48.5"):
        await asyncio.sleep(0.02)
    assert runtime.cancel(request.run_id)
    result = await task
    assert "cancelled" in result.stderr and not result.timed_out
    assert running("48.5") == []
    assert runtime.cancel(request.run_id) is False


async def test_an_awaiting_caller_that_gives_up_ends_the_command_in_the_sandbox(cube_runtime_factory):
    runtime = cube_runtime_factory()
    task = asyncio.create_task(runtime.run(RunRequest(skill=SKILL, workspace_id="c", command="sleep 48.6", timeout=60)))
    while not running("48.6"):
        await asyncio.sleep(0.02)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert running("48.6") == []


async def test_idle_and_closed_workspaces_lose_their_sandboxes(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory(idle_seconds=0.2)
    await runtime.run(RunRequest(skill=SKILL, workspace_id="idle", command="true"))
    idle = (await runtime.executor_for("idle")).sandbox_id
    await asyncio.sleep(0.3)
    await runtime.run(RunRequest(skill=SKILL, workspace_id="busy", command="true"))
    assert idle not in cube_standin.sandboxes
    busy = (await runtime.executor_for("busy")).sandbox_id
    await runtime.close_workspace("busy")
    assert busy not in cube_standin.sandboxes


async def test_uploads_keep_modes_and_symlinks_and_only_output_heads_come_down(
    cube_runtime_factory, cube_standin, shared_dir
):
    root = shared_dir / "lib"
    skill_dir = write_skill(root, "tools", files={"scripts/run.sh": "echo ran\n", "docs/USAGE.md": "use it\n"})
    (skill_dir / "scripts" / "run.sh").chmod(0o755)
    os.symlink("docs/USAGE.md", skill_dir / "usage.md")
    runtime = cube_runtime_factory()
    before = cube_standin.downloaded_bytes
    result = await runtime.run(
        RunRequest(
            skill=SkillRef(name="tools", root=str(root), path="tools"),
            workspace_id="modes",
            command="./scripts/run.sh; readlink usage.md; cat usage.md; truncate -s 50M out/huge.bin; ln -s huge.bin out/alias",
            output_files=["out/*"],
            limits=RunLimits(output_file_bytes=1000),
        )
    )
    assert result.stdout == "ran\ndocs/USAGE.md\nuse it\n", result.stderr
    assert [(f.name, f.size, f.truncated) for f in result.output_files] == [("out/huge.bin", 50 * 1024**2, True)]
    assert cube_standin.downloaded_bytes - before < 64 * 1024


async def test_a_missing_skills_root_is_refused_before_anything_runs(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory()
    before = set(cube_standin.sandboxes)
    with pytest.raises(StagingError, match="not a directory"):
        await runtime.run(RunRequest(skill=SkillRef(name="x", root="/nonexistent/lib", path="x"), command="true"))
    assert set(cube_standin.sandboxes) == before


# ---- the remote side failing -----------------------------------------------------------------------------------


async def test_a_wrong_api_key_says_so(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory(api_key="wrong")
    with pytest.raises(RuntimeUnavailableError, match="refused the credentials.*E2B_API_KEY"):
        await runtime.run(RunRequest(skill=SKILL, command="true"))
    assert mirrors_left(runtime) == []


async def test_a_server_error_of_the_api_is_reported_with_its_message(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory()
    before = set(cube_standin.sandboxes)
    cube_standin.fail_api(500)
    with pytest.raises(RuntimeUnavailableError, match="the stand-in was told to fail with 500"):
        await runtime.run(RunRequest(skill=SKILL, workspace_id="five", command="true"))
    assert set(cube_standin.sandboxes) == before
    assert (await runtime.run(RunRequest(skill=SKILL, workspace_id="five", command="true"))).exit_code == 0


async def test_an_unknown_template_is_named_in_the_error(cube_runtime_factory):
    runtime = cube_runtime_factory(template_id="no-such-template")
    with pytest.raises(RuntimeUnavailableError, match="no-such-template"):
        await runtime.run(RunRequest(skill=SKILL, command="true"))


async def test_connecting_to_a_sandbox_that_does_not_exist_says_so(cube_standin):
    with pytest.raises(RuntimeUnavailableError, match="connecting to sandbox sbx-missing.*not found|doesn't exist"):
        await CubeCodeExecutor.create(cube_config(cube_standin, sandbox_id="sbx-missing"))


async def test_a_sandbox_that_expired_between_runs_is_replaced(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory()
    await runtime.run(RunRequest(skill=SKILL, workspace_id="exp", command="echo old > $WORK_DIR/f"))
    old = (await runtime.executor_for("exp")).sandbox_id
    cube_standin.forget(old)
    result = await runtime.run(RunRequest(skill=SKILL, workspace_id="exp", command="ls $WORK_DIR; echo fresh"))
    assert result.exit_code == 0 and result.stdout.endswith("fresh\n")
    assert (await runtime.executor_for("exp")).sandbox_id != old


async def test_a_sandbox_killed_during_a_shared_run_is_an_error(cube_standin, shared_dir):
    executor = await CubeCodeExecutor.create(cube_config(cube_standin))
    runtime = create_cube_workspace_runtime(
        executor,
        workspace_cfg=CubeWorkspaceConfig(root=str(cube_remote_root(shared_dir, "r", cube_standin))),
        work_root=shared_dir / "l",
    )
    cube_standin.forget(executor.sandbox_id)
    with pytest.raises(RuntimeUnavailableError, match=f"sandbox {executor.sandbox_id}.*(gone|not found)"):
        await runtime.run(RunRequest(skill=SKILL, command="true"))


async def test_a_connection_dropped_while_the_command_runs_is_an_error(cube_runtime_factory, cube_standin):
    runtime = cube_runtime_factory()
    await runtime.run(RunRequest(skill=SKILL, workspace_id="drop", command="true"))
    await runtime.idle()  # the clean-up command of that run is done: the next stream is the command's
    cube_standin.drop_next_stream()
    with pytest.raises(RuntimeUnavailableError, match="connection was lost"):
        await runtime.run(RunRequest(skill=SKILL, workspace_id="drop", command="sleep 0.3; echo late"))
    assert (await runtime.run(RunRequest(skill=SKILL, workspace_id="drop", command="echo again"))).stdout == "again\n"
    assert mirrors_left(runtime) == []


async def test_an_unreachable_service_says_where_it_tried(cube_runtime_factory):
    runtime = cube_runtime_factory(api_url="http://127.0.0.1:9", request_timeout=5)
    with pytest.raises(RuntimeUnavailableError, match="127.0.0.1:9"):
        await runtime.run(RunRequest(skill=SKILL, command="true"))


def test_the_cli_runs_a_skill_in_a_cube_sandbox(cube_standin, shared_dir):
    remote = cube_remote_root(shared_dir, "cli-remote", cube_standin)
    env = {**os.environ, "E2B_API_URL": cube_standin.url, "E2B_SANDBOX_URL": cube_standin.url,
           "E2B_API_KEY": cube_standin.api_key, "CUBE_ROOT": str(remote), "SKILLRUN_WORK_ROOT": str(shared_dir / "cli")}
    cli = [sys.executable, "-m", "orchestrator.cli", "run", "python-math"]
    options = ["--runtime", "cube", "--workspace", "cli", "--skills-root", str(LIBRARY), "--json"]
    command = [*cli, "python3 scripts/fib.py 5 > out/fib.txt", "-o", "out/fib.txt", *options]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["runtime"], result["output_files"][0]["content"].split()) == ("cube", ["0", "1", "1", "2", "3"])
    again = subprocess.run([*cli, "cat out/fib.txt | wc -l", *options], env=env, capture_output=True, text=True,
                           timeout=120)
    assert json.loads(again.stdout)["stdout"].strip() == "5"  # a later call finds the workspace's sandbox again
    bad = subprocess.run(command, env={**env, "E2B_API_KEY": "wrong"}, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "check E2B_API_KEY" in bad.stderr


async def test_a_download_larger_than_asked_for_is_refused(cube_runtime_factory, shared_dir):
    runtime = cube_runtime_factory()
    await runtime.run(RunRequest(skill=SKILL, workspace_id="big", command="true"))
    executor = await runtime.executor_for("big")
    big = shared_dir / "big.tar"
    with open(big, "wb") as f:
        f.truncate(5 * 1024 * 1024)
    with pytest.raises(UnsafeArchiveError, match="more than 65536 bytes"):
        await runtime.outputs.download(executor, str(big), shared_dir / "got.tar", 65536)
    assert (shared_dir / "got.tar").stat().st_size <= 65536 + 256 * 1024  # stopped at the limit, not at the end


async def test_workers_with_the_same_skill_in_different_places_stage_it_once(cube_runtime_factory, cube_standin, shared_dir):
    for copy in ("a", "b"):
        shutil.copytree(LIBRARY / "python-math", shared_dir / copy / "python-math")
    first = cube_runtime_factory()
    second = create_cube_workspace_runtime(config=first.config, workspace_cfg=first.workspace_cfg,
                                           work_root=shared_dir / "second")
    before = len(cube_standin.commands)
    for _ in range(3):
        for runtime, copy in ((first, "a"), (second, "b")):
            skill = SkillRef(name="python-math", root=str(shared_dir / copy), path="python-math")
            result = await runtime.run(RunRequest(skill=skill, workspace_id="same", command="python3 scripts/fib.py 2"))
            assert result.stdout.split() == ["0", "1"], result.stderr
    stagings = [c for c in cube_standin.commands[before:] if "refusing to stage" in c]
    assert len(stagings) == 1
    await second.close()
