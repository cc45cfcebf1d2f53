"""Attacks on the local runtime's root filesystems (``worker.environments.systems``) and on the sandbox that shows
one as its system (``SandboxSpec.system``): a hostile skill author naming its Debian packages, a hostile run inside
a root, a build stopped midway, a store tampered with.

One module-built root (``figlet``) serves every run-time attack; the few tests that build again start from its
downloads (a hard-linked copy of ``systems/.debs``), as ``tests/worker/test_system_roots.py`` does.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT
from tests.system_roots import debian_library, mounts_under
from tests.environment_stores import environments_maker, left_building
from tests.services import ensure_installed, unavailable
from worker.contract import RunRequest, SkillRef
from worker.environments.systems import SystemRoots
from worker.errors import EnvironmentBuildError, EnvironmentNotReadyError
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def figlet_root(figlet_store: Path) -> Path:
    [meta] = (figlet_store / "systems").glob("*.json")
    return figlet_store / "systems" / meta.name[:-5]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read()
    except OSError:
        return b""


def _processes_mentioning(text: str) -> list[int]:
    """Host processes whose command line holds ``text`` (not this one)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                if text.encode() in cmdline.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


async def _runs(store: Path, library: Path, work_root: Path, *commands: str, skill: str = "banner",
                workspace_id: str = "attacker"):
    """Run each command of ``skill`` in one workspace (the first in a sandbox of its own, the next in the held one)."""
    results = []
    with environments_maker(store) as make:
        async with LocalWorkspaceRuntime(work_root, environments=make(systems=True)) as runtime:
            for command in commands:
                results.append(await runtime.run(RunRequest(
                    skill=SkillRef(name=skill, root=str(library), path=skill), command=command,
                    workspace_id=workspace_id)))
    return results


# --- What a skill author may name -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "figlet,sl",                   # a second package smuggled into debootstrap's --include list
    "--include=sl",                # an option of debootstrap's
    "-x",
    "../../etc",
    "figlet sl",
    "Figlet",
    "a",                           # Debian names have two characters at least
    "figlet;id",
    "$(id)",
    "figlet\x00",
    "x" * 64,
])
def test_a_debian_name_that_is_not_a_package_name_is_refused(tmp_path: Path, name: str):
    library = debian_library(tmp_path, hostile=[name])
    with environments_maker(tmp_path / "store") as make:
        status = make(systems=True).status(library / "hostile", library, "hostile")
    assert status.state == "invalid" and "is not a Debian package name" in status.message, status.message
    assert not (tmp_path / "store" / "systems").exists()


def test_a_debian_name_with_a_trailing_newline_is_refused(tmp_path: Path):
    library = debian_library(tmp_path, hostile=["figlet\n"])
    with environments_maker(tmp_path / "store") as make:
        status = make(systems=True).status(library / "hostile", library, "hostile")
    assert status.state == "invalid" and "is not a Debian package name" in status.message, status.message


async def test_very_many_debian_packages_are_refused_not_a_crash(tmp_path: Path):
    if not IS_ROOT:
        unavailable("root filesystems are built as root (debootstrap): run these tests as root")
    names = [f"pkg{i:04d}-" + "x" * 54 for i in range(3000)]
    library = debian_library(tmp_path, many=names)
    with environments_maker(tmp_path / "store") as make:
        envs = make(systems=True)
        status = await envs.prepare(library / "many", library, "many")
    assert status.state in ("invalid", "failed"), status.message
    assert len(status.message) < 64 * 1024
    assert left_building(tmp_path / "store") == []


# --- A hostile run inside a root ------------------------------------------------------------------------------------

async def test_a_run_cannot_write_into_its_root_filesystem(figlet_store: Path, figlet_root: Path, tmp_path: Path,
                                                          work_root: Path):
    library = debian_library(tmp_path, banner=["figlet"])
    watched = ["usr", "usr/bin", "etc", "var", "var/lib/dpkg", "var/tmp", "var/cache", "usr/lib"]
    before = {name: os.stat(figlet_root / name).st_mtime_ns for name in watched}
    figlet = figlet_root / "usr/bin" / os.readlink(figlet_root / "etc/alternatives/figlet").rsplit("/", 1)[-1]
    figlet_bytes = figlet.read_bytes()
    probe = ("for p in /usr/attack /usr/bin/attack /etc/attack /var/attack /var/lib/dpkg/attack /var/tmp/attack "
             "/var/cache/attack /attack /lib/attack; do (echo x > $p) 2>/dev/null && echo wrote $p; done; "
             f"(echo x >> /usr/bin/{figlet.name}) 2>/dev/null && echo wrote-figlet; "
             "(echo 'root::0:0::/root:/bin/bash' >> /etc/passwd) 2>/dev/null && echo wrote-passwd; "
             "mkdir /var/lib/dpkg/attack 2>/dev/null && echo made-dir; "
             "chmod 777 /usr/bin 2>/dev/null && echo chmodded; "
             "rm -f /etc/os-release 2>/dev/null; test -e /etc/os-release || echo removed; "
             "ln -s /x /etc/attack-link 2>/dev/null && echo linked; echo done")
    results = await _runs(figlet_store, library, work_root, probe, probe)
    for result in results:
        assert result.stdout.splitlines() == ["done"], result.stdout + result.stderr
    after = {name: os.stat(figlet_root / name).st_mtime_ns for name in watched}
    assert after == before and figlet.read_bytes() == figlet_bytes
    for name in ("usr/attack", "etc/attack", "var/attack", "var/tmp/attack", "attack", "etc/attack-link"):
        assert not os.path.lexists(figlet_root / name)
    assert (figlet_root / "etc/os-release").is_file()


async def test_setuid_programs_of_the_root_give_no_privilege(figlet_store: Path, figlet_root: Path, tmp_path: Path,
                                                            work_root: Path):
    setuid = [os.path.join(folder, name) for folder, _, files in os.walk(figlet_root / "usr") for name in files
              if os.lstat(os.path.join(folder, name)).st_mode & stat.S_ISUID]
    assert any(path.endswith("/su") for path in setuid) and any(path.endswith("/mount") for path in setuid), setuid
    library = debian_library(tmp_path, banner=["figlet"])
    probe = ("grep -E '^(NoNewPrivs|CapEff|CapPrm|Uid):' /proc/self/status; "
             "su -c 'id -u > /tmp/su-worked' root </dev/null >/dev/null 2>&1; echo su=$?; test -e /tmp/su-worked && echo su-ran; "
             "mount -t tmpfs none /mnt >/dev/null 2>&1; echo mount=$?; "
             "umount /tmp >/dev/null 2>&1; echo umount=$?; "
             "test -u /usr/bin/su && echo setuid-bit-visible; id -u")
    [result] = await _runs(figlet_store, library, work_root, probe)
    lines = result.stdout.splitlines()
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    assert fields["NoNewPrivs"].strip() == "1" and int(fields["CapEff"].strip(), 16) == 0, result.stdout
    assert int(fields["CapPrm"].strip(), 16) == 0
    assert "su=0" not in lines and "su-ran" not in lines and "mount=0" not in lines and "umount=0" not in lines
    assert lines[-1] != "0" and fields["Uid"].split()[0] != "0", result.stdout


async def test_a_run_sees_nothing_of_the_store_its_root_comes_from(figlet_store: Path, figlet_root: Path,
                                                                  tmp_path: Path, work_root: Path):
    library = debian_library(tmp_path, banner=["figlet"])
    other = figlet_store / "systems" / ("0" * 64)  # another root of the store, as another skill's
    paths = [figlet_store, figlet_store / "systems", figlet_store / "systems/.debs", figlet_store / ".locks",
             figlet_store / "locks", figlet_store / ".building", figlet_root, figlet_root / "usr", other,
             figlet_store.parent]
    debs = sorted((figlet_store / "systems/.debs").rglob("*.deb"))
    assert debs, "the store keeps its downloads"
    probe = " ".join(f"test -e {p} && echo sees {p};" for p in [*paths, debs[0]]) + (
        " ls /var/cache/apt/archives/*.deb 2>/dev/null | head -1; "
        " ls /proc/1/root/ >/dev/null 2>&1 && ls /proc/1/root/ | grep -x .debs; echo done")
    [result] = await _runs(figlet_store, library, work_root, probe)
    assert result.stdout.splitlines() == ["done"], result.stdout + result.stderr


async def test_a_run_in_a_root_sees_none_of_the_hosts_etc(figlet_store: Path, figlet_root: Path, tmp_path: Path,
                                                         work_root: Path):
    host_only = set(os.listdir("/etc")) - set(os.listdir(figlet_root / "etc"))
    assert host_only, "the host's /etc holds something a minimal root does not"
    library = debian_library(tmp_path, banner=["figlet"])
    probe = ("cat /etc/shadow >/dev/null 2>&1 && echo read-shadow; cat /etc/gshadow >/dev/null 2>&1 && echo read-gshadow; "
             "ls -A /etc; echo ---; cat /etc/os-release; echo ---; cat /etc/debian_version")
    [result] = await _runs(figlet_store, library, work_root, probe)
    listing, os_release, version = result.stdout.split("---\n")
    assert "read-shadow" not in listing and "read-gshadow" not in listing, result.stdout
    seen = set(listing.split())
    assert seen & host_only <= {"passwd", "group"}, seen & host_only
    assert seen <= set(os.listdir(figlet_root / "etc")) | {"passwd", "group", "resolv.conf"}
    assert os_release == (figlet_root / "etc/os-release").read_text()
    assert version == (figlet_root / "etc/debian_version").read_text()


async def test_a_run_in_a_root_reads_no_copy_of_the_build_hosts_files(figlet_store: Path, tmp_path: Path,
                                                                     work_root: Path):
    host = {name: Path("/etc", name).read_text() for name in ("hostname", "resolv.conf")
            if os.path.isfile(Path("/etc", name)) and Path("/etc", name).read_text().strip()}
    if not host:
        unavailable("this host has neither an /etc/hostname nor an /etc/resolv.conf to leak")
    library = debian_library(tmp_path, banner=["figlet"])
    [result] = await _runs(figlet_store, library, work_root,
                           *["; ".join(f"cat /etc/{name} 2>/dev/null; echo ---" for name in host)])
    shown = dict(zip(host, result.stdout.split("---\n")))
    for name, text in host.items():
        assert shown[name] != text, f"/etc/{name} in the root is the build host's: {text!r}"


async def test_the_runs_identity_is_its_own_in_a_root(figlet_store: Path, tmp_path: Path, work_root: Path):
    library = debian_library(tmp_path, banner=["figlet"])
    probe = "id -u; id -un; getent passwd $(id -u) | cut -d: -f1; whoami; getent passwd 0 | cut -d: -f3"
    [result] = await _runs(figlet_store, library, work_root, probe)
    uid, name, entry, who, root_uid = result.stdout.splitlines()
    assert uid != "0" and name.startswith("skillrun-") and who == name == entry, result.stdout
    assert root_uid == "0"  # root's entry still names root, not the run


# --- A store tampered with ------------------------------------------------------------------------------------------

async def test_a_root_removed_behind_the_stores_back_is_not_ready(figlet_store: Path, figlet_root: Path,
                                                                 shared_dir: Path, tmp_path: Path, work_root: Path):
    store = shared_dir / "store"
    (store / "systems").mkdir(parents=True, mode=0o711)
    for suffix in (".json", ".used"):  # the records, without the root itself
        subprocess.run(["cp", "-p", f"{figlet_root}{suffix}", str(store / "systems")], check=True)
    library = debian_library(tmp_path, banner=["figlet"])
    with environments_maker(store) as make:
        envs = make(systems=True)
        status = envs.status(library / "banner", library, "banner")
        async with LocalWorkspaceRuntime(work_root, environments=envs) as runtime:
            try:
                result = await runtime.run(RunRequest(
                    skill=SkillRef(name="banner", root=str(library), path="banner"), command="echo ran",
                    wait_for_environment=False))
            except EnvironmentNotReadyError as exc:
                result = exc
    assert status.image.state != "ready", status.message
    # Told it is not built (it will not wait), not a sandbox with no system ("bwrap: execvp /usr/bin/bash").
    assert isinstance(result, EnvironmentNotReadyError), (result.exit_code, result.stderr)


async def test_a_planted_systems_symlink_is_not_followed(shared_dir: Path, monkeypatch: pytest.MonkeyPatch):
    if not IS_ROOT:
        unavailable("root filesystems are built as root (debootstrap): run these tests as root")
    store = shared_dir / "store"
    store.mkdir(mode=0o711)
    planted = shared_dir / "planted"
    planted.mkdir(mode=0o777)
    os.chown(planted, 65534, 65534)
    (store / "systems").symlink_to(planted)

    async def fake_build(self, root, packages, progress):  # no real build: where it lands is the question
        for folder in ("usr/bin", "etc", "var/lib"):
            (root / folder).mkdir(parents=True)

    monkeypatch.setattr(SystemRoots, "_build_root", fake_build)
    with environments_maker(store) as make:
        roots = make(systems=True).systems
        try:
            path = await roots.ensure(("figlet",))
        except (EnvironmentBuildError, OSError):
            path = None
    assert os.listdir(planted) == []
    assert path is None or not path.resolve().is_relative_to(planted.resolve())


# --- Builds stopped midway, builds side by side ---------------------------------------------------------------------

async def _wait_for_debootstrap(store: Path, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if any(b"debootstrap" in Path(f"/proc/{pid}/cmdline").read_bytes()
               for pid in _processes_mentioning(str(store)) if os.path.exists(f"/proc/{pid}/cmdline")):
            await asyncio.sleep(3.0)  # well into it: downloading, extracting, /proc mounted in the new root
            return
        await asyncio.sleep(0.1)
    raise AssertionError("debootstrap did not start")


async def test_a_build_cancelled_midway_leaves_no_process_mount_folder_or_lock(fresh_store: Path, tmp_path: Path):
    library = debian_library(tmp_path, gone=["figlet"])
    with environments_maker(fresh_store) as make:
        envs = make(systems=True)
        task = asyncio.ensure_future(envs.prepare(library / "gone", library, "gone"))
        await _wait_for_debootstrap(fresh_store)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.5)
        assert _processes_mentioning(str(fresh_store)) == []
        assert left_building(fresh_store) == [] and mounts_under(fresh_store) == []
        assert sorted(p.name for p in (fresh_store / "systems").iterdir()) == [".debs"]
        status = envs.status(library / "gone", library, "gone")
    assert status.image.state == "not built", status.message


async def test_a_worker_killed_midway_leaves_no_build_running(fresh_store: Path):
    script = (
        "import asyncio, sys\n"
        "from tests.environment_stores import environments_maker\n"
        "from pathlib import Path\n"
        "with environments_maker(Path(sys.argv[1])) as make:\n"
        "    asyncio.run(make(systems=True).systems.ensure(('figlet',)))\n")
    worker = subprocess.Popen([sys.executable, "-c", script, str(fresh_store)], cwd=str(REPO),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    left: list[int] = []
    try:
        # Killed while debootstrap resolves dependencies (it writes nothing then, so no SIGPIPE from the pipe whose
        # reader died ends it): a build tied to its worker is gone at once; a stray one has the host to itself.
        deadline = time.monotonic() + 30
        while not any(b"Pre-Depends" in _cmdline(pid) for pid in _processes_mentioning("Pre-Depends")):
            assert time.monotonic() < deadline and worker.poll() is None, "debootstrap did not start resolving"
            await asyncio.sleep(0.01)
        worker.kill()
        worker.wait()
        await asyncio.sleep(0.3)
        left = _processes_mentioning(str(fresh_store))
        assert left == [], [_cmdline(pid)[:200] for pid in left]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pid in left:  # what this test's worker started and left behind: its session, by its id
            try:
                os.killpg(os.getpgid(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while _processes_mentioning(str(fresh_store)) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)


async def test_two_sets_built_at_once_share_the_downloads_and_both_work(fresh_store: Path, tmp_path: Path,
                                                                       work_root: Path):
    library = debian_library(tmp_path, one=["figlet"], two=["figlet", "procps"])
    debs_before = sorted(p.name for p in (fresh_store / "systems/.debs").rglob("*.deb"))
    with environments_maker(fresh_store) as make:  # two workers' views of one store
        first, second = make(systems=True), make(systems=True)
        one, two = await asyncio.gather(first.prepare(library / "one", library, "one"),
                                        second.prepare(library / "two", library, "two"))
    assert one.state == two.state == "ready", (one.message, two.message)
    assert one.image.tag != two.image.tag
    debs_after = sorted(p.name for p in (fresh_store / "systems/.debs").rglob("*.deb"))
    assert set(debs_before) <= set(debs_after)
    results = await _runs(fresh_store, library, work_root, "figlet -w 40 hi >/dev/null && echo ok", skill="one")
    results += await _runs(fresh_store, library, work_root, "figlet -w 40 hi >/dev/null && echo ok", skill="two",
                           workspace_id="other")
    assert [r.stdout for r in results] == ["ok\n", "ok\n"], [r.stderr for r in results]
    assert left_building(fresh_store) == [] and mounts_under(fresh_store) == []


# --- A network run in a root ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("host_resolv", [
    "/etc/resolv.conf",
    "/run/systemd/resolve/stub-resolv.conf",
])
async def test_a_network_run_in_a_root_gets_its_own_nameserver(figlet_store: Path, tmp_path: Path, work_root: Path,
                                                             monkeypatch: pytest.MonkeyPatch, host_resolv: str):
    ensure_installed("slirp4netns", "slirp4netns")
    from worker.sandbox import bubblewrap
    from worker.sandbox.user_network import RESOLV_CONF
    monkeypatch.setattr(bubblewrap, "resolv_conf_target", lambda: host_resolv)  # as such a host's would say
    library = debian_library(tmp_path, banner=["figlet"])
    with environments_maker(figlet_store) as make:
        async with LocalWorkspaceRuntime(work_root, environments=make(systems=True), allow_network=True) as runtime:
            result = await runtime.run(RunRequest(
                skill=SkillRef(name="banner", root=str(library), path="banner"), network=True,
                command="cat /etc/resolv.conf; figlet -w 40 hi >/dev/null && echo figlet"))
    assert result.exit_code == 0, result.stderr
    own = Path(RESOLV_CONF).read_text().strip()  # slirp4netns's DNS forwarder, not the host's nameserver
    assert own and result.stdout.startswith(own) and "figlet" in result.stdout.splitlines(), result.stdout
