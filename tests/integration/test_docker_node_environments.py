"""Node environments on the Docker runtime: built with the sandbox image's own npm in a throwaway container, from an
npm registry of our own, and used by runs in the workspace's container."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.npm_registry import NpmPackage, NpmRegistry
from worker.contract import RunRequest, SkillRef
from worker.environments import BuildSettings
from worker.runtimes.docker.builds import BUILD_LABEL

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
def registry() -> NpmRegistry:
    served = NpmRegistry([
        NpmPackage("padder", "1.2.0", files={"index.js": "module.exports = s => '1.2:' + s;\n"}),
        NpmPackage("greeter", "2.1.0", dependencies={"padder": "^1.0.0"}, bin={"greet": "cli.js"},
                   files={"cli.js": "#!/usr/bin/env node\nconsole.log(require('padder')('hello'));\n"}),
    ])
    yield served
    served.close()


@pytest.fixture
def make_runtime(docker_runtime_factory, registry: NpmRegistry):
    def make(**fields):
        settings = BuildSettings(**{"npm_registry": registry.url, "sandboxed": IS_ROOT, "timeout": 120.0, **fields})
        return docker_runtime_factory(build_settings=settings)

    return make


def _package(**dependencies: str) -> str:
    return json.dumps({"name": "a-skill", "version": "1.0.0", "dependencies": dependencies})


async def test_a_docker_run_requires_its_node_packages_built_in_a_container_of_the_sandbox_image(
    make_runtime, shared_dir: Path, docker_engine
):
    lib = shared_dir / "lib"
    write_skill(lib, "docs", files={"package.json": _package(greeter="^2"),
                                    "scripts/make.js": "console.log(require('greeter').version)\n"})
    runtime = make_runtime()
    skill = SkillRef(name="docs", root=str(lib), path="docs")
    status = await runtime.prepare_environment(lib / "docs", lib, "docs")
    assert status.state == "ready", status.message
    node = status.node.info
    assert node.packages == ["greeter@2.1.0", "padder@1.2.0"]
    assert node.target.startswith("docker: node v") and runtime.targets().image[:19] in node.target
    result = await runtime.run(RunRequest(skill=skill, command="node scripts/make.js && greet && npm --version"))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:2] == ["2.1.0", "1.2:hello"] and lines[2][0].isdigit(), "npm is in the sandbox image"
    tamper = await runtime.run(RunRequest(skill=skill, command=(
        'touch "$NODE_PATH/planted" 2>/dev/null || echo refused; ls "$NODE_PATH/../.."')))
    assert tamper.stdout == f"refused\n{node.key}\n", "a run sees its own environment and no other"
    found = docker_engine.client.containers.list(all=True, filters={"label": BUILD_LABEL})
    assert [c for c in found if c.labels[BUILD_LABEL].startswith(str(shared_dir))] == []


async def test_a_docker_node_build_that_names_a_missing_package_fails_with_npms_message(
    make_runtime, shared_dir: Path
):
    lib = shared_dir / "lib"
    write_skill(lib, "missing", files={"package.json": _package(**{"not-published": "1"})})
    status = await make_runtime().prepare_environment(lib / "missing", lib, "missing")
    assert status.state == "failed" and "not-published" in status.message and "404" in status.message, status.message
