"""Attacks on Node dependency environments (``package.json``, ``package-lock.json``, the manifest's ``node`` key)
by a hostile team, for real: npm, bubblewrap, the egress proxy, sandbox user ids, the local runtime.

A team controls its skill's ``package.json`` (its scripts run in the build: the root package's ``postinstall`` is
used below as the hostile code, since only ``package.json`` and the lock are copied into a build), its lock (what
npm ci fetches and links), and the manifest's ``node`` entries. Each test mounts one attack and asserts the safe
outcome; a test that fails on the current code is a hole (see its docstring for the cause).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import stat
import threading
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.environment_stores import environments_maker
from tests.npm_registry import NpmPackage, NpmRegistry
from tests.processes import running_with
from tests.services import unavailable
from worker import defaults
from worker.contract import RunRequest, SkillRef
from worker.environments import (
    BuildSettings,
    EnvironmentStore,
    SkillEnvironments,
)
from worker.environments.declarations import read_declaration, read_manifest
from worker.environments.steps import BUILD_PROCESSES
from worker.errors import DependencyError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.slow

SESSION = uuid.uuid4().hex[:8]
VICTIM_UID = 29_778
"""Another tenant's user id (below the sandbox range)."""


# --- fixtures and helpers ------------------------------------------------------------------------------------------

@pytest.fixture
def registry() -> NpmRegistry:
    served = NpmRegistry([
        NpmPackage("padder", "1.0.0", files={"index.js": "module.exports = s => '1.0:' + s;\n"}),
    ])
    yield served
    served.close()


@pytest.fixture
def other_registry() -> NpmRegistry:
    """A second registry (another host:port) that no build may reach."""
    served = NpmRegistry([NpmPackage("padder", "1.0.0", files={"index.js": "module.exports = 'OTHER';\n"})])
    yield served
    served.close()


@pytest.fixture
def store_root(shared_dir: Path) -> Path:
    return shared_dir / "envs"


@pytest.fixture
def make_envs(store_root: Path, registry: NpmRegistry):
    with environments_maker(store_root, npm_registry=registry.url, sandboxed=IS_ROOT, timeout=60.0) as make:
        yield make


def _package(dependencies: dict | None = None, **fields) -> str:
    return json.dumps({"name": "a-skill", "version": "1.0.0", "dependencies": dependencies or {}, **fields})


def _script(js: str) -> dict:
    """``scripts`` whose ``postinstall`` (the root package's, run by npm in the build) runs ``js`` with ``FOLDER``
    (the build folder) and ``ENV`` (the environment being built, its working folder) defined."""
    prelude = ("const fs = require('fs'), path = require('path'), cp = require('child_process');\n"
               "const FOLDER = path.dirname(process.env.HOME), ENV = path.join(FOLDER, 'env');\n")
    encoded = base64.b64encode((prelude + js).encode()).decode()
    return {"postinstall": f"node -e \"eval(Buffer.from('{encoded}', 'base64').toString())\""}


def _skill(shared_dir: Path, name: str, package: str, **files: str) -> Path:
    return write_skill(shared_dir / "lib", name, files={"package.json": package, **files})


async def _prepare(envs: SkillEnvironments, skill: Path):
    return await envs.prepare(skill, skill.parent, skill.name)


def _built(store_root: Path) -> list[str]:
    envs = store_root / "envs"
    return sorted(p.name for p in envs.iterdir() if p.is_dir()) if envs.is_dir() else []


def _left_building(store_root: Path) -> list[str]:
    folder = store_root / ".building"
    return sorted(os.listdir(folder)) if folder.is_dir() else []


def _victim_folder(parent: Path, token: str) -> tuple[Path, Path, Path]:
    """Another tenant's private folder (0700, its own user id) with notes and something that looks like a lock."""
    folder = parent / f"ws_victim-{SESSION}"
    folder.mkdir(parents=True)
    notes = folder / "notes.txt"
    notes.write_text(token + "\n")
    lock = folder / "lock.json"
    lock.write_text(json.dumps({"lockfileVersion": 3, "token": token,
                                "packages": {"node_modules/stolen-secret": {"version": "6.6.6"}}}))
    for path in (notes, lock):
        os.chmod(path, 0o600)
        os.chown(path, VICTIM_UID, VICTIM_UID)
    os.chmod(folder, 0o700)
    os.chown(folder, VICTIM_UID, VICTIM_UID)
    return folder, notes, lock


def _unchanged(*paths: Path) -> list[tuple[str, int, int]]:
    return [(str(p), os.lstat(p).st_uid, stat.S_IMODE(os.lstat(p).st_mode)) for p in paths]


def _store_text(store_root: Path) -> str:
    """Everything the store's records say (the environments' ``.json``, failure records, locks)."""
    texts = []
    for folder in (store_root / "envs", store_root / "locks"):
        for entry in os.scandir(folder) if folder.is_dir() else ():
            if entry.is_file(follow_symlinks=False):
                texts.append(Path(entry.path).read_text(errors="replace"))
    return "\n".join(texts)


async def _wait_none_running(argument: str, seconds: float = 5.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while running_with(argument) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return running_with(argument)


# --- what a declaration may name (no build) ----------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    "file:../../etc", "FILE:/etc/passwd", "\u00a0file:../x", " link:..", "../x", "/etc", "~/x", "a/b",
    "git+ssh://git@example.com/x.git", "github:a/b", "gist:abc", "http://example.com/x.tgz",
])
def test_a_dependency_npm_would_take_from_outside_the_registry_is_refused(tmp_path: Path, spec: str):
    skill = write_skill(tmp_path, "outside", files={"package.json": _package({"thing": spec})})
    with pytest.raises(DependencyError, match="only versions, tags"):
        read_declaration(skill, "outside")


@pytest.mark.parametrize("spec", ["c:..", "C:", "x:y", "evil.tgz", "stolen.tar"])
def test_a_spec_npm_reads_as_a_local_path_without_a_slash_is_refused(tmp_path: Path, spec: str):
    """HOLE: ``declarations._check_node`` refuses local paths by their prefixes (``file:``, ``.``, ``/``) and by a
    ``/`` anywhere, but npm-package-arg also takes, on POSIX, a spec starting with a drive letter (``[a-zA-Z]:``:
    ``c:..``, ``x:y``) as a directory and a spec ending in ``.tgz``/``.tar``/``.tar.gz`` as a local tarball (both
    relative to the build's ``env``): ``npa.resolve('thing', 'c:..', '/b/env')`` is ``directory /b/env/c:..`` and
    ``'evil.tgz'`` is ``file /b/env/evil.tgz``. Both get through the check that promises "no local paths"."""
    skill = write_skill(tmp_path, "local", files={"package.json": _package({"thing": spec})})
    with pytest.raises(DependencyError):
        read_declaration(skill, "local")
    (tmp_path / "skillrun.toml").write_text(f'[skills.local]\nnode = ["thing@{spec}"]\n')
    with pytest.raises(DependencyError):
        read_manifest(tmp_path)


@pytest.mark.parametrize("table, value", [
    ("devDependencies", {"thing": "file:../../etc"}),
    ("peerDependencies", {"thing": "file:/etc"}),
    ("overrides", {"padder": "file:../../etc"}),
    ("overrides", {"padder": "git+ssh://git@example.com/x.git"}),
])
def test_local_and_git_sources_are_refused_wherever_package_json_names_them(tmp_path: Path, table: str, value: dict):
    """HOLE: ``declarations._package`` checks only ``dependencies`` and ``optionalDependencies``. npm also resolves
    ``peerDependencies`` (installed by default since npm 7), ``overrides`` (which replace a dependency's spec) and
    ``devDependencies`` (resolved into the ideal tree and the lock even with ``--omit=dev``); a ``file:`` or git
    source there goes to npm unchecked, past the promise that "local paths and git sources are refused"."""
    skill = write_skill(tmp_path, "sneaky", files={"package.json": _package({"padder": "1.0.0"}, **{table: value})})
    with pytest.raises(DependencyError):
        read_declaration(skill, "sneaky")


def test_a_package_name_with_a_trailing_line_break_is_refused(tmp_path: Path):
    """HOLE (minor): ``NODE_PACKAGE`` ends in ``$``, which Python's ``re`` also matches before a final ``\\n``: a
    ``dependencies`` key ``"padder\\n"`` passes ``_check_node`` (names are not stripped in ``_package``)."""
    skill = write_skill(tmp_path, "newline", files={"package.json": _package({"padder\n": "1.0.0"})})
    with pytest.raises(DependencyError, match="not an npm package name"):
        read_declaration(skill, "newline")


@pytest.mark.parametrize("value", [
    '"docx"', "[1]", '[["docx"]]', '{ a = "1" }', '["Docx"]', '["docx@file:../x"]', '["../../etc"]', '["@scope"]',
    '["docx@1\\u0007"]', '["docx@git+https://example.com/x"]', '["d\\u0131cx"]', '["docx@/etc/passwd"]',
    '["docx@npm"]', '["@"]', '["docx@github:a/b"]',
])
def test_the_manifests_node_key_with_weird_values_is_refused(tmp_path: Path, value: str):
    (tmp_path / "skillrun.toml").write_text(f"[skills.weird]\nnode = {value}\n")
    if value == '["docx@npm"]':  # a tag called npm: harmless, the registry's to answer
        assert read_manifest(tmp_path).node == {"weird": {"docx": "npm"}}
        return
    with pytest.raises(DependencyError):
        read_manifest(tmp_path)


@pytest.mark.parametrize("which", ["package.json", "package-lock.json"])
async def test_a_deeply_nested_package_json_or_lock_is_invalid_not_a_crash(shared_dir: Path, make_envs, which: str):
    """HOLE: ``declarations._package`` parses both files with ``json.loads`` and catches ``ValueError`` only; a
    file nested 100,000 deep (200 KB, far below the size bounds) makes ``json.loads`` raise ``RecursionError``
    (a ``RuntimeError``), which escapes ``read_declaration`` and ``SkillEnvironments.status`` / ``prepare``
    (they catch ``DependencyError``): one hostile skill crashes every status listing of its library."""
    nested = "[" * 100_000 + "]" * 100_000
    files = {"package.json": nested} if which == "package.json" else {"package.json": _package(),
                                                                       "package-lock.json": nested}
    skill = write_skill(shared_dir / "lib", "nested", files=files)
    envs = make_envs()
    status = envs.status(skill, skill.parent, "nested")
    assert status.state == "invalid" and which in status.message, status.message
    assert (await _prepare(envs, skill)).state == "invalid"


def test_a_huge_fifo_or_linked_lock_is_refused_at_once_without_quoting_it(tmp_path: Path):
    token = f"HOST_TOKEN_{uuid.uuid4().hex}"
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"token": token}))
    cases = {}
    for name in ("huge", "fifo", "link"):
        skill = write_skill(tmp_path / name, "locked", files={"package.json": _package({"padder": "1.0.0"})})
        lock = skill / "package-lock.json"
        if name == "huge":
            with open(lock, "w") as out:
                out.write('{"x": "')
                out.write("a" * (17 * 1024 * 1024))
                out.write('"}')
        elif name == "fifo":
            os.mkfifo(lock)
        else:
            lock.symlink_to(secret)
        cases[name] = skill
    for name, skill in cases.items():
        started = time.monotonic()
        with pytest.raises(DependencyError) as caught:
            read_declaration(skill, "locked")
        assert time.monotonic() - started < 5, f"{name}: the lock was not refused at once"
        assert "package-lock.json" in str(caught.value) and token not in str(caught.value), (name, caught.value)


@pytest.mark.parametrize("which", ["package.json", "package-lock.json", "skillrun.toml"])
async def test_a_declaration_file_that_is_a_folder_is_invalid_not_a_crash(shared_dir: Path, make_envs, which: str):
    """HOLE: ``declarations.read_plain_file`` opens the path (``O_RDONLY`` succeeds on a folder), then calls
    ``os.fdopen(fd, "rb")`` before its ``S_ISREG`` check; ``fdopen`` of a folder raises ``IsADirectoryError`` (an
    ``OSError``, not ``DependencyError``), which escapes ``read_declaration`` / ``read_manifest`` and
    ``SkillEnvironments.status`` / ``prepare``. The same function reads the lock a build leaves, so an install
    script that leaves a folder named ``package-lock.json`` crashes ``ensure_node`` too (see
    ``test_a_lock_the_build_rewrites_is_read_safely[folder]``)."""
    skill = write_skill(shared_dir / "lib", "foldered", files={"package.json": _package({"padder": "1.0.0"})})
    target = skill.parent / which if which == "skillrun.toml" else skill / which
    if target.exists():
        target.unlink()
    target.mkdir()
    envs = make_envs()
    try:
        status = envs.status(skill, skill.parent, "foldered")
    except OSError as exc:
        pytest.fail(f"the status of a skill with a folder for {which} crashed with {exc!r}")
    assert status.state == "invalid" and which in status.message, status.message


# --- hostile builds (root: sandboxed) ----------------------------------------------------------------------------

@pytest.mark.root
async def test_a_skills_npmrc_and_package_json_config_cannot_send_npm_to_another_registry(
    shared_dir: Path, make_envs, registry: NpmRegistry, other_registry: NpmRegistry
):
    skill = _skill(shared_dir, "redirect", _package(
        {"padder": "1.0.0"}, publishConfig={"registry": other_registry.url}, config={"registry": other_registry.url}),
        **{".npmrc": f"registry={other_registry.url}\n@evil:registry={other_registry.url}\n"})
    status = await _prepare(make_envs(), skill)
    assert status.state == "ready", status.message
    assert other_registry.requests == [], "the skill's own npm settings sent the build elsewhere"
    assert registry.requests and status.node.info.packages == ["padder@1.0.0"]
    assert (status.node.info.path / "node_modules" / "padder" / "index.js").read_text().startswith("module.exports = s")


@pytest.mark.root
@pytest.mark.parametrize("where", ["other-host", "file"])
async def test_a_lock_cannot_fetch_a_package_from_outside_the_registry(
    shared_dir: Path, make_envs, registry: NpmRegistry, other_registry: NpmRegistry, work_root: Path,
    store_root: Path, where: str
):
    token = f"VICTIM_TOKEN_{uuid.uuid4().hex}"
    victim, notes, _ = _victim_folder(work_root, token)
    before = _unchanged(victim, notes)
    dist = other_registry._documents["padder"]["versions"]["1.0.0"]["dist"]
    resolved = {"other-host": {"resolved": dist["tarball"], "integrity": dist["integrity"]},
                "file": {"resolved": f"file:{notes}"}}[where]
    lock = {"name": "a-skill", "version": "1.0.0", "lockfileVersion": 3, "requires": True, "packages": {
        "": {"name": "a-skill", "version": "1.0.0", "dependencies": {"padder": "1.0.0"}},
        "node_modules/padder": {"version": "1.0.0", **resolved}}}
    skill = _skill(shared_dir, "outside", _package({"padder": "1.0.0"}), **{"package-lock.json": json.dumps(lock)})
    status = await _prepare(make_envs(), skill)
    assert status.state == "failed", status.message
    assert other_registry.requests == [], "the build reached a host that is not the registry"
    assert _unchanged(victim, notes) == before
    assert token not in status.message and token not in _store_text(store_root)
    assert _built(store_root) == [] and _left_building(store_root) == []


@pytest.mark.root
async def test_a_lock_linking_a_host_folder_into_the_environment_leaves_the_link_unfollowed(
    shared_dir: Path, make_envs, work_root: Path, store_root: Path
):
    """A lock's ``"link": true`` entry with a ``resolved`` path climbing out of the build (to npm's own folder,
    which the sandbox shows): npm ci links it; the worker must neither copy, count, chown nor list what it leads
    to, and a run sees through it only what its sandbox shows anyway."""
    npm_folder = Path(os.path.realpath(shutil.which("npm"))).parents[1]
    version = json.loads((npm_folder / "package.json").read_text())["version"]
    before = _unchanged(npm_folder, npm_folder / "package.json")
    outside = os.path.relpath(npm_folder, store_root / ".building" / "any-build" / "env")  # npm's own spelling
    lock = {"name": "a-skill", "version": "1.0.0", "lockfileVersion": 3, "requires": True, "packages": {
        "": {"name": "a-skill", "version": "1.0.0", "dependencies": {"npm": version}},
        "node_modules/npm": {"resolved": outside, "link": True},
        outside: {"name": "npm", "version": version}}}
    skill = _skill(shared_dir, "linker", _package({"npm": version}), **{"package-lock.json": json.dumps(lock)})
    envs = make_envs()
    status = await _prepare(envs, skill)
    assert status.state == "ready", status.message
    env = status.node.info.path
    assert os.path.islink(env / "node_modules" / "npm"), "npm ci did not link (the attack did not happen)"
    assert status.node.info.size_bytes < 1024 * 1024, "the worker counted (followed) the linked host folder"
    async with LocalWorkspaceRuntime(work_root, environments=envs) as runtime:
        result = await runtime.run(RunRequest(
            skill=SkillRef(name="linker", root=str(skill.parent), path="linker"),
            command='touch "$NODE_PATH/npm/planted" 2>/dev/null || echo refused'))
    assert result.stdout == "refused\n", result.stdout + result.stderr
    assert not (npm_folder / "planted").exists()
    assert _unchanged(npm_folder, npm_folder / "package.json") == before
    assert _left_building(store_root) == []


@pytest.mark.root
async def test_links_and_fifos_an_install_script_plants_are_never_followed_by_the_worker_or_a_run(
    shared_dir: Path, make_envs, work_root: Path, store_root: Path
):
    token = f"VICTIM_TOKEN_{uuid.uuid4().hex}"
    victim, notes, victim_lock = _victim_folder(work_root, token)
    before = _unchanged(victim, notes, victim_lock)
    skill = _skill(shared_dir, "planter", _package({"padder": "1.0.0"}, scripts=_script(f"""
        fs.rmSync('package-lock.json', {{force: true}});
        fs.symlinkSync({json.dumps(str(victim_lock))}, 'package-lock.json');
        fs.mkdirSync('node_modules/.bin', {{recursive: true}});
        fs.symlinkSync({json.dumps(str(victim))}, 'node_modules/victim');
        fs.symlinkSync({json.dumps(str(notes))}, 'node_modules/.bin/greet');
        fs.symlinkSync({json.dumps(str(victim))}, 'node_modules/padder/linked-folder');
        cp.execFileSync('mkfifo', ['fifo', 'node_modules/fifo', 'node_modules/padder/index.fifo']);
    """)))
    envs = make_envs()
    started = time.monotonic()
    status = await _prepare(envs, skill)
    assert time.monotonic() - started < 50, "a FIFO the build planted held the worker"
    assert status.state == "ready", status.message
    assert _unchanged(victim, notes, victim_lock) == before, "the worker changed a host folder through a link"
    assert "stolen-secret@6.6.6" not in status.node.info.packages, "the worker read a host file as the build's lock"
    assert token not in _store_text(store_root) and token not in json.dumps(status.as_json())
    env = status.node.info.path
    assert os.path.islink(env / "node_modules" / "victim")  # kept as the build left it, but never followed
    async with LocalWorkspaceRuntime(work_root, environments=envs) as runtime:
        result = await runtime.run(RunRequest(
            skill=SkillRef(name="planter", root=str(skill.parent), path="planter"),
            command=('cat "$NODE_PATH/../package-lock.json"; cat "$NODE_PATH/victim/notes.txt"; greet; '
                     'ls "$NODE_PATH/padder/linked-folder/"; echo end')))
    assert result.stdout.rstrip().endswith("end"), result.stderr
    assert token not in result.stdout + result.stderr, "a run read another tenant's file through a planted link"
    assert _unchanged(victim, notes, victim_lock) == before


def _host_pids_work_in_root() -> None:
    """The swap below leads through ``/proc/<pid>/cwd`` for a low pid: inside the build's sandbox a process of the
    build working in the build folder, on the host a kernel thread working in ``/``."""
    try:
        if os.readlink("/proc/2/cwd") == "/":
            return
    except OSError:
        pass
    unavailable("needs a host whose low pids work in / (a kernel thread's /proc/2/cwd)")


@pytest.mark.root
async def test_an_install_script_that_swaps_its_env_for_a_link_to_a_host_folder_is_refused(
    shared_dir: Path, make_envs, work_root: Path, store_root: Path
):
    """The script moves ``env`` to ``<build folder>/<victim's path>`` and puts in its place a link to
    ``/proc/<pid>/cwd/<victim's path>`` (``pid`` a process of the build working in the build folder): inside the
    sandbox the link leads back to the real environment (npm finishes happily), on the host to another tenant's
    folder, which ``_seal`` would give to root and open to everyone if it followed it."""
    _host_pids_work_in_root()
    token = f"VICTIM_TOKEN_{uuid.uuid4().hex}"
    victim, notes, victim_lock = _victim_folder(work_root, token)
    before = _unchanged(victim, notes, victim_lock)
    relative = str(victim).lstrip("/")
    skill = _skill(shared_dir, "swapper", _package({"padder": "1.0.0"}, scripts=_script(f"""
        let pid = 0;
        for (let n = 2; n < 64 && !pid; n++) {{ try {{ if (fs.readlinkSync(`/proc/${{n}}/cwd`) === FOLDER) pid = n; }} catch (e) {{}} }}
        if (!pid) throw new Error('no process of the build works in its folder');
        const moved = path.join(FOLDER, {json.dumps(relative)});
        fs.mkdirSync(path.dirname(moved), {{recursive: true}});
        process.chdir(FOLDER);
        fs.renameSync('env', moved);
        fs.symlinkSync(`/proc/${{pid}}/cwd/` + {json.dumps(relative)}, 'env');
        if (!fs.existsSync('env/package.json')) throw new Error('the link does not lead back to env in the sandbox');
    """)))
    status = await _prepare(make_envs(), skill)
    assert status.state == "failed", status.message
    assert "not a folder" in status.message, status.message
    assert _unchanged(victim, notes, victim_lock) == before, "the worker sealed another tenant's folder"
    assert _built(store_root) == [] and _left_building(store_root) == []
    assert token not in status.message


@pytest.mark.root
async def test_an_install_script_leaves_nothing_running_and_touches_nothing_outside_its_build(
    shared_dir: Path, make_envs, store_root: Path
):
    seconds = f"{300 + int.from_bytes(os.urandom(4), 'big') % 10**6 / 10**6:.6f}"
    mark = f"planted-{uuid.uuid4().hex}"
    store = EnvironmentStore(store_root)
    store.ensure()
    sibling = store.building / f"sibling-{SESSION}"
    sibling.mkdir(mode=0o755)
    (sibling / "secret.txt").write_text("another build's file\n")
    os.chmod(sibling / "secret.txt", 0o644)
    probes = {
        "tmp": f"/tmp/{mark}", "shm": f"/dev/shm/{mark}", "building": str(store.building / mark),
        "store_envs": str(store_root / "envs" / mark), "store_locks": str(store_root / "locks" / mark),
        "store_root": str(store_root / mark), "sibling": str(sibling / mark),
    }
    skill = _skill(shared_dir, "lingerer", _package({"padder": "1.0.0"}, scripts=_script(f"""
        const found = {{}};
        const attempt = (name, f) => {{ try {{ f(); found[name] = true; }} catch (e) {{ found[name] = e.code || String(e); }} }};
        for (const [name, where] of Object.entries({json.dumps(probes)})) attempt(name, () => fs.writeFileSync(where, 'x'));
        attempt('sibling_read', () => {{ found.sibling_text = fs.readFileSync({json.dumps(str(sibling / "secret.txt"))}, 'utf8'); }});
        attempt('building_list', () => {{ found.building_entries = fs.readdirSync(path.dirname(FOLDER)); }});
        attempt('hard_passwd', () => fs.linkSync('/etc/passwd', 'hard-passwd'));
        attempt('hard_node', () => fs.linkSync(fs.realpathSync('/usr/bin/node'), 'hard-node'));
        cp.spawn('setsid', ['sleep', '{seconds}'], {{detached: true, stdio: 'ignore'}}).unref();
        cp.spawn('sh', ['-c', '(setsid nohup sleep {seconds} </dev/null >/dev/null 2>&1 &)'], {{stdio: 'ignore'}});
        fs.writeFileSync('probe.json', JSON.stringify(found));
    """)))
    async with store.exclusive("sibling"):  # a build under way: the sweep leaves its folder alone
        status = await _prepare(make_envs(), skill)
        assert status.state == "ready", status.message
        assert await _wait_none_running(seconds) == [], "a process an install script started outlived the build"
        found = json.loads((status.node.info.path / "probe.json").read_text())
        for name, where in probes.items():
            assert not os.path.lexists(where), f"an install script wrote {where} ({found[name]})"
        assert "sibling_text" not in found, "an install script read another build's folder"
        assert f"sibling-{SESSION}" not in (found.get("building_entries") or []), found
        assert sorted(os.listdir(sibling)) == ["secret.txt"]
    inodes = {(os.stat(p).st_dev, os.stat(p).st_ino) for p in ("/etc/passwd", os.path.realpath("/usr/bin/node"))}
    env = status.node.info.path
    linked = [str(p) for p in env.rglob("*") if not p.is_symlink() and (p.stat().st_dev, p.stat().st_ino) in inodes]
    assert linked == [], f"the environment holds hard links to host files: {linked} ({found})"
    assert os.stat("/etc/passwd").st_uid == 0 and stat.S_IMODE(os.stat("/etc/passwd").st_mode) == 0o644


@pytest.mark.root
async def test_a_fork_bomb_in_an_install_script_is_held_to_the_process_limit_and_ends_with_the_build(
    shared_dir: Path, make_envs
):
    seconds = f"{400 + int.from_bytes(os.urandom(4), 'big') % 10**6 / 10**6:.6f}"
    skill = _skill(shared_dir, "forker", _package({}, scripts=_script(f"""
        let started = 0;
        for (let i = 0; i < {BUILD_PROCESSES * 2}; i++) {{
            const child = cp.spawn('sleep', ['{seconds}'], {{detached: true, stdio: 'ignore'}});
            child.on('error', () => {{}});  // EAGAIN is reported here too, a tick later
            if (child.pid === undefined) break;
            child.unref();
            started++;
        }}
        fs.writeFileSync('started.json', JSON.stringify({{started}}));
    """)))
    status = await _prepare(make_envs(), skill)
    assert status.state == "ready", status.message
    started = json.loads((status.node.info.path / "started.json").read_text())["started"]
    assert 0 < started < BUILD_PROCESSES, started
    assert await _wait_none_running(seconds, 10) == [], "processes of the fork bomb outlived the build"


@pytest.mark.root
async def test_an_install_script_filling_tmp_fills_only_its_own_capped_tmpfs(shared_dir: Path, make_envs):
    mark = f"fill-{uuid.uuid4().hex}"
    skill = _skill(shared_dir, "filler", _package({}, scripts=_script(f"""
        const written = {{}};
        for (const where of ['/tmp/{mark}', '/dev/shm/{mark}']) {{
            written[where] = 0;
            try {{
                const f = fs.openSync(where, 'w'), chunk = Buffer.alloc(1 << 20, 1);
                for (let i = 0; i < 256; i++) {{ fs.writeSync(f, chunk); written[where] += chunk.length; }}
            }} catch (e) {{ written[where + ':error'] = e.code; }}
            try {{ fs.rmSync(where); }} catch (e) {{}}
        }}
        fs.writeFileSync('written.json', JSON.stringify(written));
    """)))
    status = await _prepare(make_envs(), skill)
    assert status.state == "ready", status.message
    written = json.loads((status.node.info.path / "written.json").read_text())
    for where in (f"/tmp/{mark}", f"/dev/shm/{mark}"):
        assert written[where] <= defaults.SANDBOX_TMPFS_BYTES, written
        assert written.get(where + ":error") == "ENOSPC", written
        assert not os.path.lexists(where)


@pytest.mark.root
async def test_an_install_script_that_never_ends_is_stopped_at_the_timeout_with_its_children(
    shared_dir: Path, make_envs, store_root: Path
):
    seconds = f"{600 + int.from_bytes(os.urandom(4), 'big') % 10**6 / 10**6:.6f}"
    skill = _skill(shared_dir, "stuck", _package({}, scripts=_script(f"""
        cp.spawn('setsid', ['sleep', '{seconds}'], {{detached: true, stdio: 'ignore'}}).unref();
        cp.execFileSync('sleep', ['{seconds}']);
    """)))
    started = time.monotonic()
    status = await _prepare(make_envs(timeout=4.0), skill)
    assert time.monotonic() - started < 30
    assert status.state == "failed" and "did not finish within 4 s" in status.message, status.message
    assert await _wait_none_running(seconds) == [], "a process of the stopped build outlived it"
    assert _built(store_root) == [] and _left_building(store_root) == []


DEEP = """
    fs.mkdirSync('deep'); process.chdir('deep');
    for (let i = 0; i < 1500; i++) { fs.mkdirSync('d'); process.chdir('d'); }
    process.chdir(ENV);
"""


@pytest.mark.root
async def test_a_deeply_nested_node_modules_is_a_clear_failure_not_a_crash(
    shared_dir: Path, make_envs, store_root: Path
):
    """HOLE: ``builder._seal`` (and ``store.folder_size``, the size watch's walk) walk the environment with
    ``os.fwalk``, which recurses once per level in Python 3.11: a tree 1,500 folders deep (an install script's
    ``mkdir d && cd d`` in a loop) raises ``RecursionError``, which no one catches: ``ensure_node`` and
    ``SkillEnvironments.prepare`` raise it to their caller instead of a failed status (nothing is recorded, and
    the skill is retried and crashes again)."""
    skill = _skill(shared_dir, "deep", _package({}, scripts=_script(DEEP)))
    try:
        status = await _prepare(make_envs(), skill)
    except RecursionError as exc:
        pytest.fail(f"preparing the skill crashed with {exc!r} instead of a failed status")
    assert status.state in ("ready", "failed"), status.message
    assert _left_building(store_root) == []


@pytest.mark.root
async def test_a_deep_tree_does_not_blind_the_size_cap_while_the_build_writes(
    shared_dir: Path, make_envs, store_root: Path
):
    """HOLE: ``builder._watch_size`` polls ``store.folder_size`` (``os.fwalk``, recursive): once the build has made
    a tree ~1,000 folders deep the walk raises ``RecursionError``, the watcher task dies (its exception never
    looked at) and nothing stops the build growing past ``BuildSettings.max_bytes`` until its timeout (default
    900 s): here 64 MiB are written under a 4 MiB cap. ``_seal`` then crashes the same way, so the cap is not
    enforced at the end either."""
    skill = _skill(shared_dir, "bloat", _package({}, scripts=_script(DEEP + """
        const sleep = ms => Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
        sleep(2500);
        const f = fs.openSync('blob', 'w'), chunk = Buffer.alloc(1 << 20, 1);
        for (let i = 0; i < 64; i++) { fs.writeSync(f, chunk); sleep(50); }
    """)))
    largest = [0]
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for blob in (store_root / ".building").glob("*/env/blob") if (store_root / ".building").is_dir() else ():
                try:
                    largest[0] = max(largest[0], os.lstat(blob).st_size)
                except OSError:
                    pass
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    crashed: BaseException | None = None
    try:
        status = await _prepare(make_envs(max_bytes=4 * 1024 * 1024), skill)
    except RecursionError as exc:
        crashed, status = exc, None
    finally:
        stop.set()
        watcher.join()
    assert largest[0] < 32 * 1024 * 1024, f"the build wrote {largest[0]} bytes under a cap of 4 MiB (unwatched)"
    assert crashed is None, f"preparing crashed with {crashed!r}"
    assert status.state == "failed" and ("past the cap" in status.message
                                         or "nested more than 256 deep" in status.message), status.message
    assert _built(store_root) == [] and _left_building(store_root) == []


@pytest.mark.root
async def test_folders_and_links_count_against_the_size_cap(shared_dir: Path, make_envs, store_root: Path):
    """HOLE: the size cap (``builder._seal``, ``store.folder_size``) adds up ``st_size`` of regular files alone;
    folders (a 4 KiB block each on ext4) and symbolic links (a block each past 60 bytes of target) count as 0. An
    install script that makes 20,000 empty folders and 5,000 long links puts ~100 MiB on the store's disk (and
    25,000 inodes) into a published environment under an 8 MiB cap; with the build's timeout it can make
    millions."""
    skill = _skill(shared_dir, "inodes", _package({}, scripts=_script("""
        fs.mkdirSync('many');
        for (let i = 0; i < 20000; i++) fs.mkdirSync('many/' + i);
        const target = 'x'.repeat(3000);
        for (let i = 0; i < 5000; i++) fs.symlinkSync(target, 'many/l' + i);
    """)))
    status = await _prepare(make_envs(max_bytes=8 * 1024 * 1024), skill)
    if status.state == "ready":
        used = sum(os.lstat(os.path.join(d, n)).st_blocks * 512 for d, ds, fs_, in os.walk(status.node.info.path)
                   for n in ds + fs_)
        pytest.fail(f"an environment using {used} bytes of disk was published under a cap of 8 MiB "
                    f"(counted as {status.node.info.size_bytes})")
    assert status.state == "failed" and ("past the cap" in status.message
                                         or "nested more than 256 deep" in status.message), status.message
    assert _built(store_root) == [] and _left_building(store_root) == []


@pytest.mark.root
@pytest.mark.parametrize("kind", ["deep", "folder", "huge", "fifo"])
async def test_a_lock_the_build_rewrites_is_read_safely(shared_dir: Path, make_envs, store_root: Path, kind: str):
    """HOLE (``deep``, ``folder``): the lock npm wrote is read with ``read_plain_file`` (bounded, no links, no FIFOs), then
    parsed by ``builder.node_packages``, which catches ``ValueError`` and ``AttributeError`` only: a lock an install
    script rewrote as JSON nested 200,000 deep (400 KB) raises ``RecursionError`` out of ``ensure_node`` and
    ``prepare``; a folder left as ``package-lock.json`` makes ``read_plain_file`` raise ``IsADirectoryError``
    (see ``test_a_declaration_file_that_is_a_folder_is_invalid_not_a_crash``). (A lock past 16 MiB or a FIFO is
    read as ``{}``: held.)"""
    write = {
        "deep": "fs.writeFileSync('package-lock.json', '['.repeat(200000) + ']'.repeat(200000));",
        "huge": "fs.writeFileSync('package-lock.json', '{\"x\": \"' + 'a'.repeat(17 * 1024 * 1024) + '\"}');",
        "fifo": "fs.rmSync('package-lock.json', {force: true}); cp.execFileSync('mkfifo', ['package-lock.json']);",
        "folder": "fs.rmSync('package-lock.json', {force: true}); fs.mkdirSync('package-lock.json');",
    }[kind]
    skill = _skill(shared_dir, f"rewriter-{kind}", _package({"padder": "1.0.0"}, scripts=_script(write)))
    started = time.monotonic()
    try:
        status = await _prepare(make_envs(), skill)
    except (RecursionError, OSError) as exc:
        pytest.fail(f"preparing the skill crashed with {exc!r} instead of a status")
    assert time.monotonic() - started < 50
    assert status.state in ("ready", "failed"), status.message
    if status.state == "ready":
        assert status.node.info.packages == []
    assert _left_building(store_root) == []


# --- the Docker runtime: the step in a throwaway container, the same worker-side handling of its folder -------------

@pytest.mark.docker
async def test_a_container_build_leaves_links_unfollowed_and_nothing_running(
    docker_runtime_factory, shared_dir: Path, registry: NpmRegistry, work_root: Path
):
    token = f"VICTIM_TOKEN_{uuid.uuid4().hex}"
    victim, notes, victim_lock = _victim_folder(work_root, token)
    before = _unchanged(victim, notes, victim_lock)
    seconds = f"{500 + int.from_bytes(os.urandom(4), 'big') % 10**6 / 10**6:.6f}"
    skill = _skill(shared_dir, "boxed", _package({"padder": "1.0.0"}, scripts=_script(f"""
        fs.rmSync('package-lock.json', {{force: true}});
        fs.symlinkSync({json.dumps(str(victim_lock))}, 'package-lock.json');
        fs.symlinkSync({json.dumps(str(victim))}, 'node_modules/victim');
        cp.execFileSync('mkfifo', ['fifo']);
        cp.spawn('sh', ['-c', '(setsid nohup sleep {seconds} </dev/null >/dev/null 2>&1 &)'], {{stdio: 'ignore'}});
    """)))
    runtime = docker_runtime_factory(build_settings=BuildSettings(npm_registry=registry.url, timeout=90.0))
    status = await _prepare(runtime.environments, skill)
    assert status.state == "ready", status.message
    assert "stolen-secret@6.6.6" not in status.node.info.packages
    assert _unchanged(victim, notes, victim_lock) == before
    assert token not in json.dumps(status.as_json())
    assert await _wait_none_running(seconds, 10) == [], "a process of the container build outlived it"


@pytest.mark.docker
async def test_a_container_build_cannot_pass_the_size_cap_with_folders(
    docker_runtime_factory, shared_dir: Path, registry: NpmRegistry
):
    """HOLE (as ``test_folders_and_links_count_against_the_size_cap``, on the Docker runtime): the cap is checked
    by the same ``_seal`` on the worker's side, counting regular files' ``st_size`` alone."""
    skill = _skill(shared_dir, "inodes", _package({}, scripts=_script("""
        fs.mkdirSync('many');
        for (let i = 0; i < 20000; i++) fs.mkdirSync('many/' + i);
    """)))
    runtime = docker_runtime_factory(build_settings=BuildSettings(npm_registry=registry.url, timeout=90.0,
                                                                  max_bytes=8 * 1024 * 1024))
    status = await _prepare(runtime.environments, skill)
    assert status.state == "failed" and "past the cap" in status.message, (status.state, status.message)
