"""Environments built for real with uv, from a package index of our own: sharing, runs, and every bad input."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.environment_stores import built, environments_maker, left_building
from tests.package_index import PackageIndex, sdist, wheel
from tests.processes import running_with
from worker.contract import RunRequest, SkillRef
from worker.environments import (
    BuildSettings,
    EnvironmentBuilder,
    EnvironmentStore,
    local_target,
)
from worker.environments.declarations import Declaration
from worker.environments.steps import SandboxSteps, StepRunner
from worker.errors import EnvironmentNotReadyError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.slow


@pytest.fixture
def make_envs(shared_dir: Path, index: PackageIndex):
    with environments_maker(shared_dir / "envs", index_url=index.url, sandboxed=IS_ROOT, timeout=120.0) as make:
        yield make


async def test_an_environment_is_built_once_and_shared_by_every_skill_with_the_same_requirements(
    shared_dir: Path, make_envs, index: PackageIndex
):
    first = write_skill(shared_dir / "lib-a", "one", files={"requirements.txt": "beta\n"})
    second = write_skill(shared_dir / "lib-b", "two", files={"pyproject.toml": '[project]\ndependencies = ["beta"]\n'})
    envs = make_envs()
    assert envs.status(first, first.parent, "one").state == "not built"
    messages: list[str] = []
    ready = await envs.prepare(first, first.parent, "one", progress=messages.append)
    assert ready.state == "ready", ready.message
    assert ready.info.packages == ["alpha==2.0", "beta==1.0"]
    assert any("installing 2 package(s)" in m for m in messages)
    downloads = len(index.requests)
    again = await envs.prepare(second, second.parent, "two")
    assert again.state == "ready" and again.info.key == ready.info.key
    assert len(index.requests) == downloads, "the second skill with the same requirements reached the index"
    assert built(shared_dir / "envs") == [ready.info.key]
    python = ready.info.path / "bin" / "python"
    done = await asyncio.create_subprocess_exec(python, "-c", "import beta; print(beta.VERSION)", stdout=-1)
    assert (await done.communicate())[0] == b"2.0\n"
    if IS_ROOT:
        owners = {os.lstat(os.path.join(d, n)).st_uid for d, _, fs in os.walk(ready.info.path) for n in fs}
        assert owners == {0}, "the build's user id (handed to a workspace next) still owns files of the environment"


class RecordingSteps(StepRunner):
    """A step runner's steps, recorded: each one's folder, user id and first two words."""

    def __init__(self, inner: StepRunner, *, cheap_steps: bool) -> None:
        self.inner = inner
        self.cheap_steps = cheap_steps
        self.steps: list[tuple[Path, int | None, str]] = []

    async def run(self, folder, uid, args, env, **options):
        self.steps.append((folder, uid, " ".join(args[:2])))
        return await self.inner.run(folder, uid, args, env, **options)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize("cheap_steps", [True, False], ids=["cheap steps", "costly steps"])
async def test_resolving_and_installing_have_folders_of_their_own_the_installs_readied_meanwhile(
    shared_dir: Path, index: PackageIndex, cheap_steps: bool
):
    """The resolver may run the build backend of a package it then drops, and an environment is shared by its
    lock: the install's folder, cache and user id are not the resolver's. Where steps are cheap, the install's
    first look at its interpreter is done while resolving too."""
    settings = BuildSettings(index_url=index.url, sandboxed=IS_ROOT, timeout=120.0)
    store = EnvironmentStore(shared_dir / "envs")
    steps = RecordingSteps(SandboxSteps(store.root / "bin", ca_bundle=None, memory_bytes=settings.memory_bytes,
                                        sandboxed=settings.sandboxed), cheap_steps=cheap_steps)
    builder = EnvironmentBuilder(store, settings, steps=steps)
    try:
        info = await builder.ensure(Declaration(python=("beta",)), local_target())
        made = {what: (folder, uid) for folder, uid, what in steps.steps}
        readying = ["venv --relocatable", "python find"] if cheap_steps else ["venv --relocatable"]
        assert sorted(made) == sorted(["pip compile", "pip sync", *readying]), steps.steps
        assert [what for _, _, what in steps.steps][-1] == "pip sync"
        resolving, installing = made["pip compile"], made["pip sync"]
        assert all(made[what] == installing for what in readying)
        assert resolving[0] != installing[0]
        if IS_ROOT:
            assert resolving[1] != installing[1]
        assert info.packages == ["alpha==2.0", "beta==1.0"]
    finally:
        builder.close()


async def test_a_run_imports_its_declared_packages_and_cannot_change_them_or_see_others(
    shared_dir: Path, make_envs, work_root
):
    write_skill(shared_dir / "lib", "uses-beta", files={"scripts/go.py": (
        "# /// script\n# dependencies = ['beta']\n# ///\nimport beta\nprint('beta sees alpha', beta.VERSION)\n"
    )})
    elsewhere = write_skill(shared_dir / "lib", "uses-alpha", files={"requirements.txt": "alpha==1.0\n"})
    envs = make_envs()
    other = await envs.prepare(elsewhere, elsewhere.parent, "uses-alpha")
    async with LocalWorkspaceRuntime(work_root, environments=envs) as runtime:
        skill = SkillRef(name="uses-beta", root=str(shared_dir / "lib"), path="uses-beta")
        result = await runtime.run(RunRequest(skill=skill, command="python scripts/go.py"))
        assert result.exit_code == 0, result.stderr
        assert result.stdout == "beta sees alpha 2.0\n"
        tamper = await runtime.run(RunRequest(
            skill=skill, command='touch "$VIRTUAL_ENV/planted" "$VIRTUAL_ENV/bin/python" || echo refused; '
                                 'ls "$VIRTUAL_ENV/.."; basename "$VIRTUAL_ENV"',
        ))
    assert tamper.stdout.startswith("refused\n")
    listed, own = tamper.stdout.split()[1:]
    assert own != other.info.key
    if IS_ROOT:  # sandboxed: the run is shown its own environment and no other
        assert listed == own
    assert not any((shared_dir / "envs" / "envs").glob("*/planted"))


async def test_a_run_that_will_not_wait_is_told_its_environment_is_notbuilt(shared_dir: Path, make_envs, work_root):
    write_skill(shared_dir / "lib", "later", files={"requirements.txt": "alpha\n"})
    async with LocalWorkspaceRuntime(work_root, environments=make_envs()) as runtime:
        skill = SkillRef(name="later", root=str(shared_dir / "lib"), path="later")
        with pytest.raises(EnvironmentNotReadyError) as caught:
            await runtime.run(RunRequest(skill=skill, command="true", wait_for_environment=False))
    assert "not built yet" in str(caught.value) and "skillrun skills prepare" in str(caught.value)
    assert built(shared_dir / "envs") == []


async def test_a_requirement_the_index_does_not_have_fails_with_the_resolvers_message(shared_dir: Path, make_envs):
    skill = write_skill(shared_dir / "lib", "missing", files={"requirements.txt": "no-such-package-anywhere\n"})
    status = await make_envs().prepare(skill, skill.parent, "missing")
    assert status.state == "failed"
    assert "resolving the dependencies failed" in status.message and "no-such-package-anywhere" in status.message
    assert built(shared_dir / "envs") == [] and left_building(shared_dir / "envs") == []
    assert make_envs().status(skill, skill.parent, "missing").state == "failed"


async def test_a_conflict_between_the_skill_and_the_manifest_fails_with_the_resolvers_message(shared_dir: Path, make_envs):
    skill = write_skill(shared_dir / "lib", "torn", files={"requirements.txt": "alpha<2\n"})
    (shared_dir / "lib" / "skillrun.toml").write_text('[skills.torn]\npython = ["alpha>=2"]\n')
    status = await make_envs().prepare(skill, skill.parent, "torn")
    assert status.state == "failed"
    assert "alpha<2" in status.message and "alpha>=2" in status.message, status.message


async def test_a_source_distribution_whose_build_fails_reports_the_build_backends_message(
    shared_dir: Path, make_envs, dists: Path
):
    sdist(dists, "broken", "1.0", 'raise RuntimeError("the compiler is on fire")\n')
    skill = write_skill(shared_dir / "lib", "b", files={"requirements.txt": "broken\n"})
    status = await make_envs().prepare(skill, skill.parent, "b")
    assert status.state == "failed" and "the compiler is on fire" in status.message, status.message
    assert built(shared_dir / "envs") == [] and left_building(shared_dir / "envs") == []


async def test_a_build_that_runs_forever_is_stopped_at_the_build_timeout(shared_dir: Path, make_envs, dists: Path):
    marker = f"{3000 + random.random():.9f}"
    sdist(dists, "forever", "1.0", f'import subprocess\nsubprocess.run(["sleep", "{marker}"])\n')
    skill = write_skill(shared_dir / "lib", "f", files={"requirements.txt": "forever\n"})
    status = await make_envs(timeout=8.0).prepare(skill, skill.parent, "f")
    assert status.state == "failed" and "did not finish within 8 s" in status.message, status.message
    assert running_with(marker) == [], "the build's process outlived its timeout"
    assert left_building(shared_dir / "envs") == []


async def test_an_environment_past_the_size_cap_is_refused_and_removed(shared_dir: Path, make_envs, dists: Path):
    wheel(dists, "bulky", "1.0", "X = 1\n", extra_files={"bulky_data.bin": os.urandom(3 * 1024 * 1024)})
    skill = write_skill(shared_dir / "lib", "big", files={"requirements.txt": "bulky\n"})
    status = await make_envs(max_bytes=1024 * 1024).prepare(skill, skill.parent, "big")
    assert status.state == "failed" and "past the cap of 1048576 bytes" in status.message, status.message
    assert built(shared_dir / "envs") == [] and left_building(shared_dir / "envs") == []


async def test_a_build_folder_a_killed_worker_left_is_removed_by_the_next_build(shared_dir: Path, make_envs):
    skill = write_skill(shared_dir / "lib", "after", files={"requirements.txt": "alpha\n"})
    envs = make_envs()
    envs.store.ensure()
    left = envs.store.building / f"env-{'0' * 64}-abcdef"
    (left / "env" / "lib").mkdir(parents=True)
    assert (await envs.prepare(skill, skill.parent, "after")).state == "ready"
    assert left_building(shared_dir / "envs") == []


async def test_two_workers_preparing_the_same_environment_build_it_once(shared_dir: Path, make_envs):
    skill = write_skill(shared_dir / "lib", "shared", files={"requirements.txt": "beta\n"})
    one, two = make_envs(), make_envs()
    first, second = await asyncio.gather(
        one.prepare(skill, skill.parent, "shared"), two.prepare(skill, skill.parent, "shared")
    )
    assert first.state == second.state == "ready"
    assert first.info.key == second.info.key and first.info.built_at == second.info.built_at
    assert built(shared_dir / "envs") == [first.info.key] and left_building(shared_dir / "envs") == []


async def test_a_run_while_its_environment_is_being_built_waits_or_is_told_so(shared_dir: Path, make_envs, dists: Path):
    sdist(dists, "slow", "1.0", "import time\ntime.sleep(3)\n")
    skill = write_skill(shared_dir / "lib", "s", files={"requirements.txt": "slow\n"})
    builder, runner = make_envs(), make_envs()
    building = asyncio.ensure_future(builder.prepare(skill, skill.parent, "s"))
    while runner.status(skill, skill.parent, "s").state != "building":
        await asyncio.sleep(0.05)
    with pytest.raises(EnvironmentNotReadyError, match="being built"):
        await runner.for_run(skill, skill.parent, "s", wait=False)
    waited = await runner.for_run(skill, skill.parent, "s", wait=True)
    assert (await building).info.key == waited.python.key


@pytest.mark.root
async def test_a_build_finds_nothing_of_the_host_the_platform_other_workspaces_or_the_hosts_loopback(
    shared_dir: Path, make_envs, dists: Path, work_root: Path, monkeypatch
):
    monkeypatch.setenv("SKILLRUN_TEST_SECRET", "worker-secret-value")
    loopback = socket.socket()
    loopback.bind(("127.0.0.1", 0))
    loopback.listen()
    other = work_root / "ws_other"
    other.mkdir(mode=0o700)
    (other / "notes.txt").write_text("another tenant's notes")
    probes = {
        "shadow": "/etc/shadow",
        "root_home": "/root",
        "other_workspace": str(other / "notes.txt"),
        "store_locks": str(shared_dir / "envs" / "locks"),
    }
    code = (
        "import os, json\nfound = {}\n"
        f"for name, path in {probes!r}.items():\n"
        "    try:\n"
        "        found[name] = os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read(64).hex()\n"
        "    except OSError as exc:\n"
        "        found[name] = None\n"
        "seen = []\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        seen.append(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
        "found['secret_in_env'] = any(b'worker-secret-value' in environ for environ in seen)\n"
        "found['uid'] = os.getuid()\n"
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {loopback.getsockname()[1]}), timeout=3)\n"
        "    found['loopback'] = True\n"
        "except OSError:\n"
        "    found['loopback'] = False\n"
        "raise RuntimeError('PROBE:' + json.dumps(found))\n"
    )
    sdist(dists, "nosy", "1.0", code)
    skill = write_skill(shared_dir / "lib", "nosy", files={"requirements.txt": "nosy\n"})
    status = await make_envs().prepare(skill, skill.parent, "nosy")
    found = json.loads(status.message.rsplit("PROBE:", 1)[1].splitlines()[0])
    assert found["uid"] != 0
    for name in probes:
        assert found[name] is None, f"a build read {name}: {found[name]}"
    assert found["secret_in_env"] is False
    assert found["loopback"] is False, "a build reached a service on the host's loopback (Redis, the API)"
    loopback.close()
