"""A one-off run's end (``keep_workspace`` false) removes its workspace once no run is in it, on this host: also
when the other run is another worker's sharing the work root (two runtimes here, as two processes would be: each
holds the workspace's use file through a lock of its own), and never a workspace a kept run was in."""

from __future__ import annotations

import asyncio

from worker.jobs.execute import remove_one_off_workspace
from worker.runtimes.workspace_uses import USES_DIR
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

HANG_GUARD_SECONDS = 60.0
GATED = "echo mine > $WORK_DIR/mine; until [ -e $WORK_DIR/go ]; do sleep 0.02; done; cat $WORK_DIR/mine"


async def _until_written(runtime: LocalWorkspaceRuntime, workspace_id: str, name: str) -> None:
    async def written() -> None:
        while (workspace := runtime.workspaces.find(workspace_id)) is None or \
                not (workspace.work_dir / name).exists():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(written(), HANG_GUARD_SECONDS)


async def test_another_workers_one_off_run_leaves_the_workspace_to_the_last_run_in_it(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root) as first, LocalWorkspaceRuntime(work_root) as second:
        slow = make_request(GATED, workspace_id="shared", keep_workspace=False)
        running = asyncio.create_task(first.run(slow))
        await _until_written(first, "shared", "mine")
        quick = make_request("true", workspace_id="shared", keep_workspace=False)
        assert (await second.run(quick)).exit_code == 0
        await remove_one_off_workspace(second, quick)
        workspace = second.workspaces.find("shared")
        assert workspace is not None, "the quick run's end removed the workspace under the slow run"
        (workspace.work_dir / "go").touch()
        result = await running
        assert (result.exit_code, result.stdout) == (0, "mine\n"), result.stderr
        await first.idle()  # the last run in it removed it, after its result
        assert first.workspaces.find("shared") is None and not workspace.path.exists()
        await remove_one_off_workspace(first, slow)  # its own end finds it gone
        assert list((work_root / ".skillrun" / USES_DIR).iterdir()) == []


async def test_a_lone_one_off_run_removes_its_workspace_and_its_use_file(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root) as runtime:
        request = make_request("echo hi > $WORK_DIR/f", workspace_id="alone", keep_workspace=False)
        assert (await runtime.run(request)).exit_code == 0
        await remove_one_off_workspace(runtime, request)
        assert runtime.workspaces.find("alone") is None
        assert list((work_root / ".skillrun" / USES_DIR).iterdir()) == []


async def test_a_one_off_run_of_a_workspace_a_kept_run_was_in_leaves_it_to_the_kept_workspaces_rules(work_root,
                                                                                                   make_request):
    async with LocalWorkspaceRuntime(work_root) as runtime:
        assert (await runtime.run(make_request("echo kept > $WORK_DIR/kept", workspace_id="named"))).exit_code == 0
        one_off = make_request("cat $WORK_DIR/kept", workspace_id="named", keep_workspace=False)
        assert (await runtime.run(one_off)).stdout == "kept\n"
        await remove_one_off_workspace(runtime, one_off)
        workspace = runtime.workspaces.find("named")
        assert workspace is not None and (workspace.work_dir / "kept").read_text() == "kept\n"
        await runtime.end_workspace("named")  # idle, deleted: removed, its marks with it
        assert runtime.workspaces.find("named") is None
        assert list((work_root / ".skillrun" / USES_DIR).iterdir()) == []
