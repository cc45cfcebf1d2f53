"""``skillrun skills prepare``, the environment in ``skills show``, ``envs list | rm | prune``, as real processes,
building from a package index of our own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_skill
from tests.package_index import PackageIndex, wheel

pytestmark = pytest.mark.slow


@pytest.fixture
def index(shared_dir: Path) -> PackageIndex:
    folder = shared_dir / "dists"
    folder.mkdir()
    wheel(folder, "alpha", "1.0", "VERSION = '1.0'\n")
    served = PackageIndex(folder)
    yield served
    served.close()


@pytest.fixture
def skills(shared_dir: Path) -> Path:
    root = shared_dir / "lib"
    write_skill(root, "needs-alpha", files={"requirements.txt": "alpha\n"})
    write_skill(root, "needs-ghost", files={"requirements.txt": "ghost-package\n"})
    write_skill(root, "plain")
    return root


@pytest.fixture
def cli(shared_dir: Path, work_root: Path, index: PackageIndex, skills: Path):
    def run(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLRUN_", "SKILLS_"))}
        env.update(SKILLRUN_ENV_INDEX_URL=index.url, SKILLRUN_WORK_ROOT=str(work_root), SKILLS_ROOT=str(skills))
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              env=env, timeout=300, cwd=str(shared_dir))

    return run


def test_prepare_builds_reports_each_skill_and_the_manifests_problem(cli, skills: Path):
    (skills / "skillrun.toml").write_text('[skills.nobody]\npython = ["alpha"]\n')
    done = cli("skills", "prepare")
    assert done.returncode == 1, done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines()[1:]}
    assert lines["needs-alpha"].split()[1] == "ready"
    assert lines["needs-ghost"].split()[1] == "failed"
    assert lines["plain"].split()[1] == "none"
    assert "[1/3] needs-alpha: resolving 1 requirement(s)" in done.stderr
    assert "skillrun.toml names skills that do not exist: nobody" in done.stderr
    assert "ghost-package" in done.stderr, "the resolver's own message is not shown"
    again = json.loads(cli("skills", "prepare", "needs-alpha", "--json").stdout)
    [report] = again["skills"]
    assert report["state"] == "ready" and report["packages"] == ["alpha==1.0"]


def test_show_says_which_environment_a_skill_uses(cli):
    before = json.loads(cli("skills", "show", "needs-alpha", "--json").stdout)["environment"]
    assert before["state"] == "not built" and before["python"] == ["alpha"]
    assert cli("skills", "prepare", "needs-alpha").returncode == 0
    shown = cli("skills", "show", "needs-alpha")
    assert "ready: 1 packages" in shown.stdout and "alpha==1.0" in shown.stdout


def test_envs_list_remove_and_prune(cli, work_root: Path):
    assert "no environments" in cli("envs", "list").stdout
    assert cli("skills", "prepare", "needs-alpha").returncode == 0
    listed = json.loads(cli("envs", "list", "--json").stdout)["environments"]
    assert len(listed) == 1 and listed[0]["packages"] == ["alpha==1.0"]
    key = listed[0]["key"]
    assert f"would remove 0 environment(s)" in cli("envs", "prune", "--unused-days", "1", "--dry-run").stdout
    used = Path(listed[0]["path"]).with_suffix(".used")
    long_ago = time.time() - 3 * 24 * 3600
    os.utime(used, (long_ago, long_ago))
    assert "would remove 1" in cli("envs", "prune", "--unused-days", "2", "--dry-run").stdout
    assert json.loads(cli("envs", "list", "--json").stdout)["environments"][0]["key"] == key
    store = Path(listed[0]["path"]).parents[1]
    assert [p.suffix for p in (store / "locks").iterdir()] == [".txt"] and (store / "envs" / f"{key}.locks").is_file()
    assert "removed 1" in cli("envs", "prune", "--unused-days", "2").stdout
    assert json.loads(cli("envs", "list", "--json").stdout)["environments"] == []
    assert not Path(listed[0]["path"]).exists()
    left = sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file() and p.parts[-2] not in ("bin", "targets"))
    assert left == [], "the environment's lock record, lock list or lock files outlived it"
    refused = cli("envs", "rm", "feedface")
    assert refused.returncode == 2 and "no environment or root filesystem with a key starting 'feedface'" in refused.stderr


def test_run_builds_a_missing_environment_with_progress_then_imports_it(cli):
    done = cli("run", "needs-alpha", "python3 -c 'import alpha; print(alpha.VERSION)'")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "1.0\n"
    assert "needs-alpha: installing 1 package(s)" in done.stderr


def test_run_of_a_skill_whose_build_fails_says_why_and_runs_nothing(cli):
    done = cli("run", "needs-ghost", "echo ran")
    assert done.returncode == 2 and "ran" not in done.stdout
    assert "ghost-package" in done.stderr
