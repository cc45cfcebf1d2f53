"""Skills' dependency environments on the Cube runtime, against the E2B stand-in and a package index of our own:
installed by the sandbox itself (with the network) or built on the worker and uploaded (without), once per sandbox,
read-only to runs, and every way of not being ready or failing said clearly.

The stand-in runs sandbox commands on this host, which reaches the index on the host's own address.
"""

from __future__ import annotations

import glob
import os
import random
import re
import signal
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.integration.conftest import cube_config, cube_remote_root
from tests.package_index import PackageIndex, sdist, wheel
from tests.processes import running_with
from tests.services import unavailable
from worker.config import CubeWorkspaceConfig
from worker.contract import RunRequest, SkillRef
from worker.environments import BuildSettings, Target, local_target
from worker.errors import DependencyError, EnvironmentBuildError, EnvironmentNotReadyError
from worker.runtimes.cube import builds as cube_builds
from worker.runtimes.cube.runtime import CubeWorkspaceRuntime
from worker.runtimes.cube.builds import cube_builder
from worker.runtimes.cube.environments import BUILD_UID

pytestmark = pytest.mark.slow

MODES = [pytest.param(True, id="installed-in-sandbox"), pytest.param(False, id="built-on-worker")]
CLI_ENTRY_POINT = {"alpha-2.0.dist-info/entry_points.txt": b"[console_scripts]\nalpha-cli = alpha:main\n"}


@pytest.fixture
def dists(shared_dir: Path) -> Path:
    folder = shared_dir / "dists"
    folder.mkdir()
    wheel(folder, "alpha", "1.0", "VERSION = '1.0'\n")
    wheel(folder, "alpha", "2.0", "VERSION = '2.0'\ndef main():\n    print('alpha', VERSION)\n",
          extra_files=CLI_ENTRY_POINT)
    wheel(folder, "beta", "1.0", "from alpha import VERSION\n", requires=("alpha>=2",))
    return folder


@pytest.fixture
async def make_runtime(cube_standin, shared_dir: Path, index: PackageIndex):
    """Cube runtimes whose sandboxes reach the index (``internet``) or not, sharing one environment store."""
    made: list[CubeWorkspaceRuntime] = []
    before = set(cube_standin.sandboxes)

    def make(*, internet: bool, **settings) -> CubeWorkspaceRuntime:
        options = {"index_url": index.url, "sandboxed": IS_ROOT, "timeout": 120.0, **settings}
        runtime = CubeWorkspaceRuntime(
            config=cube_config(cube_standin, allow_internet_access=internet),
            workspace_cfg=CubeWorkspaceConfig(
                root=str(cube_remote_root(shared_dir, f"remote-{len(made)}", cube_standin))
            ),
            work_root=shared_dir / f"local-{len(made)}",
            environment_builder=cube_builder(shared_dir / "envs", BuildSettings(**options)),
        )
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        await runtime.close()
    for sandbox_id in set(cube_standin.sandboxes) - before:
        cube_standin.forget(sandbox_id)


def skill(shared_dir: Path, name: str, requirements: str) -> SkillRef:
    write_skill(shared_dir / "lib", name, files={"requirements.txt": requirements})
    return SkillRef(name=name, root=str(shared_dir / "lib"), path=name)


def environment_scripts(standin, since: int, what: str = "") -> list[str]:
    """The scripts since command ``since`` that looked after environments in a sandbox (with ``what`` in them)."""
    return [c for c in standin.commands[since:] if "cannot keep environments in" in c and what in c]


@pytest.mark.parametrize("internet", MODES)
async def test_a_skill_imports_its_packages_and_a_sandbox_makes_its_environment_once(
    make_runtime, cube_standin, shared_dir: Path, index: PackageIndex, internet: bool
):
    runtime = make_runtime(internet=internet)
    uses_beta = skill(shared_dir, "uses-beta", "beta\n")
    first = await runtime.run(RunRequest(skill=uses_beta, workspace_id="w", command=(
        'python -c "import beta, sys; print(beta.VERSION, sys.prefix == sys.base_prefix)"; alpha-cli; '
        'echo "$VIRTUAL_ENV"')))
    assert first.exit_code == 0, first.stderr
    version, entry_point, environment = first.stdout.splitlines()
    assert (version, entry_point) == ("2.0 False", "alpha 2.0")
    assert environment.startswith(runtime.workspace_cfg.root + "/.skillrun-envs/")
    # The sandbox's own interpreter runs it, whichever way it was made (the stand-in's sandbox is this host).
    assert os.readlink(f"{environment}/bin/python") == local_target().python

    asked, commands = len(index.requests), len(cube_standin.commands)
    again = await runtime.run(RunRequest(skill=uses_beta, workspace_id="w", command="python -c 'import beta'"))
    assert again.exit_code == 0, again.stderr
    assert len(index.requests) == asked, "the second run in the sandbox reached the package index"
    assert environment_scripts(cube_standin, commands) == [], "the second run in the sandbox looked for its environment"

    if internet:  # uv went into the sandbox once: a second environment there installs with the same one
        commands = len(cube_standin.commands)
        other = await runtime.run(RunRequest(skill=skill(shared_dir, "old-alpha", "alpha==1.0\n"), workspace_id="w",
                                             command="python -c 'import alpha; print(alpha.VERSION)'"))
        assert other.stdout == "1.0\n", other.stderr
        installs = environment_scripts(cube_standin, commands, "pip sync")
        assert len(installs) == 1 and "new_uv=''" in installs[0]
    else:  # built on the worker, for the sandbox's python: kept in the store
        assert len(list((shared_dir / "envs" / "envs").glob("*.json"))) == 1


async def test_a_run_cannot_change_its_environment(make_runtime, shared_dir: Path):
    runtime = make_runtime(internet=True)
    result = await runtime.run(RunRequest(skill=skill(shared_dir, "tamper", "alpha\n"), command=(
        'touch "$VIRTUAL_ENV/planted" 2>/dev/null || echo refused; '
        'rm -rf "$VIRTUAL_ENV/lib" 2>/dev/null || echo refused; '
        'mv "$(dirname "$VIRTUAL_ENV")" "$WORK_DIR/elsewhere" 2>/dev/null || echo refused; python -c "import alpha"')))
    if IS_ROOT:  # the stand-in's sandbox user is a user of its own only when the tests run as root
        assert result.stdout == "refused\nrefused\nrefused\n" and result.exit_code == 0, result.stderr


@pytest.mark.parametrize("internet", MODES)
async def test_a_run_that_will_not_wait_is_told_its_environment_is_not_ready(
    make_runtime, shared_dir: Path, index: PackageIndex, internet: bool
):
    runtime = make_runtime(internet=internet)
    later = skill(shared_dir, "later", "alpha\n")
    with pytest.raises(EnvironmentNotReadyError) as caught:
        await runtime.run(RunRequest(skill=later, workspace_id="a", command="true", wait_for_environment=False))
    expected = "not installed in sandbox" if internet else "not built yet"
    assert expected in str(caught.value) and "wait_for_environment=true" in str(caught.value)
    assert index.requests == [], "a run that would not wait started a build"
    assert (await runtime.run(RunRequest(skill=later, workspace_id="a", command="true"))).exit_code == 0
    # Another sandbox: one that installs from the index installs anew; a worker-built environment is only uploaded.
    elsewhere = RunRequest(skill=later, workspace_id="b", command="true", wait_for_environment=False)
    if internet:
        with pytest.raises(EnvironmentNotReadyError):
            await make_runtime(internet=True).run(elsewhere)
    else:
        assert (await make_runtime(internet=False).run(elsewhere)).exit_code == 0


async def test_a_skill_with_node_packages_is_told_the_cube_runtime_does_not_build_them(make_runtime, shared_dir: Path):
    nodey = skill(shared_dir, "nodey", "alpha\n")
    (shared_dir / "lib" / "nodey" / "package.json").write_text('{"dependencies": {"docx": "^9"}}')
    with pytest.raises(DependencyError) as caught:
        await make_runtime(internet=False).run(RunRequest(skill=nodey, workspace_id="a", command="true"))
    assert "declares Node packages (docx@^9)" in str(caught.value) and "local or Docker runtime" in str(caught.value)


@pytest.mark.parametrize("internet", MODES)
async def test_a_requirement_the_index_does_not_have_fails_with_uvs_message(
    make_runtime, shared_dir: Path, internet: bool
):
    runtime = make_runtime(internet=internet)
    with pytest.raises(EnvironmentBuildError) as caught:
        await runtime.run(RunRequest(skill=skill(shared_dir, "missing", "no-such-package-anywhere\n"), command="true"))
    message = str(caught.value)
    assert "skill 'missing'" in message and "resolving the dependencies failed" in message
    assert "no-such-package-anywhere was not found in the package registry" in message, message


async def test_an_install_that_fails_in_the_sandbox_says_why_and_leaves_nothing_running(
    make_runtime, shared_dir: Path, dists: Path
):
    marker = f"{3000 + random.random():.9f}"
    sdist(dists, "broken", "1.0", (
        f'import os, subprocess\nsubprocess.Popen(["sleep", "{marker}"], stdout=subprocess.DEVNULL, '
        'stderr=subprocess.DEVNULL, start_new_session=True)\n'
        'raise RuntimeError(f"the compiler is on fire (uid {os.getuid()})")\n'
    ))
    runtime = make_runtime(internet=True, timeout=60.0)
    with pytest.raises(EnvironmentBuildError) as caught:
        await runtime.run(RunRequest(skill=skill(shared_dir, "b", "broken\n"), command="true"))
    message = str(caught.value)
    assert "installing the dependencies in sandbox" in message and "the compiler is on fire" in message, message
    if IS_ROOT:  # built as a user of its own, neither root nor the sandbox user
        assert f"(uid {BUILD_UID})" in message
    left = running_with(marker)
    if IS_ROOT:  # the build's user is one of its own, whose every process is killed when the build fails
        assert left == [], "the failed build's process outlived it"
    else:  # the stand-in's sandbox root is this account, as is the build: no user of its own to kill all of
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    envs = Path(runtime.workspace_cfg.root) / ".skillrun-envs"
    assert [p.name for p in envs.iterdir() if p.name.startswith(".build-")] == []


async def test_an_environment_past_the_size_cap_is_refused_in_the_sandbox(make_runtime, shared_dir: Path, dists: Path):
    wheel(dists, "bulky", "1.0", "X = 1\n", extra_files={"bulky_data.bin": os.urandom(3 * 1024 * 1024)})
    runtime = make_runtime(internet=True, max_bytes=1024 * 1024)
    with pytest.raises(EnvironmentBuildError, match="past the cap of 1048576 bytes"):
        await runtime.run(RunRequest(skill=skill(shared_dir, "big", "bulky\n"), command="true"))


async def test_a_skill_without_declarations_costs_no_round_trip(make_runtime, cube_standin, shared_dir: Path):
    runtime = make_runtime(internet=True)
    plain = SkillRef(name="plain", root=str(shared_dir / "lib"), path="plain")
    write_skill(shared_dir / "lib", "plain")
    await runtime.run(RunRequest(skill=plain, workspace_id="p", command="true"))
    commands = len(cube_standin.commands)
    assert (await runtime.run(RunRequest(skill=plain, workspace_id="p", command="echo $VIRTUAL_ENV"))).stdout == "\n"
    assert len(cube_standin.commands) - commands == 1  # the command's own


async def test_an_install_that_runs_forever_is_stopped_at_the_build_timeout(
    make_runtime, shared_dir: Path, dists: Path
):
    marker = f"{3000 + random.random():.9f}"
    sdist(dists, "forever", "1.0", f'import subprocess\nsubprocess.run(["sleep", "{marker}"])\n')
    runtime = make_runtime(internet=True, timeout=5.0)
    with pytest.raises(EnvironmentBuildError, match="did not finish within 5 s"):
        await runtime.run(RunRequest(skill=skill(shared_dir, "f", "forever\n"), command="true"))
    assert running_with(marker) == [], "the install's process outlived its timeout"


def other_python(version: str) -> str | None:
    """An interpreter on this host of another minor version than ``version``, if there is one."""
    minor = ".".join(version.split(".")[:2])
    for candidate in sorted(glob.glob("/usr/bin/python3.*") + glob.glob("/root/.pyenv/versions/3.*/bin/python3.*")):
        name = os.path.basename(candidate)
        if re.fullmatch(r"python3\.\d+", name) and name != f"python{minor}" and os.access(candidate, os.X_OK):
            return candidate
    return None


async def test_an_environment_built_by_another_python_on_the_worker_becomes_the_sandboxs(
    make_runtime, shared_dir: Path, monkeypatch
):
    sandbox_python = local_target()  # the stand-in's sandbox is this host
    worker_python = other_python(sandbox_python.version)
    if worker_python is None:
        unavailable("needs a python3.X of another minor version than the sandbox's on this host (pyenv, or "
                    "/usr/bin/python3.X): install one, e.g. `uv python install 3.12`")
    monkeypatch.setattr(cube_builds, "local_target",
                        lambda: Target("local", worker_python, "3", sandbox_python.machine, sandbox_python.libc))
    runtime = make_runtime(internet=False, sandboxed=False)  # the worker's other python is outside bwrap's view
    result = await runtime.run(RunRequest(skill=skill(shared_dir, "moved", "beta\n"), command=(
        'python -c "import beta, sys; print(beta.VERSION, sys.version.split()[0])"; alpha-cli; '
        'ls "$VIRTUAL_ENV/lib"; readlink "$VIRTUAL_ENV/bin/python"')))
    assert result.exit_code == 0, result.stderr
    minor = ".".join(sandbox_python.version.split(".")[:2])
    assert result.stdout.splitlines() == [
        f"2.0 {sandbox_python.version}", "alpha 2.0", f"python{minor}", sandbox_python.python,
    ]
