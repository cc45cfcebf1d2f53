"""Attacks on skill dependency environments (issue #12) by a hostile team, for real, as root (local and Docker).

A team controls what its skills declare and, through a package index it names (or a package it publishes), the
code a source distribution's build backend runs during a build: in the resolving step (``prepare_metadata``), in
the installing step (``build_wheel``), or in the environment's interpreter afterwards. Each test here mounts one
such attack against the real builder (``uv``, bubblewrap, slirp4netns, control groups, sandbox user ids) or the
real local runtime, and asserts the safe outcome; its name says what it defends. Attacks that get through are
kept as the safe behaviour marked ``xfail(strict=True)`` with what got through, so a fix turns them into failures
to be unmarked.

One primitive matters most below: inside a build's sandbox (a PID namespace) the low pids are the build's own
processes, working in the build folder (bwrap's init and uv; docker-init and timeout in a build container); on the
host they are the kernel's threads (or init), working in ``/``. A link planted in the build folder that leads
through ``/proc/<pid>/cwd/<path>`` therefore resolves to the build's own ``<build folder>/<path>`` for the build
(so every step succeeds) and to the host's ``/<path>`` for the worker, which follows links in the build folder as
root after a step.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
import os
import socket
import stat
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from tests.conftest import write_skill
from tests.environment_stores import environments_maker
from tests.package_index import PackageIndex, host_address
from tests.processes import running_with
from tests.services import unavailable
from worker.contract import RunRequest, SkillRef
from worker.environments import (
    BuildSettings,
    SkillEnvironments,
)
from worker.environments.declarations import read_declaration, read_manifest
from worker.environments.steps import BUILD_PROCESSES
from worker.errors import DependencyError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = [pytest.mark.root, pytest.mark.slow]

SESSION = uuid.uuid4().hex[:8]
VICTIM_UID = 29_777
"""Another tenant's user id (below the sandbox range, so no build is ever given it)."""


# --- a package index serving hostile distributions ---------------------------------------------------------------

def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def hostile_sdist(folder: Path, name: str, *, metadata: str = "", build: str = "",
                  files: dict[str, bytes] | None = None, version: str = "1.0") -> Path:
    """A source distribution whose in-tree build backend runs ``metadata`` when the resolver asks for its
    metadata (the resolving step) and ``build`` when the installer builds its wheel (the installing step), then
    builds a wheel of ``<name>.py`` plus ``files``. Both hooks know the build folder as ``FOLDER``."""
    dist = f"{name.replace('-', '_')}-{version}"
    module = name.replace("-", "_")
    backend = "\n".join([
        "import base64, hashlib, os, zipfile",
        f"NAME, VERSION, DIST, MODULE = {name!r}, {version!r}, {dist!r}, {module!r}",
        f"EXTRA = {dict(files or {})!r}",
        'META = f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n"',
        "FOLDER = os.path.dirname(os.environ.get('HOME') or os.environ['UV_CACHE_DIR'])",
        "",
        "def through_proc(path):",
        "    # a link to path through the working folder of a process of this sandbox that works in the build folder",
        "    # (low pids: on the host those are the kernel's threads, working in /)",
        "    for pid in range(2, 64):",
        "        try:",
        "            if os.readlink(f'/proc/{pid}/cwd') == FOLDER:",
        "                return f'/proc/{pid}/cwd/' + path.lstrip('/'), os.path.join(FOLDER, path.lstrip('/'))",
        "        except OSError:",
        "            pass",
        "    raise RuntimeError('no process of the build works in its folder')",
        "",
        "def _metadata_hook():",
        textwrap.indent(textwrap.dedent(metadata) or "pass", "    "),
        "",
        "def _build_hook():",
        textwrap.indent(textwrap.dedent(build) or "pass", "    "),
        "",
        "def get_requires_for_build_wheel(config_settings=None):",
        "    return []",
        "",
        "def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):",
        "    _metadata_hook()",
        "    info = os.path.join(metadata_directory, DIST + '.dist-info')",
        "    os.makedirs(info)",
        "    with open(os.path.join(info, 'METADATA'), 'w') as out:",
        "        out.write(META)",
        "    return DIST + '.dist-info'",
        "",
        "def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):",
        "    _build_hook()",
        "    files = {MODULE + '.py': b'BUILT = True\\n', DIST + '.dist-info/METADATA': META.encode(),",
        "             DIST + '.dist-info/WHEEL': b'Wheel-Version: 1.0\\nGenerator: attack\\nRoot-Is-Purelib: true\\n'",
        "                                         b'Tag: py3-none-any\\n', **EXTRA}",
        "    digest = lambda d: base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()",
        "    record = ''.join(f'{p},sha256={digest(d)},{len(d)}\\n' for p, d in files.items())",
        "    files[DIST + '.dist-info/RECORD'] = (record + DIST + '.dist-info/RECORD,,\\n').encode()",
        "    out = DIST + '-py3-none-any.whl'",
        "    with zipfile.ZipFile(os.path.join(wheel_directory, out), 'w') as wheel:",
        "        for path, data in files.items():",
        "            wheel.writestr(path, data)",
        "    return out",
        "",
    ])
    pyproject = (f'[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
                 f'[project]\nname = "{name}"\nversion = "{version}"\ndynamic = ["dependencies"]\n')  # asks the backend
    path = folder / f"{dist}.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for member, text in (("pyproject.toml", pyproject), ("backend.py", backend),
                             ("PKG-INFO", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")):
            data = text.encode()
            entry = tarfile.TarInfo(f"{dist}/{member}")
            entry.size = len(data)
            archive.addfile(entry, io.BytesIO(data))
    return path


def plain_wheel(folder: Path, name: str, version: str = "1.0") -> Path:
    """A harmless pure-Python wheel (another team's dependency)."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {f"{name.replace('-', '_')}.py": f"VERSION = {version!r}\n".encode(),
             f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{p},sha256={_b64(hashlib.sha256(d).digest())},{len(d)}\n" for p, d in files.items())
    files[f"{dist}.dist-info/RECORD"] = (record + f"{dist}.dist-info/RECORD,,\n").encode()
    path = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
    return path


@pytest.fixture
def dists(shared_dir: Path) -> Path:
    """The distributions the shared ``index`` fixture serves here: a harmless wheel, plus what each attack adds."""
    folder = shared_dir / "dists"
    folder.mkdir()
    plain_wheel(folder, "tidy")
    return folder


@pytest.fixture
def store_root(shared_dir: Path) -> Path:
    return shared_dir / "envs"


@pytest.fixture
def make_envs(store_root: Path, index: PackageIndex):
    with environments_maker(store_root, index_url=index.url, sandboxed=True, timeout=90.0) as make:
        yield make


def _skill(shared_dir: Path, name: str, requirements: str, library: str = "lib", **files: str) -> Path:
    return write_skill(shared_dir / library, name, files={"requirements.txt": requirements, **files})


async def _prepare(envs: SkillEnvironments, skill: Path):
    return await envs.prepare(skill, skill.parent, skill.name)


def _probe(message: str) -> dict:
    """What a build backend reported by failing with ``PROBE:<json>``."""
    assert "PROBE:" in message, message
    return json.loads(message.rsplit("PROBE:", 1)[1].splitlines()[0])


def _host_pids_work_in_root() -> None:
    """The attacks below lead through ``/proc/<pid>/cwd`` for a low pid: inside the build's sandbox (a PID
    namespace) a process of the build working in the build folder, on the host a kernel thread working in ``/``
    (``/proc/1`` would do on most hosts, but this test host hides its init)."""
    try:
        if os.readlink("/proc/2/cwd") == "/":
            return
    except OSError:
        pass
    unavailable("these attacks need a host whose low pids work in / (a kernel thread's /proc/2/cwd)")


def _victim_folder(parent: Path, secret: str) -> tuple[Path, Path]:
    """Another tenant's private folder and file (its own user id, 0700 and 0600)."""
    folder = parent / f"ws_victim-{SESSION}"
    folder.mkdir(parents=True)
    notes = folder / "notes.txt"
    notes.write_text(secret)
    os.chmod(notes, 0o600)
    os.chmod(folder, 0o700)
    os.chown(notes, VICTIM_UID, VICTIM_UID)
    os.chown(folder, VICTIM_UID, VICTIM_UID)
    return folder, notes


# --- a hostile build and the worker's own files ------------------------------------------------------------------

async def test_a_build_cannot_make_the_worker_read_a_host_file_as_its_lock(
    shared_dir: Path, make_envs, dists: Path, work_root: Path, store_root: Path
):
    token = f"VICTIM_TOKEN={uuid.uuid4().hex}"
    _, notes = _victim_folder(work_root, token + "\n")
    _host_pids_work_in_root()
    hostile_sdist(dists, "lockpick", metadata=f"""
        link = os.path.join(FOLDER, "lock.txt")
        target, inside = through_proc({str(notes)!r})
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(target, link)
    """, build='raise RuntimeError("the first install fails on purpose")')
    skill = _skill(shared_dir, "lockpick", "lockpick\n")
    envs = make_envs()
    first = await _prepare(envs, skill)
    second = await _prepare(envs, skill)  # the lock now kept is what the worker read
    stored = [p.read_text(errors="replace") for p in (store_root / "locks").glob("*.txt")]
    assert notes.read_text() == token + "\n" and os.stat(notes).st_uid == VICTIM_UID
    assert first.state == "failed" and second.state == "failed"
    leaked = [where for where, text in (("first message", first.message), ("second message", second.message),
                                        ("a stored lock", "\n".join(stored))) if token in text]
    assert leaked == [], f"another tenant's file reached {leaked}: {second.message}"


async def test_a_build_cannot_make_the_worker_chown_and_chmod_a_host_folder(
    shared_dir: Path, make_envs, dists: Path, work_root: Path, store_root: Path
):
    victim, notes = _victim_folder(work_root, "another tenant's private notes\n")
    _host_pids_work_in_root()
    hostile_sdist(dists, "swapper", build=f"""
        import shutil
        env = os.path.join(FOLDER, "env")
        target, inside = through_proc({str(victim)!r})
        if os.path.isdir(env) and not os.path.islink(env):
            shutil.copytree(env, inside, symlinks=True)
            shutil.rmtree(env)
            os.symlink(target, env)
    """)
    skill = _skill(shared_dir, "swapper", "swapper\n")
    status = await _prepare(make_envs(), skill)
    changed = [f"{path.name}: uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}"
               for path, want in ((victim, 0o700), (notes, 0o600))
               if ((info := os.stat(path)).st_uid, stat.S_IMODE(info.st_mode)) != (VICTIM_UID, want)]
    envs_dir = store_root / "envs"
    published = [p for p in envs_dir.iterdir() if p.is_symlink()] if envs_dir.is_dir() else []
    assert changed == [], f"the build ({status.state}) had the worker change another tenant's files: {changed}"
    assert published == [], f"an environment is a link: {[os.readlink(p) for p in published]}"


async def test_a_build_writes_nothing_outside_its_own_folder(
    shared_dir: Path, make_envs, dists: Path, work_root: Path, store_root: Path
):
    """The store's other environments, its locks, the uv binary, other builds, the work root, the host's /tmp:
    written by path and through /proc/1/cwd (which inside the sandbox leads only to the build's own folder)."""
    before = await _prepare(make_envs(), _skill(shared_dir, "other-team", "tidy\n"))
    assert before.state == "ready", before.message
    other_env = before.info.path
    uv_binaries = sorted((store_root / "bin").iterdir())
    digests = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in uv_binaries}
    locks_before = sorted((store_root / "locks").glob("*.txt"))
    other_files_before = sorted(str(p.relative_to(other_env)) for p in other_env.rglob("*"))
    marker = f"planted-{SESSION}"
    targets = [
        other_env / marker, other_env / "lib" / marker, store_root / "envs" / marker,
        store_root / "envs" / f"{before.info.key}.json", store_root / "locks" / f"{marker}.txt",
        store_root / ".locks" / marker, store_root / "bin" / marker, store_root / ".building" / marker,
        store_root / marker, work_root / marker, shared_dir / marker, Path("/tmp") / marker,
        Path("/var/tmp") / marker, Path("/dev/shm") / marker, Path("/usr/local") / marker, Path("/etc") / marker,
        Path("/root") / marker, *uv_binaries,
    ]
    paths = [str(t) for t in targets] + [f"/proc/1/cwd{t}" for t in targets[:12]]
    hostile_sdist(dists, "scribbler", build=f"""
        import json
        written = []
        for path in {paths!r}:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except OSError:
                pass
            try:
                with open(path, "ab") as out:
                    out.write(b"planted by a build")
                written.append(path)
            except OSError:
                pass
        for path in {[str(p) for p in uv_binaries]!r}:
            try:
                os.chmod(path, 0o777)
                written.append("chmod " + path)
            except OSError:
                pass
        raise RuntimeError("PROBE:" + json.dumps(written))
    """)
    status = await _prepare(make_envs(), _skill(shared_dir, "scribbler", "scribbler\n"))
    written_inside = _probe(status.message)  # what the build believed it wrote (its sandbox's own /tmp, say)
    found = [str(t) for t in targets if t.exists() and marker in t.name]
    assert found == [], f"a build planted files on the host: {found} (it wrote {written_inside})"
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in uv_binaries} == digests
    assert all(stat.S_IMODE(os.stat(p).st_mode) == 0o755 for p in uv_binaries)
    assert [p for p in sorted((store_root / "locks").glob("*.txt")) if "scribbler" not in p.read_text()] == locks_before
    assert sorted(str(p.relative_to(other_env)) for p in other_env.rglob("*")) == other_files_before
    assert json.loads((store_root / "envs" / f"{before.info.key}.json").read_text())["key"] == before.info.key


async def test_a_build_leaves_no_process_behind_whatever_it_did_to_detach(shared_dir: Path, make_envs, dists: Path):
    seconds = f"{200 + int.from_bytes(os.urandom(4), 'big') % 10**6 / 10**6:.6f}"
    hostile_sdist(dists, "lingerer", build=f"""
        import subprocess
        subprocess.Popen(["setsid", "nohup", "sleep", "{seconds}"], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        if os.fork() == 0:  # a double fork, the grandchild re-parented away from the build
            os.setsid()
            quiet = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(quiet, fd)
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", "{seconds}"])
            os._exit(0)
        os.wait()
    """)
    status = await _prepare(make_envs(), _skill(shared_dir, "lingerer", "lingerer\n"))
    assert status.state == "ready", status.message
    deadline = time.monotonic() + 5
    while running_with(seconds) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert running_with(seconds) == [], "a process the build started outlived it"


async def test_an_environment_holds_nothing_setuid_writable_or_owned_by_the_build(
    shared_dir: Path, make_envs, dists: Path, store_root: Path
):
    """What a build plants in its environment for later runs (other workspaces' user ids) to abuse: setuid and
    setgid files, world-writable files and folders, files of its own user id, hard links to the uv binary."""
    hostile_sdist(dists, "planter", build=f"""
        import glob
        site = glob.glob(os.path.join(FOLDER, "env", "lib", "python3*", "site-packages"))[0]
        def attempt(what):
            try:
                what()
            except OSError:
                pass
        for name, mode in (("suid", 0o4755), ("sgid", 0o2755), ("writable", 0o666), ("sticky", 0o1777)):
            path = os.path.join(site, name)
            with open(path, "w") as out:
                out.write("#!/bin/sh\\nid\\n")
            os.chmod(path, mode)
        os.makedirs(os.path.join(site, "open-folder"))
        os.chmod(os.path.join(site, "open-folder"), 0o777)
        os.makedirs(os.path.join(site, "sgid-folder"))
        os.chmod(os.path.join(site, "sgid-folder"), 0o2777)
        attempt(lambda: os.mkfifo(os.path.join(site, "fifo"), 0o666))
        for index, source in enumerate(glob.glob({str(store_root / "bin")!r} + "/*") + ["/usr/bin/python3"]):
            attempt(lambda: os.link(source, os.path.join(site, f"hard-{{index}}")))
        os.chmod(os.path.join(FOLDER, "env"), 0o777)
    """)
    status = await _prepare(make_envs(), _skill(shared_dir, "planter", "planter\n"))
    assert status.state == "ready", status.message
    env = status.info.path
    uv_inodes = {(os.stat(p).st_dev, os.stat(p).st_ino) for p in (store_root / "bin").iterdir()}
    bad = []
    for path in [env, *env.rglob("*")]:
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            continue
        if info.st_uid != 0 or info.st_gid != 0:
            bad.append(f"{path.name} owned by {info.st_uid}:{info.st_gid}")
        if stat.S_IMODE(info.st_mode) & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022):
            bad.append(f"{path.name} mode {stat.S_IMODE(info.st_mode):o}")
        if (info.st_dev, info.st_ino) in uv_inodes:
            bad.append(f"{path.name} is the uv binary")
    assert bad == []


async def test_a_build_cannot_use_more_memory_than_its_limit(shared_dir: Path, make_envs, dists: Path):
    hostile_sdist(dists, "glutton", build="""
        hoard = bytearray(1024 ** 3)
        for offset in range(0, len(hoard), 4096):
            hoard[offset] = 1
    """)
    status = await _prepare(make_envs(memory_bytes=256 * 1024**2), _skill(shared_dir, "glutton", "glutton\n"))
    assert status.state == "failed", status.message
    assert "ran out of memory" in status.message or "SIGKILL" in status.message, status.message


async def test_a_build_cannot_start_more_processes_than_its_limit(shared_dir: Path, make_envs, dists: Path):
    hostile_sdist(dists, "forker", build=f"""
        import json, time
        started = 0
        for _ in range({BUILD_PROCESSES * 2}):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:  # holds none of uv's pipes, so the build ends when the backend does
                quiet = os.open("/dev/null", os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(quiet, fd)
                time.sleep(120)
                os._exit(0)
            started += 1
        raise RuntimeError("PROBE:" + json.dumps({{"started": started}}))
    """)
    status = await _prepare(make_envs(), _skill(shared_dir, "forker", "forker\n"))
    assert _probe(status.message)["started"] < BUILD_PROCESSES


async def test_a_build_can_neither_see_signal_nor_trace_the_worker(shared_dir: Path, make_envs, dists: Path):
    worker = os.getpid()
    hostile_sdist(dists, "tracer", build=f"""
        import ctypes, json
        found = {{"uid": os.getuid()}}
        try:
            os.kill({worker}, 0)
            found["signal"] = True
        except OSError:
            found["signal"] = False
        libc = ctypes.CDLL(None, use_errno=True)
        found["ptrace"] = libc.ptrace(16, {worker}, None, None) == 0  # PTRACE_ATTACH
        seen = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                seen.append([int(pid), os.stat(f"/proc/{{pid}}").st_uid,
                             open(f"/proc/{{pid}}/cmdline", "rb").read().replace(b"\\0", b" ").decode()])
            except OSError:
                pass
        found["seen"] = seen
        raise RuntimeError("PROBE:" + json.dumps(found))
    """)
    status = await _prepare(make_envs(), _skill(shared_dir, "tracer", "tracer\n"))
    found = _probe(status.message)
    assert found["uid"] != 0
    assert found["signal"] is False and found["ptrace"] is False
    strangers = [entry for entry in found["seen"] if entry[1] != found["uid"] or "pytest" in entry[2]]
    assert strangers == [], "a build sees processes other than its own"


async def test_a_build_reaches_no_service_of_the_hosts_network_but_the_package_index(
    shared_dir: Path, make_envs, dists: Path
):
    service = socket.socket()
    service.bind((host_address(), 0))
    service.listen()
    accepted: list[bytes] = []

    def serve() -> None:
        service.settimeout(60)
        try:
            connection, _ = service.accept()
            with connection:
                connection.settimeout(5)
                accepted.append(connection.recv(64))
        except OSError:
            pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    address = service.getsockname()
    hostile_sdist(dists, "prober", build=f"""
        import socket
        try:
            with socket.create_connection({address!r}, timeout=5) as connection:
                connection.sendall(b"KEYS *\\r\\n")
        except OSError:
            pass
        raise RuntimeError("probed")
    """)
    try:
        await _prepare(make_envs(), _skill(shared_dir, "prober", "prober\n"))
        thread.join(timeout=1)
    finally:
        service.close()
    assert accepted == [], f"a build reached {address} and sent {accepted}"


# --- a hostile run and the environments it is shown --------------------------------------------------------------

async def test_a_run_cannot_change_its_environment_or_reach_another_teams(
    shared_dir: Path, make_envs, dists: Path, work_root: Path, store_root: Path
):
    """A run of skill A writes to its environment (files, site-packages, bytecode caches), looks for the other
    environments (listing, B's key, the locks) and points VIRTUAL_ENV, PATH and PYTHONPATH of its request at B's."""
    plain_wheel(dists, "neat", version="7.77")
    envs = make_envs()
    own = await _prepare(envs, _skill(shared_dir, "mine", "tidy\n"))
    other = await _prepare(envs, _skill(shared_dir, "theirs", "neat\n", library="other-lib"))
    assert own.state == other.state == "ready", (own.message, other.message)
    own_files = sorted(str(p.relative_to(own.info.path)) for p in own.info.path.rglob("*"))
    b_env, b_site = other.info.path, next(other.info.path.glob("lib/python3*/site-packages"))
    command = f"""
        echo "V=$VIRTUAL_ENV"
        site=$(echo "$VIRTUAL_ENV"/lib/python3*/site-packages)
        touch "$VIRTUAL_ENV/planted" "$site/planted.pth" "$VIRTUAL_ENV/bin/python" 2>/dev/null && echo WROTE-ENV
        mkdir "$site/__pycache__" 2>/dev/null && echo WROTE-CACHE
        python3 -c 'import tidy, compileall, sys; compileall.compile_dir(sys.argv[1], quiet=2, force=True)' "$site"
        python3 -c 'import neat; print("IMPORTED", neat.VERSION)' 2>/dev/null
        ls -a "$(dirname "$VIRTUAL_ENV")" | sed 's/^/LISTED /'
        ls -a {store_root} | sed 's/^/STORE /'
        ls -a {store_root}/locks {store_root}/.building {store_root}/bin {b_env} 2>/dev/null | sed 's/^/SEEN /'
        cat {b_site}/neat.py {store_root}/locks/*.txt {store_root}/envs/{other.info.key}.json 2>/dev/null
        true
    """
    async with LocalWorkspaceRuntime(work_root, environments=envs) as runtime:
        result = await runtime.run(RunRequest(
            skill=SkillRef(name="mine", root=str(shared_dir / "lib"), path="mine"), command=command,
            workspace_id=f"team-a-{SESSION}",
            env={"VIRTUAL_ENV": str(b_env), "PATH": f"{b_env}/bin:/usr/bin:/bin", "PYTHONPATH": str(b_site)},
        ))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert f"V={own.info.path}" in lines
    assert "WROTE-ENV" not in lines and "WROTE-CACHE" not in lines
    assert not any("7.77" in line or "IMPORTED" in line or other.info.key in line for line in lines), result.stdout
    assert sorted(line.split(" ", 1)[1] for line in lines if line.startswith("LISTED ")) == [".", "..", own.info.key]
    assert sorted(line.split(" ", 1)[1] for line in lines if line.startswith("STORE ")) == [".", "..", "envs"]
    assert not any(line.startswith("SEEN") for line in lines), result.stdout
    assert sorted(str(p.relative_to(own.info.path)) for p in own.info.path.rglob("*")) == own_files


# --- declarations: what a skill's files make the worker (and the API) read ---------------------------------------

@pytest.fixture
def secret_file(shared_dir: Path) -> tuple[Path, str]:
    token = f"HOST_SECRET_{uuid.uuid4().hex}"
    path = shared_dir / "host-secret.txt"
    path.write_text(f"{token}\n")
    os.chmod(path, 0o600)
    return path, token


@pytest.mark.parametrize("where", ["requirements.txt", "pyproject.toml", "skillrun.toml"])
async def test_a_declaration_file_linked_to_a_host_file_is_refused_without_quoting_it(
    shared_dir: Path, make_envs, secret_file, where: str
):
    secret, token = secret_file
    skill = write_skill(shared_dir / "lib", "linked")
    (shared_dir / "lib" / where if where == "skillrun.toml" else skill / where).symlink_to(secret)
    status = make_envs().status(skill, skill.parent, "linked")
    assert status.state == "invalid" and "links are not followed" in status.message, status.message
    assert token not in status.message


async def test_scripts_and_folders_linked_out_of_the_skill_are_not_read(shared_dir: Path, make_envs):
    outside = shared_dir / "outside"
    outside.mkdir()
    (outside / "tool.py").write_text("# /// script\n# dependencies = ['evil-from-outside']\n# ///\n")
    skill = write_skill(shared_dir / "lib", "links", files={"requirements.txt": "tidy\n"})
    (skill / "linked.py").symlink_to(outside / "tool.py")
    (skill / "linked-folder").symlink_to(outside)
    assert make_envs().status(skill, skill.parent, "links").declaration.python == ("tidy",)


async def test_a_fifo_or_a_huge_declaration_is_refused_at_once(shared_dir: Path, make_envs):
    fifo = write_skill(shared_dir / "lib", "fifo")
    os.mkfifo(fifo / "requirements.txt")
    huge = write_skill(shared_dir / "lib", "huge", files={"pyproject.toml": "# padding\n" * 200_000})
    envs = make_envs()
    started = time.monotonic()
    statuses = await asyncio.wait_for(asyncio.gather(
        asyncio.to_thread(envs.status, fifo, fifo.parent, "fifo"),
        asyncio.to_thread(envs.status, huge, huge.parent, "huge")), timeout=10)
    assert [s.state for s in statuses] == ["invalid", "invalid"], [s.message for s in statuses]
    assert "not a regular file" in statuses[0].message and "larger than" in statuses[1].message
    assert time.monotonic() - started < 5


SMUGGLED = [
    "evil @ file:///etc/passwd",
    "evil @ http://10.0.2.2/evil-1.0.tar.gz",
    "evil @ git+ssh://git@example.com/evil.git",
    "evil @ /etc/passwd",
    "-e /etc",
    "--index-url http://10.0.2.2/simple",
    "-i http://10.0.2.2/simple",
    "--extra-index-url=http://10.0.2.2/simple",
    "-r /etc/shadow",
    "-c /etc/shadow",
    "--find-links /tmp",
    "evil --index-url http://10.0.2.2/simple",
    'evil ; python_version > "3" --extra-index-url http://10.0.2.2/simple',
    'evil --hash=sha256:' + "0" * 64,
]


@pytest.mark.parametrize("line", SMUGGLED)
def test_an_index_option_or_a_local_or_plain_http_source_is_refused_in_requirements(tmp_path: Path, line: str):
    skill = write_skill(tmp_path, "smuggler", files={"requirements.txt": f"tidy\n{line}\n"})
    with pytest.raises(DependencyError):
        read_declaration(skill, "smuggler")


@pytest.mark.parametrize("value", [
    'evil ; python_version == "3\\n--index-url http://10.0.2.2/simple\\n"',
    'evil ; extra == "x\\n-e file:///etc\\n"',
    "evil @ https://example.com/evil.whl\\n--extra-index-url=http://10.0.2.2/simple",
    "evil @ https://example.com/evil.whl\\r--extra-index-url=http://10.0.2.2/simple",
    "evil @ file:///etc/passwd",
])
@pytest.mark.parametrize("where", ["pyproject.toml", "script.py", "skillrun.toml"])
def test_a_line_break_cannot_smuggle_an_option_into_the_resolvers_input(tmp_path: Path, value: str, where: str):
    """TOML strings may hold line breaks, and the requirements are written one per line for ``uv pip compile``."""
    quoted = '"' + value.replace('"', '\\"') + '"'
    files = {
        "pyproject.toml": {"pyproject.toml": f"[project]\ndependencies = [{quoted}]\n"},
        "script.py": {"script.py": f"# /// script\n# dependencies = [{quoted}]\n# ///\n"},
        "skillrun.toml": {},
    }[where]
    skill = write_skill(tmp_path, "smuggler", files=files)
    manifest = f"[skills.smuggler]\npython = [{quoted}]\n" if where == "skillrun.toml" else ""
    (tmp_path / "skillrun.toml").write_text(manifest)
    try:
        declaration = read_declaration(skill, "smuggler", read_manifest(tmp_path))
    except DependencyError:
        return
    written = "\n".join(declaration.python).splitlines()  # what builder.ensure writes to requirements.in
    assert not any(line.lstrip().startswith("-") for line in written), written


def test_ten_thousand_requirements_are_refused_at_once(tmp_path: Path):
    skill = write_skill(tmp_path, "greedy", files={"requirements.txt": "".join(f"p{n}\n" for n in range(10_000))})
    started = time.monotonic()
    with pytest.raises(DependencyError, match="at most"):
        read_declaration(skill, "greedy")
    assert time.monotonic() - started < 5


def test_a_manifest_names_only_skills_of_its_own_library(tmp_path: Path):
    write_skill(tmp_path / "attacker-lib", "victim")
    (tmp_path / "attacker-lib" / "skillrun.toml").write_text('[skills.victim]\npython = ["evil"]\n')
    victim = write_skill(tmp_path / "victim-lib", "victim", files={"requirements.txt": "tidy\n"})
    assert read_declaration(victim, "victim", read_manifest(victim.parent)).python == ("tidy",)


def test_a_script_full_of_unclosed_pep723_openings_is_scanned_in_bounded_time(tmp_path: Path):
    skill = write_skill(tmp_path, "slowloris", files={"scripts/tool.py": "# /// script\n" * 12_000})
    code = ("import sys; from pathlib import Path; from worker.environments.declarations import read_declaration\n"
            "try:\n    read_declaration(Path(sys.argv[1]), 'slowloris')\nexcept Exception:\n    pass\n")
    started = time.monotonic()
    try:
        subprocess.run([sys.executable, "-c", code, str(skill)], timeout=10, capture_output=True,
                       cwd=Path(__file__).resolve().parents[2])
    except subprocess.TimeoutExpired:
        pass
    assert time.monotonic() - started < 10, "scanning one script's PEP 723 metadata took more than 10 s"


# --- a worker killed in the middle of a build --------------------------------------------------------------------

WORKER_SCRIPT = """
import asyncio, sys
from pathlib import Path
from worker.environments import BuildSettings, EnvironmentBuilder, EnvironmentStore, SkillEnvironments, local_target

async def main():
    store, index, skill = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    envs = SkillEnvironments(EnvironmentBuilder(EnvironmentStore(store), BuildSettings(index_url=index, timeout=120.0)),
                             local_target)
    await envs.prepare(skill, skill.parent, skill.name)

asyncio.run(main())
"""


async def test_a_worker_killed_mid_build_leaves_no_process_and_no_environment_a_run_would_use(
    shared_dir: Path, make_envs, dists: Path, index: PackageIndex, store_root: Path
):
    """The build holds itself up (asking our index whether to) with a detached process of its own; the worker is
    killed with SIGKILL meanwhile. Nothing of the build may run on, nothing half-built may be taken for ready, and
    the next build makes the environment whole."""
    seconds = f"{300 + int.from_bytes(os.urandom(4), 'big') % 10**6 / 10**6:.6f}"
    flag = dists / f"hold-{SESSION}"
    flag.write_text("hold")
    hold_url = index.url.rsplit("/simple", 1)[0] + f"/files/x/{flag.name}"
    hostile_sdist(dists, "stall", build=f"""
        import subprocess, time, urllib.request
        try:
            urllib.request.urlopen({hold_url!r}, timeout=5).read()
        except OSError:
            pass
        else:
            subprocess.Popen(["setsid", "sleep", "{seconds}"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
            time.sleep(float("{seconds}"))
    """)
    skill = _skill(shared_dir, "stall", "stall\n")
    worker = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, str(store_root), index.url, str(skill)],
                              cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not running_with(seconds) and time.monotonic() < deadline and worker.poll() is None:
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # the backend is in its sleep now
        assert running_with(seconds), worker.stderr.read().decode() if worker.poll() is not None else ""
    finally:
        worker.kill()
        worker.wait()
    deadline = time.monotonic() + 10
    while running_with(seconds) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert running_with(seconds) == [], "the build's processes outlived its killed worker"
    envs = make_envs()
    assert envs.status(skill, skill.parent, "stall").state == "not built"
    assert list((store_root / "envs").glob("*.json")) == []
    flag.unlink()
    status = await _prepare(envs, skill)
    assert status.state == "ready", status.message
    assert os.listdir(store_root / ".building") == []
    assert (status.info.path / "bin" / "python").exists()
    assert list(status.info.path.glob("lib/python3*/site-packages/stall.py"))


# --- the Docker runtime: steps in containers, the same worker-side handling of the build folder -------------------

@pytest.mark.docker
async def test_a_container_build_cannot_make_the_worker_read_a_host_file_as_its_lock(
    docker_runtime_factory, shared_dir: Path, dists: Path, index: PackageIndex, work_root: Path
):
    token = f"VICTIM_TOKEN={uuid.uuid4().hex}"
    _, notes = _victim_folder(work_root, token + "\n")
    _host_pids_work_in_root()
    hostile_sdist(dists, "lockpick", metadata=f"""
        link = os.path.join(FOLDER, "lock.txt")
        target, inside = through_proc({str(notes)!r})
        os.makedirs(os.path.dirname(inside), exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(target, link)
    """, build='raise RuntimeError("the first install fails on purpose")')
    skill = _skill(shared_dir, "lockpick", "lockpick\n")
    runtime = docker_runtime_factory(build_settings=BuildSettings(index_url=index.url, timeout=120.0))
    first = await _prepare(runtime.environments, skill)
    second = await _prepare(runtime.environments, skill)
    assert first.state == "failed" and second.state == "failed", (first.message, second.message)
    assert token not in first.message and token not in second.message, second.message
