"""Node environments built for real with npm, from an npm registry of our own: sharing, runs, and every bad input."""

from __future__ import annotations

import asyncio
import json
import os
import socket
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.environment_stores import built, environments_maker, left_building
from tests.npm_registry import NpmPackage, NpmRegistry
from worker.contract import RunRequest, SkillRef
from worker.errors import EnvironmentNotReadyError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.slow


def _packages() -> list[NpmPackage]:
    """``padder`` 1.0.0 and 1.2.0; ``greeter`` 2.1.0 (needs ``padder@^1``, has a ``greet`` command)."""
    return [
        NpmPackage("padder", "1.0.0", files={"index.js": "module.exports = s => '1.0:' + s;\n"}),
        NpmPackage("padder", "1.2.0", files={"index.js": "module.exports = s => '1.2:' + s;\n"}),
        NpmPackage("greeter", "2.1.0", dependencies={"padder": "^1.0.0"}, bin={"greet": "cli.js"},
                   files={"cli.js": "#!/usr/bin/env node\nconsole.log(require('padder')('hello'));\n"}),
    ]


@pytest.fixture
def registry() -> NpmRegistry:
    served = NpmRegistry(_packages())
    yield served
    served.close()


@pytest.fixture
def make_envs(shared_dir: Path, registry: NpmRegistry):
    with environments_maker(shared_dir / "envs", npm_registry=registry.url, sandboxed=IS_ROOT, timeout=120.0) as make:
        yield make


def _package(**dependencies: str) -> str:
    return json.dumps({"name": "a-skill", "version": "1.0.0", "dependencies": dependencies})


async def test_a_node_environment_is_built_once_and_shared_by_every_skill_with_the_same_packages(
    shared_dir: Path, make_envs, registry: NpmRegistry
):
    first = write_skill(shared_dir / "lib-a", "one", files={"package.json": _package(greeter="^2")})
    second = write_skill(shared_dir / "lib-b", "two", files={"package.json": _package(greeter="^2")})
    envs = make_envs()
    before = envs.status(first, first.parent, "one")
    assert before.state == "not built" and before.node.dependencies == ("greeter@^2",)
    messages: list[str] = []
    ready = await envs.prepare(first, first.parent, "one", progress=messages.append)
    assert ready.state == "ready", ready.message
    assert ready.node.info.packages == ["greeter@2.1.0", "padder@1.2.0"]
    assert ready.node.info.kind == "node"
    assert any("installing 1 Node package(s) with npm" in m for m in messages)
    assert ready.as_json()["node"]["packages"] == ["greeter@2.1.0", "padder@1.2.0"]
    fetched = len(registry.requests)
    again = await envs.prepare(second, second.parent, "two")
    assert again.state == "ready" and again.node.info.key == ready.node.info.key
    assert len(registry.requests) == fetched, "the second skill with the same packages reached the registry"
    assert built(shared_dir / "envs") == [ready.node.info.key] and left_building(shared_dir / "envs") == []
    if IS_ROOT:
        owners = {os.lstat(os.path.join(d, n)).st_uid for d, _, fs in os.walk(ready.node.info.path) for n in fs}
        assert owners == {0}, "the build's user id (handed to a workspace next) still owns files of the environment"


async def test_a_run_requires_its_packages_and_runs_their_commands_but_cannot_change_them(
    shared_dir: Path, make_envs, work_root: Path
):
    write_skill(shared_dir / "lib", "docs", files={
        "package.json": _package(greeter="^2"),
        "scripts/make.js": "console.log(require('greeter').version, require('padder')('x'));\n",
    })
    async with LocalWorkspaceRuntime(work_root, environments=make_envs()) as runtime:
        skill = SkillRef(name="docs", root=str(shared_dir / "lib"), path="docs")
        result = await runtime.run(RunRequest(skill=skill, command="node scripts/make.js && greet",
                                              wait_for_environment=True))
        assert result.exit_code == 0, result.stderr
        assert result.stdout == "2.1.0 1.2:x\n1.2:hello\n"
        from_work = await runtime.run(RunRequest(
            skill=skill, command="cd $WORK_DIR && echo \"console.log(require('padder')('w'))\" > w.js && node w.js"))
        assert from_work.stdout == "1.2:w\n", from_work.stderr
        tamper = await runtime.run(RunRequest(skill=skill, command=(
            'touch "$NODE_PATH/planted" "$NODE_PATH/padder/index.js" 2>/dev/null || echo refused; '
            'ls "$NODE_PATH/../.."')))
    assert tamper.stdout.splitlines()[0] == "refused"
    if IS_ROOT:  # sandboxed: the run is shown its own environments and no other
        assert tamper.stdout.splitlines()[1:] == built(shared_dir / "envs")
    assert not any((shared_dir / "envs" / "envs").glob("*/node_modules/planted"))


async def test_the_manifest_declares_node_packages_for_a_skill_without_a_package_json(shared_dir: Path, make_envs):
    skill = write_skill(shared_dir / "lib", "mirrored")
    (shared_dir / "lib" / "skillrun.toml").write_text('[skills.mirrored]\nnode = ["padder@1.0.0", "greeter"]\n')
    status = await make_envs().prepare(skill, skill.parent, "mirrored")
    assert status.state == "ready", status.message
    assert status.node.dependencies == ("greeter@latest", "padder@1.0.0")
    assert "padder@1.0.0" in status.node.info.packages and "greeter@2.1.0" in status.node.info.packages


async def test_a_run_that_will_not_wait_is_told_its_node_environment_is_notbuilt(
    shared_dir: Path, make_envs, work_root: Path
):
    write_skill(shared_dir / "lib", "later", files={"package.json": _package(padder="1")})
    async with LocalWorkspaceRuntime(work_root, environments=make_envs()) as runtime:
        skill = SkillRef(name="later", root=str(shared_dir / "lib"), path="later")
        with pytest.raises(EnvironmentNotReadyError) as caught:
            await runtime.run(RunRequest(skill=skill, command="true", wait_for_environment=False))
    assert "Node environment is not built yet" in str(caught.value) and "skillrun skills prepare" in str(caught.value)
    assert built(shared_dir / "envs") == []


async def test_a_package_the_registry_does_not_have_fails_with_npms_message(shared_dir: Path, make_envs):
    skill = write_skill(shared_dir / "lib", "missing", files={"package.json": _package(**{"no-such-package": "1"})})
    status = await make_envs().prepare(skill, skill.parent, "missing")
    assert status.state == "failed" and status.node.state == "failed"
    assert "installing the Node packages failed" in status.message and "no-such-package" in status.message
    assert "404" in status.message, status.message
    assert built(shared_dir / "envs") == [] and left_building(shared_dir / "envs") == []
    assert make_envs().status(skill, skill.parent, "missing").state == "failed"


async def test_a_lock_file_that_disagrees_with_package_json_fails_with_npms_message(
    shared_dir: Path, make_envs, registry: NpmRegistry
):
    skill = write_skill(shared_dir / "lib", "locked", files={"package.json": _package(padder="1.0.0")})
    first = await make_envs().prepare(skill, skill.parent, "locked")
    assert first.state == "ready", first.message
    lock = (first.node.info.path / "package-lock.json").read_text()
    assert '"version": "1.0.0"' in lock
    (skill / "package-lock.json").write_text(lock)
    exact = await make_envs().prepare(skill, skill.parent, "locked")
    assert exact.state == "ready" and exact.node.info.packages == ["padder@1.0.0"], exact.message
    (skill / "package.json").write_text(_package(padder="1.0.0", greeter="^2"))
    torn = await make_envs().prepare(skill, skill.parent, "locked")
    assert torn.state == "failed", torn.message
    assert "npm ci" in torn.message and "in sync" in torn.message, torn.message
    assert left_building(shared_dir / "envs") == []


@pytest.mark.parametrize("spec, reason", [
    ("file:../../etc", "no local paths"),
    ("git+https://example.com/repo.git", "no git"),
    ("someone/repo", "no git"),
])
async def test_a_dependency_from_outside_the_registry_is_refused_before_anything_isbuilt(
    shared_dir: Path, make_envs, registry: NpmRegistry, spec: str, reason: str
):
    skill = write_skill(shared_dir / "lib", "outside", files={"package.json": _package(thing=spec)})
    envs = make_envs()
    status = envs.status(skill, skill.parent, "outside")
    assert status.state == "invalid" and reason in status.message and "package.json" in status.message
    assert (await envs.prepare(skill, skill.parent, "outside")).state == "invalid"
    assert registry.requests == [] and built(shared_dir / "envs") == []


async def test_a_node_environment_past_the_size_cap_is_refused_and_removed(
    shared_dir: Path, make_envs, registry: NpmRegistry
):
    """An install script that writes without end (a 2 GiB ``node_modules``) is stopped at the cap."""
    registry.publish(NpmPackage("bloat", "1.0.0", scripts={
        "postinstall": "node -e \"const f=require('fs').openSync('blob','w'); const b=Buffer.alloc(1<<20); "
                       "for(;;) require('fs').writeSync(f,b)\""}))
    skill = write_skill(shared_dir / "lib", "big", files={"package.json": _package(bloat="1.0.0")})
    status = await make_envs(max_bytes=4 * 1024 * 1024).prepare(skill, skill.parent, "big")
    assert status.state == "failed" and "past the cap of 4194304 bytes" in status.message, status.message
    assert built(shared_dir / "envs") == [] and left_building(shared_dir / "envs") == []


async def test_two_workers_preparing_the_same_node_environment_build_it_once(shared_dir: Path, make_envs):
    skill = write_skill(shared_dir / "lib", "shared", files={"package.json": _package(greeter="^2")})
    one, two = make_envs(), make_envs()
    first, second = await asyncio.gather(
        one.prepare(skill, skill.parent, "shared"), two.prepare(skill, skill.parent, "shared"))
    assert first.state == second.state == "ready"
    assert first.node.info.key == second.node.info.key and first.node.info.built_at == second.node.info.built_at
    assert built(shared_dir / "envs") == [first.node.info.key] and left_building(shared_dir / "envs") == []


@pytest.mark.root
async def test_an_install_script_finds_nothing_of_the_host_and_reaches_only_the_registry(
    shared_dir: Path, make_envs, registry: NpmRegistry, work_root: Path, monkeypatch
):
    monkeypatch.setenv("SKILLRUN_TEST_SECRET", "worker-secret-value")
    loopback = socket.socket()
    loopback.bind(("127.0.0.1", 0))
    loopback.listen()
    other = work_root / "ws_other"
    other.mkdir(mode=0o700)
    (other / "notes.txt").write_text("another tenant's notes")
    probes = {"shadow": "/etc/shadow", "root_home": "/root", "other_workspace": str(other / "notes.txt"),
              "store_locks": str(shared_dir / "envs" / "locks")}
    script = (
        "const fs = require('fs'), net = require('net'), http = require('http'); const found = {};\n"
        f"for (const [name, path] of Object.entries({json.dumps(probes)})) {{\n"
        "  try { found[name] = fs.statSync(path).isDirectory() ? fs.readdirSync(path) : fs.readFileSync(path, 'hex'); }"
        " catch (e) { found[name] = null; }\n}\n"
        "found.secret = fs.readdirSync('/proc').filter(p => /^\\d+$/.test(p)).some(p => {\n"
        "  try { return fs.readFileSync(`/proc/${p}/environ`, 'latin1').includes('worker-secret-value'); }"
        " catch (e) { return false; } });\n"
        "found.uid = process.getuid();\n"
        "const done = () => { console.error('PROBE:' + JSON.stringify(found)); process.exit(1); };\n"
        f"const s = net.connect({loopback.getsockname()[1]}, '127.0.0.1');\n"
        "s.setTimeout(3000, () => { found.loopback = false; s.destroy(); outside(); });\n"
        "s.on('connect', () => { found.loopback = true; s.destroy(); outside(); });\n"
        "s.on('error', () => { found.loopback = false; outside(); });\n"
        "function outside() {\n"
        "  const r = http.get('http://example.com/', res => { found.direct = res.statusCode; proxied(); });\n"
        "  r.on('error', e => { found.direct = e.code; proxied(); }); r.setTimeout(5000, () => r.destroy());\n}\n"
        "function proxied() {\n"
        "  const p = new URL(process.env.HTTP_PROXY);\n"
        "  const r = http.get({host: p.hostname, port: p.port, path: 'http://example.com/',\n"
        "                      headers: {Host: 'example.com'}}, res => { found.proxied = res.statusCode; done(); });\n"
        "  r.on('error', e => { found.proxied = e.code; done(); });\n}\n"
    )
    registry.publish(NpmPackage("nosy-probe", "1.0.0", files={"probe.js": script},
                                scripts={"postinstall": "node probe.js"}))
    skill = write_skill(shared_dir / "lib", "nosy", files={"package.json": _package(**{"nosy-probe": "1.0.0"})})
    status = await make_envs().prepare(skill, skill.parent, "nosy")
    assert status.state == "failed", status.message
    found = json.loads(status.message.rsplit("PROBE:", 1)[1].splitlines()[0])
    assert found["uid"] != 0
    for name in probes:
        assert found[name] is None, f"an install script read {name}: {found[name]}"
    assert found["secret"] is False
    assert found["loopback"] is False, "an install script reached a service on the host's loopback"
    assert isinstance(found["direct"], str), f"an install script reached the network itself: {found['direct']}"
    assert found["proxied"] == 403, f"the build's proxy let an install script past the registry: {found['proxied']}"
    loopback.close()
