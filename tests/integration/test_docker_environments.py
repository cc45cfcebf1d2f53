"""Skill dependencies on the Docker runtime: environments built in throwaway containers of the sandbox image from a
package index of our own, derived images for Debian packages, and every way a build can go wrong."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.package_index import PackageIndex, sdist, wheel
from tests.processes import running_with
from worker.contract import RunRequest, SkillRef
from worker.environments import BuildSettings
from worker.errors import EnvironmentBuildError, EnvironmentNotReadyError
from worker.runtimes.docker.builds import (
    BUILD_LABEL,
    DockerTargets,
    docker_environments,
)
from worker.runtimes.docker.images import REPOSITORY

pytestmark = [pytest.mark.docker, pytest.mark.slow]

CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
ENGINE_FILES = ("/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/usr/sbin/docker-init")
"""Files the engine mounts into a container (the last for ``--init``)."""


@pytest.fixture
def settings(index: PackageIndex):
    def make(**fields) -> BuildSettings:
        return BuildSettings(**{"index_url": index.url, "sandboxed": IS_ROOT, "timeout": 120.0, **fields})

    return make


@pytest.fixture
def make_runtime(docker_runtime_factory, settings):
    return lambda **fields: docker_runtime_factory(build_settings=settings(**fields))


def _cli(*args: str) -> subprocess.CompletedProcess:
    """``skillrun <args>`` as a process, without the host's skillrun settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKILLRUN_")}
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True, env=env,
                          timeout=60, check=True)


def _build_containers(docker_engine, shared_dir: Path) -> list[str]:
    """Build containers (running or not) of builds under ``shared_dir``."""
    found = docker_engine.client.containers.list(all=True, filters={"label": BUILD_LABEL})
    return [c.id for c in found if c.labels[BUILD_LABEL].startswith(str(shared_dir))]


async def test_a_run_imports_its_requirements_from_an_environment_built_in_a_container(
    make_runtime, shared_dir: Path, docker_engine
):
    lib = shared_dir / "lib"
    write_skill(lib, "uses-beta", files={"requirements.txt": "beta\n", "scripts/go.py": (
        "import sys, beta\nprint(beta.VERSION, sys.prefix)\n"
    )})
    runtime = make_runtime()
    skill = SkillRef(name="uses-beta", root=str(lib), path="uses-beta")
    result = await runtime.run(RunRequest(skill=skill, command='python scripts/go.py; echo "$VIRTUAL_ENV"'))
    assert result.exit_code == 0, result.stderr
    (info,) = runtime.environments.store.list()
    assert info.target.startswith("docker: cpython") and runtime.targets().image[:19] in info.target
    assert info.packages == ["alpha==2.0", "beta==1.0"]
    assert result.stdout.split() == ["2.0", str(info.path), str(info.path)]
    tamper = await runtime.run(RunRequest(skill=skill, command=(
        'touch "$VIRTUAL_ENV/planted" 2>/dev/null || echo refused; ls "$(dirname "$VIRTUAL_ENV")"; '
        'test -e "$(dirname "$(dirname "$VIRTUAL_ENV")")/locks" || echo no locks'
    )))
    assert tamper.stdout == f"refused\n{info.key}\nno locks\n", "a run sees its own environment and no other"
    assert not (info.path / "planted").exists()
    assert _build_containers(docker_engine, shared_dir) == []

    runtime.environments.store.remove(info.key)  # an operator's prune: the next run builds it again
    rebuilt = await runtime.run(RunRequest(skill=skill, command="python scripts/go.py"))
    assert rebuilt.exit_code == 0 and rebuilt.stdout.split()[0] == "2.0", rebuilt.stderr


async def test_a_skill_with_a_debian_package_runs_in_a_derived_image_built_once(
    make_runtime, shared_dir: Path, docker_engine, derived_images
):
    lib = shared_dir / "lib"
    write_skill(lib, "jq-user")
    write_skill(lib, "plain")
    (lib / "skillrun.toml").write_text('[skills.jq-user]\ndebian = ["jq"]\n')
    runtime = make_runtime()
    jq_skill = SkillRef(name="jq-user", root=str(lib), path="jq-user")
    result = await runtime.run(RunRequest(
        skill=jq_skill, workspace_id="deb", command="""echo '{"a": [1, 2]}' | jq -c '.a | add' | tee "$WORK_DIR/sum" """,
    ))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "3\n"
    tag = runtime.images.tag(runtime.targets().image, ("jq",))
    (image,) = [image for image in runtime.images.list() if image.tag == tag]
    assert tag.startswith(f"{REPOSITORY}:") and image.packages == ["jq"] and image.containers == 1
    derived = docker_engine.client.api.inspect_container(runtime.container_id("deb", tag))
    assert derived["HostConfig"]["ReadonlyRootfs"] is True and derived["HostConfig"]["CapDrop"] == ["ALL"]
    assert derived["HostConfig"]["NetworkMode"] == "none" and result.timings.exec_via == "executor"
    assert sorted(derived["HostConfig"]["CapAdd"]) == ["KILL", "SETGID", "SETPCAP", "SETUID"]  # the executor's
    plain = await runtime.run(RunRequest(
        skill=SkillRef(name="plain", root=str(lib), path="plain"), workspace_id="deb",
        command='cat "$WORK_DIR/sum"; command -v jq || echo no jq',
    ))
    assert plain.stdout == "3\nno jq\n", "the workspace's sandbox-image container sees the same workspace, no jq"
    assert runtime.container_id("deb") not in (None, runtime.container_id("deb", tag))

    again = make_runtime()  # another worker: the image is found by its tag, not built again
    started = time.monotonic()
    reused = await again.run(RunRequest(skill=jq_skill, command="jq --version"))
    assert reused.stdout.startswith("jq-") and time.monotonic() - started < 10
    assert [i.id for i in again.images.list() if i.tag == tag] == [image.id]

    listed = _cli("envs", "list", "--json", "--work-root", str(again.work_root))
    (shown,) = [i for i in json.loads(listed.stdout)["images"] if i["tag"] == tag]
    assert shown["containers"] == 2 and shown["packages"] == ["jq"] and shown["size_bytes"] > 0
    runtime.remove_containers()
    again.remove_containers()
    store, digest = runtime.environments.store, tag.rsplit(":", 1)[1]
    assert (store.images / f"{digest}.used").is_file() and (store.root / ".locks" / f"image-{digest}.lock").is_file()
    pruned = _cli("envs", "prune", "--unused-days", "0", "--json", "--work-root", str(runtime.work_root))
    assert json.loads(pruned.stdout)["removed_images"] == [tag], pruned.stdout + pruned.stderr
    assert not docker_engine.client.images.list(name=tag)
    assert not (store.images / f"{digest}.used").exists(), "the image's use record outlived it"
    assert not (store.root / ".locks" / f"image-{digest}.lock").exists(), "the image's lock file outlived it"


async def test_a_debian_package_that_does_not_exist_fails_with_apts_message(
    make_runtime, shared_dir: Path, derived_images
):
    lib = shared_dir / "lib"
    write_skill(lib, "ghost")
    (lib / "skillrun.toml").write_text('[skills.ghost]\ndebian = ["no-such-package-skillrun"]\n')
    runtime = make_runtime()
    with pytest.raises(EnvironmentBuildError) as caught:
        await runtime.run(RunRequest(skill=SkillRef(name="ghost", root=str(lib), path="ghost"), command="true"))
    assert "Unable to locate package no-such-package-skillrun" in str(caught.value), caught.value
    assert not [i for i in runtime.images.list() if "no-such-package-skillrun" in i.packages]


async def test_a_requirement_the_index_does_not_have_fails_with_uvs_message(make_runtime, shared_dir: Path):
    lib = shared_dir / "lib"
    write_skill(lib, "missing", files={"requirements.txt": "no-such-package-anywhere\n"})
    runtime = make_runtime()
    with pytest.raises(EnvironmentBuildError) as caught:
        await runtime.run(RunRequest(skill=SkillRef(name="missing", root=str(lib), path="missing"), command="true"))
    message = str(caught.value)
    assert "resolving the dependencies failed" in message and "no-such-package-anywhere" in message, message
    assert runtime.environments.store.list() == []


async def test_a_conflict_between_the_skill_and_the_manifest_fails_with_the_resolvers_message(
    make_runtime, shared_dir: Path
):
    lib = shared_dir / "lib"
    write_skill(lib, "torn", files={"requirements.txt": "alpha<2\n"})
    (lib / "skillrun.toml").write_text('[skills.torn]\npython = ["alpha>=2"]\n')
    runtime = make_runtime()
    with pytest.raises(EnvironmentBuildError) as caught:
        await runtime.run(RunRequest(skill=SkillRef(name="torn", root=str(lib), path="torn"), command="true"))
    assert "alpha<2" in str(caught.value) and "alpha>=2" in str(caught.value), str(caught.value)
    assert runtime.environments.store.list() == []


async def test_a_source_distribution_whose_build_fails_reports_its_message(make_runtime, shared_dir: Path, dists: Path):
    sdist(dists, "broken", "1.0", 'raise RuntimeError("the compiler is on fire")\n')
    lib = shared_dir / "lib"
    write_skill(lib, "b", files={"requirements.txt": "broken\n"})
    runtime = make_runtime()
    with pytest.raises(EnvironmentBuildError, match="the compiler is on fire"):
        await runtime.run(RunRequest(skill=SkillRef(name="b", root=str(lib), path="b"), command="true"))
    assert runtime.environments.store.list() == []


async def test_an_environment_past_the_size_cap_is_refused(make_runtime, shared_dir: Path, dists: Path):
    wheel(dists, "bulky", "1.0", "X = 1\n", extra_files={"bulky_data.bin": os.urandom(3 * 1024 * 1024)})
    lib = shared_dir / "lib"
    write_skill(lib, "big", files={"requirements.txt": "bulky\n"})
    runtime = make_runtime(max_bytes=1024 * 1024)
    with pytest.raises(EnvironmentBuildError, match="past the cap of 1048576 bytes"):
        await runtime.run(RunRequest(skill=SkillRef(name="big", root=str(lib), path="big"), command="true"))
    assert runtime.environments.store.list() == []


async def test_a_run_that_will_not_wait_is_told_its_environment_is_not_built(make_runtime, shared_dir: Path):
    lib = shared_dir / "lib"
    write_skill(lib, "later", files={"requirements.txt": "alpha\n"})
    runtime = make_runtime()
    with pytest.raises(EnvironmentNotReadyError, match="not built yet"):
        await runtime.run(RunRequest(skill=SkillRef(name="later", root=str(lib), path="later"), command="true",
                                     wait_for_environment=False))
    assert runtime.environments.store.list() == []


async def test_a_build_that_runs_forever_is_stopped_at_the_timeout_with_its_container(
    make_runtime, shared_dir: Path, dists: Path, docker_engine
):
    marker = f"{3000 + random.random():.9f}"
    sdist(dists, "forever", "1.0", f'import subprocess\nsubprocess.run(["sleep", "{marker}"])\n')
    lib = shared_dir / "lib"
    write_skill(lib, "f", files={"requirements.txt": "forever\n"})
    runtime = make_runtime(timeout=8.0)
    started = time.monotonic()
    with pytest.raises(EnvironmentBuildError, match="did not finish within 8 s"):
        await runtime.run(RunRequest(skill=SkillRef(name="f", root=str(lib), path="f"), command="true"))
    assert time.monotonic() - started < 30
    assert running_with(marker) == [], "the build's process outlived its timeout"
    assert _build_containers(docker_engine, shared_dir) == [], "the build's container outlived its timeout"


async def test_a_build_finds_nothing_of_the_host(make_runtime, shared_dir: Path, dists: Path, work_root: Path,
                                                 monkeypatch):
    monkeypatch.setenv("SKILLRUN_TEST_SECRET", "worker-secret-value")
    other = work_root / "ws_other"
    other.mkdir(mode=0o700)
    (other / "notes.txt").write_text("another tenant's notes")
    runtime = make_runtime(ca_bundle=CA_BUNDLE)
    probes = {
        "shadow": "/etc/shadow", "root_home": "/root", "other_workspace": str(other / "notes.txt"),
        "docker_socket": "/var/run/docker.sock", "store_locks": str(runtime.environments.store.locks),
    }
    code = (
        "import os, json\nfound = {}\n"
        f"for name, path in {probes!r}.items():\n"
        "    try:\n"
        "        found[name] = os.listdir(path) if os.path.isdir(path) else open(path, 'rb').read(64).hex()\n"
        "    except OSError:\n"
        "        found[name] = None\n"
        "environs = []\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        environs.append(open(f'/proc/{pid}/environ', 'rb').read())\n"
        "    except OSError:\n"
        "        pass\n"
        "found['secret_in_env'] = any(b'worker-secret-value' in e for e in environs)\n"
        "found['uid'] = os.getuid()\n"
        "found['ssl'] = os.environ.get('SSL_CERT_FILE')\n"
        "found['mounts'] = [(line.split()[4], line.split(' - ')[1].split()[0]) for line in open('/proc/self/mountinfo')]\n"
        "raise RuntimeError('PROBE:' + json.dumps(found))\n"
    )
    sdist(dists, "nosy", "1.0", code)
    lib = shared_dir / "lib"
    write_skill(lib, "nosy", files={"requirements.txt": "nosy\n"})
    with pytest.raises(EnvironmentBuildError) as caught:
        await runtime.run(RunRequest(skill=SkillRef(name="nosy", root=str(lib), path="nosy"), command="true"))
    found = json.loads(str(caught.value).rsplit("PROBE:", 1)[1].splitlines()[0])
    assert found["uid"] != 0
    for name in probes:
        assert found[name] is None, f"a build read {name}: {found[name]}"
    assert found["secret_in_env"] is False
    assert found["ssl"] == "/opt/skillrun/ca-bundle.crt"
    virtual = {"overlay", "proc", "tmpfs", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2"}
    shown = sorted(point for point, kind in found["mounts"] if kind not in virtual)
    folders = [point for point in shown if point.startswith(str(shared_dir))]
    rest = [point for point in shown if point not in folders and point not in ENGINE_FILES]
    assert len(folders) == 1 and rest == ["/opt/skillrun/bin/uv", "/opt/skillrun/ca-bundle.crt"], shown


async def test_two_builds_of_the_same_environment_at_once_build_it_once(shared_dir: Path, settings, docker_engine):
    lib = shared_dir / "lib"
    skill = write_skill(lib, "shared", files={"requirements.txt": "beta\n"})
    client = docker_engine.client
    one, two = (docker_environments(shared_dir / "store", lambda: client, DockerTargets(lambda: client,
                                    "skillrun/sandbox:latest"), settings()) for _ in range(2))
    said: list[str] = []
    first, second = await asyncio.gather(one.prepare(skill, lib, "shared", said.append),
                                         two.prepare(skill, lib, "shared", said.append))
    assert first.state == second.state == "ready", (first.message, second.message)
    assert first.info.key == second.info.key and first.info.built_at == second.info.built_at
    assert [p.name for p in (shared_dir / "store" / "envs").iterdir() if p.is_dir()] == [first.info.key]
    assert [m.split()[0] for m in said if not m.startswith("built")] == ["resolving", "installing"], said
