"""Attacks on three new pieces: the Playwright browser links a root process adds to an environment a hostile build
left (``worker.environments.browsers.link_browsers``), the workspace's ``/workspace`` alias and the short ``TMPDIR``
it gives a sandboxed run (``SandboxSpec._layout``, ``command_environment(aliased=True)``), and the Debian package
names a library's ``skillrun.toml`` hands to a root filesystem's ``BUILD_SCRIPT``.

Every test asserts the safe outcome: it fails if the attack succeeds.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from tests.conftest import IS_ROOT, write_skill
from tests.environment_stores import environments_maker
from tests.services import unavailable
from worker.environments import browsers as browsers_module
from worker.environments.browsers import BROWSERS_FOLDER, CHROMIUM, MAX_BROWSERS_JSON_BYTES, link_browsers
from worker.environments.systems import SystemRoots
from worker.errors import EnvironmentBuildError

PYTHON_MANIFEST = "lib/python3.11/site-packages/playwright/driver/package/browsers.json"
NODE_MANIFEST = "node_modules/playwright-core/browsers.json"
GOOD = json.dumps({"browsers": [
    {"name": "chromium", "revision": "1255"}, {"name": "chromium-headless-shell", "revision": "1255"},
]})

@pytest.fixture
def as_root() -> None:
    """These attacks need root (devices, the sandboxed runtime): elsewhere a skip, under CI a failure."""
    if not IS_ROOT:
        unavailable("these attacks need root: devices and the sandboxed local runtime")


root_only = pytest.mark.usefixtures("as_root")


# ---------------------------------------------------------------------------------------------------------------
# helpers


def _tree(path: Path) -> dict[str, tuple]:
    """Everything under ``path`` (not following links): type, mode, owner, size, mtime, and a link's target or a
    small regular file's bytes."""
    found: dict[str, tuple] = {}
    if not os.path.lexists(path):
        return found
    for folder, dirs, files in os.walk(path, followlinks=False):
        for name in [*dirs, *files]:
            full = os.path.join(folder, name)
            info = os.lstat(full)
            extra: object = None
            if stat.S_ISLNK(info.st_mode):
                extra = os.readlink(full)
            elif stat.S_ISREG(info.st_mode) and info.st_size < 1 << 20:
                extra = Path(full).read_bytes()
            found[os.path.relpath(full, path)] = (stat.S_IFMT(info.st_mode), stat.S_IMODE(info.st_mode),
                                                  info.st_uid, info.st_size, info.st_mtime_ns, extra)
    return found


def _link(env: Path, seconds: float = 20.0) -> bool | EnvironmentBuildError:
    """``link_browsers(env)`` in a thread: what it returned, or the ``EnvironmentBuildError`` it raised. It must end
    within ``seconds`` (a FIFO or device must not hang the root process) and raise nothing else."""
    outcome: dict[str, object] = {}

    def call() -> None:
        try:
            outcome["value"] = link_browsers(env)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome["error"] = exc

    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"link_browsers({env}) did not return within {seconds} s"
    error = outcome.get("error")
    if isinstance(error, EnvironmentBuildError):
        return error
    if error is not None:
        raise AssertionError(
            f"link_browsers raised {type(error).__name__} ({error}); only EnvironmentBuildError is allowed") from error
    return outcome["value"]  # type: ignore[return-value]


def _host(tmp_path: Path) -> Path:
    """A folder outside the environment, standing for the host (what a build's links may point at)."""
    host = tmp_path / "host"
    host.mkdir()
    (host / "sentinel").write_text("host file\n")
    return host


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---------------------------------------------------------------------------------------------------------------
# link_browsers: links in the path to browsers.json


LINKED_COMPONENTS = [
    # (what the build made a link, where in the host folder the rest of the manifest's path is)
    ("node_modules", "playwright-core/browsers.json"),
    ("node_modules/playwright-core", "browsers.json"),
    ("lib", "python3.11/site-packages/playwright/driver/package/browsers.json"),
    ("lib/python3.11", "site-packages/playwright/driver/package/browsers.json"),
    ("lib/python3.11/site-packages", "playwright/driver/package/browsers.json"),
    ("lib/python3.11/site-packages/playwright/driver/package", "browsers.json"),
]


@pytest.mark.parametrize("linked, rest", LINKED_COMPONENTS, ids=[c for c, _ in LINKED_COMPONENTS])
def test_a_browsers_json_reached_through_a_linked_folder_outside_the_env_is_not_read(tmp_path, linked, rest):
    """The build makes a folder on the way to browsers.json a link to a host folder that holds one: the root
    process must not read a host file through it (as it refuses a browsers.json that is itself a link)."""
    host = _host(tmp_path)
    _write(host / "target" / rest, GOOD)
    env = tmp_path / "env"
    (env / linked).parent.mkdir(parents=True)
    (env / linked).symlink_to(host / "target", target_is_directory=True)
    before = _tree(host)
    assert _link(env) is False
    assert not os.path.lexists(env / BROWSERS_FOLDER)
    assert _tree(host) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env", "host"]


def test_a_linked_folder_leading_to_a_host_fifo_neither_hangs_nor_is_read(tmp_path):
    host = _host(tmp_path)
    (host / "pc").mkdir()
    os.mkfifo(host / "pc" / "browsers.json")
    env = tmp_path / "env"
    (env / "node_modules").mkdir(parents=True)
    (env / "node_modules/playwright-core").symlink_to(host / "pc")
    before = _tree(host)
    assert _link(env, 10) is False
    assert not os.path.lexists(env / BROWSERS_FOLDER)
    assert _tree(host) == before


# ---------------------------------------------------------------------------------------------------------------
# link_browsers: browsers.json that is not a small regular file


def _special(kind: str, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero-device":
        os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))
    elif kind == "null-device":
        os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 3))
    elif kind == "directory":
        path.mkdir()
        (path / "browsers.json").write_text(GOOD)
    elif kind == "sparse-terabyte":
        with open(path, "wb") as handle:
            handle.write(GOOD.encode())
            handle.truncate(1 << 40)
    elif kind == "just-past-the-cap":
        path.write_text(GOOD + " " * (MAX_BROWSERS_JSON_BYTES + 1 - len(GOOD)))
    elif kind == "link-to-dev-zero":
        path.symlink_to("/dev/zero")
    else:
        raise AssertionError(kind)


SPECIAL = ["fifo", "zero-device", "null-device", "directory", "sparse-terabyte", "just-past-the-cap",
           "link-to-dev-zero"]


@root_only
@pytest.mark.parametrize("manifest", [PYTHON_MANIFEST, NODE_MANIFEST], ids=["python", "node"])
@pytest.mark.parametrize("kind", SPECIAL)
def test_a_browsers_json_that_is_no_small_regular_file_links_nothing_and_does_not_hang(tmp_path, manifest, kind):
    host = _host(tmp_path)
    env = tmp_path / "env"
    _special(kind, env / manifest)
    before = _tree(host)
    assert _link(env, 10) is False
    assert not os.path.lexists(env / BROWSERS_FOLDER)
    assert _tree(host) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env", "host"]


# ---------------------------------------------------------------------------------------------------------------
# link_browsers: hostile contents


HOSTILE_CONTENTS = {
    "unhashable-name-list": json.dumps({"browsers": [{"name": ["chromium"], "revision": "1255"}]}),
    "unhashable-name-dict": json.dumps({"browsers": [{"name": {"chromium": 1}, "revision": "1255"}]}),
    "unhashable-name-beside-a-good-one": json.dumps({"browsers": [
        {"name": "chromium", "revision": "1255"}, {"name": [], "revision": "1"}]}),
    "deeply-nested-browsers": '{"browsers": ' + "[" * 20_000 + "]" * 20_000 + "}",
    "deeply-nested-document": "[" * 30_000,
    "deeply-nested-object": '{"a":' * 10_000 + "1" + "}" * 10_000,
    "revision-with-newline": json.dumps({"browsers": [{"name": "chromium", "revision": "1255\n"}]}),
    "unicode-digits": json.dumps({"browsers": [{"name": "chromium", "revision": "١٢٥٥"}]}),
    "nul-in-revision": json.dumps({"browsers": [{"name": "chromium", "revision": "12\u000055"}]}),
    "bad-utf8": b'{"browsers": [{"name": "chromium\xff", "revision": "1"}]}'.decode("latin-1"),
    "huge-number": '{"browsers": [{"name": "chromium", "revision": ' + "9" * 5000 + "}]}",
}


@pytest.mark.parametrize("manifest", [PYTHON_MANIFEST, NODE_MANIFEST], ids=["python", "node"])
@pytest.mark.parametrize("name", list(HOSTILE_CONTENTS))
def test_a_hostile_browsers_json_links_nothing_and_raises_nothing_unexpected(tmp_path, manifest, name):
    """A browsers.json the build wrote to break the root process: it asks for no browser (or fails the build with
    an EnvironmentBuildError), never a TypeError or RecursionError out of ``_publish``."""
    env = tmp_path / "env"
    path = env / manifest
    path.parent.mkdir(parents=True)
    text = HOSTILE_CONTENTS[name]
    path.write_bytes(text.encode("latin-1") if name == "bad-utf8" else text.encode())
    outcome = _link(env)
    if isinstance(outcome, EnvironmentBuildError):
        assert str(outcome)
        outcome = False
    if name == "unhashable-name-beside-a-good-one" and outcome is True:  # the good entry may be honoured
        assert set(os.listdir(env / BROWSERS_FOLDER)) == {"chromium-1255"}
        return
    assert outcome is False
    assert not os.path.lexists(env / BROWSERS_FOLDER)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env"]


# ---------------------------------------------------------------------------------------------------------------
# link_browsers: what the build left where the links go


def _prepare_leftover(kind: str, env: Path, host: Path) -> None:
    where = env / BROWSERS_FOLDER
    if kind == "file":
        where.write_text("planted\n")
    elif kind == "empty-folder":
        where.mkdir()
    elif kind == "folder-with-revision-link":
        where.mkdir()
        (where / "chromium-1255").symlink_to(host)
    elif kind == "dangling-link":
        where.symlink_to(host / "made-by-root")
    elif kind == "link-to-host-folder":
        where.symlink_to(host, target_is_directory=True)
    elif kind == "fifo":
        os.mkfifo(where)
    elif kind == "self-loop":
        where.symlink_to(BROWSERS_FOLDER)
    else:
        raise AssertionError(kind)


LEFTOVERS = ["file", "empty-folder", "folder-with-revision-link", "dangling-link", "link-to-host-folder", "fifo",
             "self-loop"]


@pytest.mark.parametrize("kind", LEFTOVERS)
def test_a_browsers_folder_the_build_left_is_refused_and_nothing_outside_is_written(tmp_path, kind):
    host = _host(tmp_path)
    env = tmp_path / "env"
    _write(env / NODE_MANIFEST, GOOD)
    _prepare_leftover(kind, env, host)
    planted = os.lstat(env / BROWSERS_FOLDER)
    before = _tree(host)
    outcome = _link(env)
    assert isinstance(outcome, EnvironmentBuildError), outcome
    assert BROWSERS_FOLDER in str(outcome) and "refused" in str(outcome)
    assert _tree(host) == before
    assert not os.path.lexists(host / "made-by-root")
    after = os.lstat(env / BROWSERS_FOLDER)
    assert (after.st_ino, after.st_mode, after.st_mtime_ns) == (planted.st_ino, planted.st_mode, planted.st_mtime_ns)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env", "host"]


def test_links_named_like_revision_folders_elsewhere_in_the_env_are_not_used(tmp_path):
    """The build plants, beside the browsers folder to be, links named as its revision folders and programs: the
    links Skillrun makes go into a folder of its own, made now, and lead to Chromium only."""
    host = _host(tmp_path)
    env = tmp_path / "env"
    _write(env / PYTHON_MANIFEST, GOOD)
    for name in ("chromium-1255", "chromium_headless_shell-1255", "chrome-linux64", "DEPENDENCIES_VALIDATED"):
        (env / name).symlink_to(host, target_is_directory=True)
    (env / "lib/python3.11/site-packages/chromium-1255").symlink_to(host)
    before = _tree(host)
    assert _link(env) is True
    folder = env / BROWSERS_FOLDER
    info = os.lstat(folder)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o755
    entries = _tree(folder)
    assert set(os.listdir(folder)) == {"chromium-1255", "chromium_headless_shell-1255"}
    links = {k: v[-1] for k, v in entries.items() if v[0] == stat.S_IFLNK}
    assert links and set(links.values()) == {CHROMIUM}
    for rel, (kind, *_rest) in entries.items():
        assert kind in (stat.S_IFDIR, stat.S_IFREG, stat.S_IFLNK), rel
        assert os.path.realpath(os.path.dirname(folder / rel)).startswith(str(folder))
    assert _tree(host) == before


# ---------------------------------------------------------------------------------------------------------------
# link_browsers: many python3* entries


def test_thousands_of_python3_entries_in_lib_end_and_link_once(tmp_path):
    """lib/ full of python3* names: plain files, links looping on themselves, links to a host folder (holding no
    Playwright: reading one through a link is the test above), and 2000 real Playwright packages all asking for the
    same build."""
    host = _host(tmp_path)
    env = tmp_path / "env"
    lib = env / "lib"
    lib.mkdir(parents=True)
    for n in range(20_000):
        (lib / f"python3.file{n}").write_bytes(b"")
    for n in range(1000):
        (lib / f"python3.loop{n}").symlink_to(f"python3.loop{n}")
        (lib / f"python3.host{n}").symlink_to(host, target_is_directory=True)
    for n in range(2000):
        _write(lib / f"python3.{n}" / "site-packages/playwright/driver/package/browsers.json", GOOD)
    before = _tree(host)
    assert _link(env, 60) is True
    assert set(os.listdir(env / BROWSERS_FOLDER)) == {"chromium-1255", "chromium_headless_shell-1255"}
    assert _tree(host) == before


def test_thousands_of_playwrights_asking_for_different_builds_link_nothing(tmp_path):
    env = tmp_path / "env"
    for n in range(3000):
        _write(env / "lib" / f"python3.{n}" / "site-packages/playwright/driver/package/browsers.json",
               json.dumps({"browsers": [{"name": "chromium", "revision": str(n)}]}))
    assert _link(env, 60) is False
    assert not os.path.lexists(env / BROWSERS_FOLDER)
    assert browsers_module.MAX_BUILDS < 3000


# ---------------------------------------------------------------------------------------------------------------
# /workspace and TMPDIR through the real sandboxed local runtime


def _escape_script(victim: Path, work_root: Path, outside: Path) -> str:
    """Every attempt prints ``broke:<what>`` when it worked."""
    attempts = {
        "write-above-alias": 'echo x > /workspace/../x',
        "new-top-folder": "mkdir /workspace2",
        "write-root": "touch /escaped",
        "link-in-runs": "ln -s / /workspace/runs/evil",
        "spare-in-runs": "mkdir /workspace/runs/.next",
        "replace-runs": "mv /workspace/runs /workspace/runs.old",
        "replace-own-run": 'mv "$TMPDIR" /workspace/work/moved',
        "remove-own-run": 'rmdir "$TMPDIR"',
        "write-workspace-root": "touch /workspace/planted",
        "bind-over-alias": "mount --bind /tmp /workspace",
        "unmount-alias": "umount -l /workspace",
        "tmpfs-over-alias": "mount -t tmpfs none /workspace",
        "nested-userns-bind": "unshare -Urm sh -c 'mount --bind / /workspace && touch /workspace/nested'",
        "see-victim": f"test -e {victim}",
        "see-victim-via-alias": f"test -e /workspace/..{victim}",
        "read-victim-secret": f"cat {victim}/work/secret",
        "see-other-workspaces": f"ls {work_root} | grep -v \"^$(basename $(dirname $(dirname \"$RUN_DIR\")))$\" | grep .",
        "see-outside": f"test -e {outside}",
        "write-outside": f"echo x > {outside}/written",
        "dotdot-tmpdir": 'echo x > "$TMPDIR/../../../x"',
        "tmpdir-outside-workspace": 'case "$(realpath "$TMPDIR")" in /workspace/runs/run_*) false;; *) true;; esac',
        "tmpdir-not-run-dir": 'test ! "$TMPDIR" -ef "$RUN_DIR"',
    }
    control = 'test -d /workspace/runs && test -w "$TMPDIR" && echo control-ok\n'  # the attempts do run
    return control + "\n".join(f"( {cmd} ) >/dev/null 2>&1 && echo broke:{name}" for name, cmd in attempts.items()) \
        + "\necho done\n"


@root_only
async def test_a_run_cannot_use_the_workspace_alias_to_reach_other_workspaces_or_the_host(
        runtime, make_request, work_root, shared_dir):
    assert runtime.sandbox, "the local runtime must be sandboxed for this attack"
    outside = shared_dir / "outside"
    outside.mkdir()
    (outside / "secret").write_text("outside\n")
    victim_run = await runtime.run(make_request('echo victim-secret > "$WORK_DIR/secret"', workspace_id="alias-victim"))
    assert victim_run.exit_code == 0, victim_run.stderr
    victim = runtime.workspaces.find("alias-victim")
    assert (victim.work_dir / "secret").read_text() == "victim-secret\n"
    victim_before = _tree(victim.path / "work")
    outside_before = _tree(outside)
    host_tops = {name: os.path.lexists(f"/{name}") for name in ("x", "workspace2", "escaped", "nested")}
    await runtime.idle()
    for _ in range(3):  # a sandbox of its own, then (through a spawner) the workspace's held sandbox
        result = await runtime.run(make_request(_escape_script(victim.path, work_root, outside),
                                                workspace_id="alias-attacker"))
        assert result.stdout.startswith("control-ok\n") and result.stdout.endswith("done\n"), \
            (result.stdout, result.stderr)
        assert "broke:" not in result.stdout, result.stdout
        await runtime.idle()
    attacker = runtime.workspaces.find("alias-attacker")
    assert _tree(victim.path / "work") == victim_before
    assert _tree(outside) == outside_before
    assert {name: os.path.lexists(f"/{name}") for name in host_tops} == host_tops
    assert not os.path.lexists(work_root.parent / "x")
    names = set(os.listdir(attacker.runs_dir))
    assert all(n.startswith("run_") or n == ".next" for n in names), names
    assert all(stat.S_ISDIR(os.lstat(attacker.runs_dir / n).st_mode) for n in names)
    assert not os.path.lexists(attacker.path / "planted")
    assert not os.path.lexists(attacker.path / "runs.old")
    assert not os.path.lexists(attacker.work_dir / "moved")


TMPDIR_RUN = r"""
test "$TMPDIR" -ef "$RUN_DIR" && echo same-folder
case "$TMPDIR" in /workspace/runs/run_*) echo short-path;; esac
test -e "$TMPDIR/left-by-earlier-run" && echo leaked
ls -A "$TMPDIR" | grep . && echo not-empty
echo "run-dir:$RUN_DIR"
echo "tmpdir-real:$(realpath "$TMPDIR")"
python3 -c 'import tempfile; print("mkstemp:" + tempfile.mkstemp()[1])'
echo secret > "$TMPDIR/left-by-earlier-run"
# what a run may do to its own folder: fill it with links out, try to swap it and runs/ for links
ln -s / "$TMPDIR/root-link"; ln -s /workspace/work "$TMPDIR/work-link"
mkdir "$TMPDIR/sub"; ln -s ../../../../ "$TMPDIR/sub/up"
( mv "$TMPDIR" "$TMPDIR.moved" && ln -s / "$TMPDIR" ) 2>/dev/null
( rmdir "$TMPDIR" || ln -sfn / "$TMPDIR" ) 2>/dev/null
( mv /workspace/runs /workspace/x && ln -s /tmp /workspace/runs ) 2>/dev/null
true
"""


@root_only
async def test_tmpdir_is_the_runs_own_fresh_folder_whatever_an_earlier_run_did(runtime, make_request):
    assert runtime.sandbox
    seen: list[str] = []
    for n in range(4):  # own sandboxes and the held sandbox alike
        result = await runtime.run(make_request(TMPDIR_RUN, workspace_id="alias-tmpdir"))
        assert result.exit_code == 0, result.stderr
        out = result.stdout.splitlines()
        assert "same-folder" in out and "short-path" in out, result.stdout
        assert "leaked" not in out and "not-empty" not in out, result.stdout
        run_dir = next(line.split(":", 1)[1] for line in out if line.startswith("run-dir:"))
        real = next(line.split(":", 1)[1] for line in out if line.startswith("tmpdir-real:"))
        made = next(line.split(":", 1)[1] for line in out if line.startswith("mkstemp:"))
        assert real == f"/workspace/runs/{os.path.basename(run_dir)}"
        assert made.startswith(f"/workspace/runs/{os.path.basename(run_dir)}/")
        workspace = runtime.workspaces.find("alias-tmpdir")
        host_run = Path(run_dir)
        assert host_run.parent == workspace.runs_dir and os.path.realpath(host_run) == str(host_run)
        assert stat.S_ISDIR(os.lstat(host_run).st_mode)
        assert (host_run / "left-by-earlier-run").read_text() == "secret\n"  # landed in the run folder
        assert (host_run / os.path.basename(made)).is_file()
        assert run_dir not in seen
        seen.append(run_dir)
        assert stat.S_ISDIR(os.lstat(workspace.runs_dir).st_mode)
        assert os.lstat(workspace.runs_dir).st_uid == 0
        assert not os.path.lexists(workspace.path / "x")
        await runtime.idle()


# ---------------------------------------------------------------------------------------------------------------
# Debian package names a manifest hands to BUILD_SCRIPT


OPTION_OR_SHELL_NAMES = [
    "-o", "--allow-unauthenticated", "-oAPT::Get::AllowUnauthenticated=1", "--reinstall", "-y", "--",
    "$(id)", "`id`", "a;b", "a&&b", "a|b", "a b", "a\nb", "figlet\n", "\nfiglet", "figlet\t", " figlet", "figlet ",
    "A", "Figlet", "x", "a" * 64, "", "pkg=1.0", "pkg/sid", "pkg:amd64", "../x", "./x", "/tmp/x.deb",
    "~nfiglet", "?name(figlet)", "figl*", "figl?t", "[f]iglet", "^figlet", "figlet$", "f\u00edglet", "figlet\u0000",
    "+figlet", ".figlet", "-figlet", "figlet\\",
]
APT_ACTION_NAMES = ["figlet-", "bash-", "coreutils-"]
"""Names Debian's own rules allow but apt-get install reads as "remove this package" (a trailing minus)."""


def _debian_manifest(tmp_path: Path, packages: list[str]) -> tuple[Path, Path]:
    library = tmp_path / "library"
    skill = write_skill(library, "deb")
    (library / "skillrun.toml").write_text(f"[skills.deb]\ndebian = {json.dumps(packages)}\n")
    return library, skill


async def _prepared_without_a_build(tmp_path: Path, monkeypatch, packages: list[str]):
    calls: list[object] = []

    async def no_build(self, *args, **kwargs):
        calls.append(args)
        raise EnvironmentBuildError("stopped by the test: a root filesystem build was started")

    monkeypatch.setattr(SystemRoots, "_build_root", no_build)
    monkeypatch.setattr(SystemRoots, "_build", no_build)
    library, skill = _debian_manifest(tmp_path, packages)
    store = tmp_path / "store"
    with environments_maker(store) as make:
        envs = make(systems=True)
        status = await envs.prepare(skill, library, "deb")
    return status, calls, store


@root_only
@pytest.mark.parametrize("name", OPTION_OR_SHELL_NAMES, ids=[repr(n)[:40] for n in OPTION_OR_SHELL_NAMES])
async def test_a_debian_name_that_is_an_option_or_shell_text_is_refused_before_any_build(tmp_path, monkeypatch, name):
    status, calls, store = await _prepared_without_a_build(tmp_path, monkeypatch, ["figlet", name])
    assert status.state == "invalid", status
    assert "is not a Debian package name" in (status.message or "")
    assert calls == []
    assert not os.path.lexists(store / "systems") or not any(
        p.name != ".debs" for p in (store / "systems").iterdir())


@root_only
@pytest.mark.parametrize("name", APT_ACTION_NAMES)
async def test_a_debian_name_apt_reads_as_a_removal_is_refused_before_any_build(tmp_path, monkeypatch, name):
    """``apt-get install -- bash-`` removes bash (apt strips a trailing ``-`` as the "remove" action when no package
    has the whole name): such a name is no package to install and must be refused like any other non-name."""
    status, calls, _store = await _prepared_without_a_build(tmp_path, monkeypatch, [name])
    assert status.state == "invalid", status
    assert calls == []


@root_only
async def test_a_valid_debian_name_does_reach_the_build(tmp_path, monkeypatch):
    """The control: the stand-in build above is what a valid declaration reaches."""
    status, calls, _store = await _prepared_without_a_build(tmp_path, monkeypatch, ["figlet", "g++", "python3.11"])
    assert status.state != "invalid" and len(calls) == 1, status
    assert list(calls[0][1]) == ["figlet", "g++", "python3.11"]


@root_only
async def test_the_most_debian_names_plus_one_is_refused_before_any_build(tmp_path, monkeypatch):
    status, calls, _store = await _prepared_without_a_build(tmp_path, monkeypatch,
                                                            [f"pkg{n}" for n in range(257)])
    assert status.state == "invalid" and "at most" in (status.message or "")
    assert calls == []
