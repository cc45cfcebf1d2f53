"""Run groups have an owner and an end: a runtime's folder goes with it, and one a killed worker left is swept."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import unavailable
from worker.cgroups import CgroupPool, CgroupTree

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
    code = ("import os, signal; from worker.cgroups import CgroupTree; t = CgroupTree.detect(); g = t.new_group(); "
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
    from worker import cgroup_hierarchies

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
