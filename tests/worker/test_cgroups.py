"""Run groups have an owner and an end: a runtime's folder goes with it, and one a killed worker left is swept."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import unavailable
from worker.sandbox.cgroups.pool import CgroupPool
from worker.sandbox.cgroups.groups import CgroupTree

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[2]


def _tree() -> CgroupTree:
    tree = CgroupTree.detect()
    if isinstance(tree, str):
        unavailable(f"no run groups on this host: {tree}")
    return tree


def test_closing_a_pool_removes_its_groups_and_its_folder():
    pool = CgroupPool(_tree())
    group = pool.take("w")
    pool.give_back("w", group)
    folders = list(pool.tree.parents.values())
    assert all(path.is_dir() for path in group.paths.values())
    pool.close()
    assert not any(path.exists() for path in [*group.paths.values(), *folders])


def test_the_folder_a_killed_worker_left_is_swept_by_the_next_tree():
    # a worker that makes a group, then dies without closing anything (SIGKILL)
    code = ("import os, signal; from worker.sandbox.cgroups.groups import CgroupTree; t = CgroupTree.detect(); g = t.new_group(); "
            "print(next(iter(g.paths.values()))); os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.stdout.strip(), done.stderr
    left = Path(done.stdout.strip())
    assert left.is_dir()
    tree = _tree()  # the next worker to start
    try:
        assert not left.exists() and not left.parent.exists()
    finally:
        tree.close()
    assert not any(path.exists() for path in tree.parents.values())


def test_sweeping_tolerates_folders_another_process_removes_meanwhile(tmp_path, monkeypatch):
    from worker.sandbox.cgroups import hierarchies as cgroup_hierarchies

    monkeypatch.setattr(cgroup_hierarchies, "OWNERS", tmp_path / "owners")
    (tmp_path / "owners").mkdir()
    parent = tmp_path / "skillrun"
    (parent / "gone-meanwhile" / "run-1").mkdir(parents=True)
    (parent / "left-behind" / "run-2").mkdir(parents=True)
    listing = Path.iterdir

    def racing(self):  # noqa: ANN001, ANN202 - Path.iterdir's shape
        if self.name == "gone-meanwhile":  # another worker swept it between our two listings
            (self / "run-1").rmdir()
            self.rmdir()
        return listing(self)

    monkeypatch.setattr(Path, "iterdir", racing)
    cgroup_hierarchies.sweep_abandoned(parent)
    cgroup_hierarchies.sweep_abandoned(tmp_path / "never-made")
    assert list(parent.iterdir()) == []


async def _first_runs_launched(runtime) -> None:  # noqa: ANN001 - a LocalWorkspaceRuntime
    """Wait until the runtime's launchers wait (``worker.sandbox.launcher``), so the next first run is launched."""
    await runtime.idle()
    if runtime.groups.missing is not None:
        unavailable(f"no run groups on this host: {runtime.groups.missing}")
    assert runtime.groups.launchers is not None and runtime.groups.launchers.waiting, "no launcher waits for a first run"


async def test_a_first_runs_sandbox_is_born_in_its_run_group_with_the_environment_it_would_have(
    work_root, make_request, monkeypatch
):
    from worker.runtimes.local.runtime import LocalWorkspaceRuntime

    look = "env | sort; cat /proc/self/cgroup | grep -E ':(memory|pids|cpu)[,:]'"
    async with LocalWorkspaceRuntime(work_root / "launched") as launched, \
            LocalWorkspaceRuntime(work_root / "started") as started:
        monkeypatch.setattr(started.groups, "take_launcher", lambda limits: None)
        await launched.run(make_request("true", workspace_id="warm-up"))
        await _first_runs_launched(launched)
        result = await launched.run(make_request(look, workspace_id="first"))
        expected = await started.run(make_request(look, workspace_id="first"))
    groups = [line for line in result.stdout.splitlines() if line[:1].isdigit()]
    # its cgroup namespace was made inside its run group: the run sees its group as the root, nothing of the worker's
    assert groups and all(line.endswith(":/") for line in groups), result.stdout
    assert _environment(result, launched) == _environment(expected, started)


def _environment(result, runtime) -> list[str]:  # noqa: ANN001 - a RunResult of a LocalWorkspaceRuntime
    folder = str(runtime.workspaces.find_known("first").path)
    return [re.sub(r"run_[0-9T.]+", "run_", line.replace(folder, "<ws>"))
            for line in result.stdout.splitlines() if not line[:1].isdigit()]


async def test_closing_the_runtime_ends_its_launchers_and_their_groups(work_root, make_request):
    from worker.runtimes.local.runtime import LocalWorkspaceRuntime

    runtime = LocalWorkspaceRuntime(work_root)
    await runtime.run(make_request("true", workspace_id="w"))
    await _first_runs_launched(runtime)
    launchers = runtime.groups.launchers.waiting
    await runtime.close()
    assert all(launcher.proc.returncode is not None for launcher in launchers)
    assert not any(path.exists() for launcher in launchers for path in launcher.cgroup.paths.values())


def test_a_group_handed_back_after_its_workspace_went_is_removed_not_kept():
    # A one-off run's group comes back once its processes are gone, which can be after its workspace was removed:
    # kept, it would wait for an owner that never runs again, until evicted
    pool = CgroupPool(_tree())
    try:
        late = pool.take("one-off")
        pool.drop("one-off")  # the workspace went first
        assert pool.keep("one-off", late) == [late]  # the caller removes it
        late.remove()
        assert not any(path.exists() for path in late.paths.values())
        again = pool.take("one-off")  # the same id made again (a kept workspace named anew): its groups are kept
        assert pool.keep("one-off", again) == []
        assert pool.take("one-off") is again
        pool.give_back("one-off", again)
    finally:
        pool.close()
