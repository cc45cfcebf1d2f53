"""The local runtime's root filesystems: a skill's Debian packages installed once per set with debootstrap, and its
sandbox showing that root's ``/usr``, ``/etc`` and ``/var`` instead of the host's.

Real builds from Debian's archive: the module builds one root (``figlet``) and the tests that build again start from
its downloads (a hard-linked copy of ``systems/.debs``), as a store's second build does.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_skill
from tests.system_roots import debian_library, mounts_under
from tests.environment_stores import environments_maker, left_building
from worker.contract import RunRequest, SkillRef
from worker.environments import systems as systems_module
from worker.environments.systems import BASE_PACKAGES, SystemRoots
from worker.errors import EnvironmentBuildError, EnvironmentNotReadyError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

NOT_A_PACKAGE = "skillrun-no-such-package"


async def test_a_run_sees_the_roots_packages_and_none_of_the_hosts_system(figlet_store: Path, tmp_path: Path,
                                                                        work_root: Path):
    library = debian_library(tmp_path, banner=["figlet"])
    write_skill(library, "plain")
    with environments_maker(figlet_store) as make:
        async with LocalWorkspaceRuntime(work_root, environments=make(systems=True)) as runtime:
            status = runtime.environment_status(library / "banner", library, "banner")
            assert (status.state, status.image.state) == ("ready", "ready"), status.message
            assert status.image.tag.startswith("rootfs:") and not status.image.on_host
            probe = ("figlet -w 40 hi >/dev/null && echo figlet; test -e /usr/bin/bwrap && echo host-usr; "
                     "python --version; id -un; test -d /var/lib/dpkg && echo var")
            results = []
            for _ in range(3):  # a first run, then the workspace's held sandbox
                results.append(await runtime.run(RunRequest(
                    skill=SkillRef(name="banner", root=str(library), path="banner"), command=probe,
                    workspace_id="w1")))
            plain = await runtime.run(RunRequest(skill=SkillRef(name="plain", root=str(library), path="plain"),
                                                 command=probe, workspace_id="w1"))
    for result in results:
        assert result.exit_code == 0, result.stderr
        lines = result.stdout.splitlines()
        assert lines[0] == "figlet" and "host-usr" not in lines, result.stdout
        assert lines[1].startswith("Python 3.") and lines[2].startswith("skillrun-") and lines[3] == "var"
    # The skill that declares nothing runs on the host's system, in the same workspace.
    assert "host-usr" in plain.stdout.splitlines() and "figlet" not in plain.stdout.splitlines()


async def test_a_debian_package_that_does_not_exist_fails_with_its_name_and_leaves_nothing(
    fresh_store: Path, tmp_path: Path, work_root: Path
):
    library = debian_library(tmp_path, wrong=["figlet", NOT_A_PACKAGE])
    with environments_maker(fresh_store) as make:
        envs = make(systems=True)
        status = await envs.prepare(library / "wrong", library, "wrong")
        assert status.state == "failed" and status.image.state == "failed"
        assert f"has no package named {NOT_A_PACKAGE}" in status.message and "skillrun.toml" in status.message
        assert "skill 'wrong'" in status.message
        again = envs.status(library / "wrong", library, "wrong")
        assert again.state == "failed" and NOT_A_PACKAGE in again.message
        async with LocalWorkspaceRuntime(work_root, environments=envs) as runtime:
            with pytest.raises(EnvironmentBuildError) as caught:  # at once: the failure is remembered
                await runtime.run(RunRequest(skill=SkillRef(name="wrong", root=str(library), path="wrong"),
                                             command="true"))
    assert NOT_A_PACKAGE in str(caught.value) and "skillrun skills prepare --runtime local" in str(caught.value)
    assert left_building(fresh_store) == [] and mounts_under(fresh_store) == []
    assert sorted(p.name for p in (fresh_store / "systems").iterdir()) == [".debs"]


async def test_two_skills_building_the_same_root_at_once_build_it_once(
    fresh_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    library = debian_library(tmp_path, one=["figlet"], two=["figlet", "figlet"])
    builds = []
    build = SystemRoots._build

    async def counted(self, digest, packages, progress):
        builds.append(digest)
        await build(self, digest, packages, progress)

    monkeypatch.setattr(SystemRoots, "_build", counted)
    with environments_maker(fresh_store) as make:  # two workers' views of one store
        first, second = make(systems=True), make(systems=True)
        one, two = await asyncio.gather(first.prepare(library / "one", library, "one"),
                                        second.prepare(library / "two", library, "two"))
    assert one.state == two.state == "ready", (one.message, two.message)
    assert one.image.tag == two.image.tag and len(builds) == 1
    assert left_building(fresh_store) == [] and mounts_under(fresh_store) == []


async def test_a_root_past_its_size_cap_is_stopped_and_removed(fresh_store: Path, tmp_path: Path):
    library = debian_library(tmp_path, big=["figlet"])
    with environments_maker(fresh_store, system_max_bytes=20 * 1024**2) as make:
        status = await make(systems=True).prepare(library / "big", library, "big")
    assert status.state == "failed" and "grew past 20971520 bytes (SKILLRUN_ENV_SYSTEM_MAX_BYTES)" in status.message
    assert left_building(fresh_store) == [] and mounts_under(fresh_store) == []
    assert sorted(p.name for p in (fresh_store / "systems").iterdir()) == [".debs"]


async def test_a_build_past_its_timeout_is_stopped_with_everything_it_started(fresh_store: Path, tmp_path: Path):
    library = debian_library(tmp_path, slow=["figlet"])
    with environments_maker(fresh_store, timeout=3.0) as make:
        status = await make(systems=True).prepare(library / "slow", library, "slow")
    assert status.state == "failed" and "did not finish within 3 s (SKILLRUN_ENV_BUILD_TIMEOUT)" in status.message
    assert left_building(fresh_store) == [] and mounts_under(fresh_store) == []
    left = subprocess.run(["pgrep", "-f", str(fresh_store)], capture_output=True, text=True).stdout.split()
    assert [pid for pid in left if int(pid) != os.getpid()] == []


async def test_a_run_that_will_not_wait_is_told_how_to_build_its_root(tmp_path: Path, work_root: Path):
    library = debian_library(tmp_path, later=["figlet"])
    with environments_maker(tmp_path / "store") as make:
        envs = make(systems=True)
        status = envs.status(library / "later", library, "later")
        assert status.state == "not built" and "root filesystem with its Debian packages (figlet)" in status.message
        async with LocalWorkspaceRuntime(work_root, environments=envs) as runtime:
            with pytest.raises(EnvironmentNotReadyError) as caught:
                await runtime.run(RunRequest(skill=SkillRef(name="later", root=str(library), path="later"),
                                             command="true", wait_for_environment=False))
    assert "root filesystem with its Debian packages is not built yet (figlet)" in str(caught.value)
    assert "skillrun skills prepare --runtime local" in str(caught.value)


def test_a_host_that_cannot_build_says_what_it_lacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    library = debian_library(tmp_path, needs=["figlet"])
    monkeypatch.setattr(systems_module.os, "geteuid", lambda: 0)
    monkeypatch.setattr(systems_module.shutil, "which", lambda *args, **kwargs: None)
    with environments_maker(tmp_path / "store") as make:
        status = make(systems=True).status(library / "needs", library, "needs")
    assert status.state == "not built" and "install debootstrap (apt-get install debootstrap)" in status.message


def test_the_digest_is_the_set_not_its_order_and_changes_with_the_release(tmp_path: Path):
    with environments_maker(tmp_path / "store") as make:
        roots = make(systems=True).systems
        other = make(systems=True, debian_suite="trixie").systems
    assert roots.digest(("figlet", "jq")) == roots.digest(("jq", "figlet", "jq"))
    assert roots.digest(("figlet",)) != roots.digest(("jq",)) != other.digest(("jq",))
    assert "python3" in BASE_PACKAGES and "bash" in BASE_PACKAGES


def test_envs_list_rm_and_prune_look_after_roots(figlet_store: Path, work_root: Path, shared_dir: Path):
    [digest] = [p.name[:-5] for p in (figlet_store / "systems").glob("*.json")]
    store = work_root / ".skillrun" / "environments" / "systems"
    store.mkdir(parents=True)

    def copy() -> None:  # the store's root as the CLI's work root would hold it (hard links: nothing is copied)
        subprocess.run(["cp", "-al", str(figlet_store / "systems" / digest), str(store / digest)], check=True)
        for suffix in (".json", ".used"):
            subprocess.run(["cp", "-p", str(figlet_store / "systems" / f"{digest}{suffix}"), str(store)], check=True)

    def cli(*args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SKILLRUN_", "SKILLS_"))}
        return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                              env={**env, "SKILLRUN_WORK_ROOT": str(work_root)}, timeout=120, cwd=str(shared_dir))

    copy()
    [listed] = json.loads(cli("envs", "list", "--json").stdout)["root_filesystems"]
    assert listed["digest"] == digest and listed["packages"] == ["figlet"] and listed["size_bytes"] > 10**7
    assert "1 root filesystem(s) of the local runtime" in cli("envs", "list").stdout
    removed = cli("envs", "rm", digest[:12])
    assert removed.returncode == 0 and f"removed {digest}" in removed.stdout, removed.stderr
    assert not (store / digest).exists() and not (store / f"{digest}.json").exists()
    copy()
    old = time.time() - 3 * 24 * 3600
    os.utime(store / f"{digest}.used", (old, old))
    subprocess.run(["cp", "-al", str(figlet_store / "systems/.debs"), str(store / ".debs")], check=True)
    debs = len(list((store / ".debs").glob("*.deb")))
    assert debs > 50
    dry = cli("envs", "prune", "--unused-days", "2", "--dry-run").stdout
    assert "1 root filesystem(s)" in dry and "of downloaded Debian packages" in dry
    assert (store / digest).is_dir() and len(list((store / ".debs").glob("*.deb"))) == debs
    pruned = json.loads(cli("envs", "prune", "--unused-days", "2", "--json").stdout)
    assert pruned["removed_root_filesystems"] == [digest] and pruned["downloads_bytes"] > 10**7
    assert not (store / digest).exists() and os.path.lexists(figlet_store / "systems" / digest / "usr/bin/figlet")
    assert list((store / ".debs").iterdir()) == [] and len(list((figlet_store / "systems/.debs").glob("*.deb"))) == debs
