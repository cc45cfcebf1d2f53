"""Attacks on the tree stager (``worker.workspaces.staging.TreeSkillStager``), the host runtimes' default.

A staged skill is a folder of the workspace user's own holding hard links to the library's files. A skill command
tries to change a library file through its link, to make the worker (root) follow what it planted in its staged
folder when the folder is staged again or the workspace removed, and to have output collection read host files
through it; hostile library content (links out, root-only files, set-uid files, special files, names of the
workspace links, large trees) is staged. Each test asserts the platform held; a hole found is written as the safe
behaviour, so the test fails on the current code (see each one's docstring).
"""

from __future__ import annotations

import ast
import asyncio
import base64
import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import write_skill
from tests.services import unavailable
from worker.contract import SkillRef
from worker.runtimes.host_files import WorkspaceFiles
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.workspaces.manager import WorkspaceManager
from worker.workspaces.staging import TreeSkillStager

pytestmark = pytest.mark.slow

SESSION = uuid.uuid4().hex[:8]
IS_ROOT = os.geteuid() == 0


def ws(name: str) -> str:
    return f"tree-{name}-{SESSION}"


def _py(code: str) -> str:
    return f"python3 -c {shlex.quote(textwrap.dedent(code))}"


def _state(path: Path) -> tuple:
    """Everything of a file a command must not change: bytes, mode, owner, times, extended attributes."""
    info = os.lstat(path)
    if stat.S_ISREG(info.st_mode):
        data = path.read_bytes()
    elif stat.S_ISLNK(info.st_mode):
        data = os.readlink(path).encode()
    else:
        data = f"{info.st_mode}:{info.st_rdev}".encode()
    try:
        xattrs = sorted(os.listxattr(path, follow_symlinks=False))
    except OSError:
        xattrs = []
    return (hashlib.sha256(data).hexdigest(), info.st_mode, info.st_uid, info.st_gid, info.st_mtime_ns,
            info.st_ino, xattrs)


def _tree_state(root: Path) -> dict[str, tuple]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            info = os.lstat(path)
            found[str(path.relative_to(root))] = (_state(path) if not stat.S_ISDIR(info.st_mode)
                                                  else (info.st_mode, info.st_uid, info.st_gid))
    return found


def _touch_folder(folder: Path, name: str = "ADDED.md") -> None:
    """Change the library folder (a file added: its mtime moves), so the next run stages the skill again."""
    time.sleep(0.02)
    (folder / name).write_text(f"added {time.time_ns()}\n")


@pytest.fixture
async def rt(work_root: Path) -> LocalWorkspaceRuntime:
    runtime = LocalWorkspaceRuntime(work_root, spawners="off")
    yield runtime
    await runtime.close()


@pytest.fixture
def victim(shared_dir: Path) -> Path:
    """A host folder of root's that no run may change: a file, a folder with a file."""
    folder = shared_dir / "victim"
    (folder / "inner").mkdir(parents=True)
    (folder / "keep.txt").write_text("host data\n")
    (folder / "inner" / "deep.txt").write_text("deep host data\n")
    return folder


# --- A library file through its hard link ------------------------------------------------------------------------


@pytest.mark.root
async def test_a_command_cannot_change_a_hard_linked_library_file_by_any_route(rt, make_request, library):
    lib_files = [library / "demo" / "USAGE.md", library / "demo" / "scripts" / "hello.sh",
                 library / "demo" / "SKILL.md"]
    before = {p: _state(p) for p in lib_files}
    probe = await rt.run(make_request("stat -c %i USAGE.md scripts/hello.sh", workspace_id=ws("edit")))
    # The attack is on the real thing: the staged files are the library's inodes.
    assert probe.stdout.split() == [str(before[lib_files[0]][5]), str(before[lib_files[1]][5])]
    attack = _py("""
        import os, subprocess
        results = {}
        def attempt(name, fn):
            try:
                fn()
                results[name] = "DONE"
            except OSError as exc:
                results[name] = type(exc).__name__
        def append(path):
            with open(path, "ab") as f:
                f.write(b"pwned")
        attempt("append", lambda: append("USAGE.md"))
        attempt("open-rw", lambda: os.close(os.open("USAGE.md", os.O_RDWR)))
        attempt("truncate", lambda: os.truncate("USAGE.md", 0))
        attempt("chmod", lambda: os.chmod("USAGE.md", 0o777))
        attempt("chown", lambda: os.chown("USAGE.md", os.getuid(), os.getgid()))
        attempt("utime-past", lambda: os.utime("USAGE.md", (1, 1)))
        attempt("utime-now", lambda: os.utime("USAGE.md"))
        attempt("setxattr", lambda: os.setxattr("USAGE.md", "user.pwned", b"1"))
        attempt("setxattr-nested", lambda: os.setxattr("scripts/hello.sh", "user.pwned", b"1"))
        def proc_fd():
            fd = os.open("SKILL.md", os.O_RDONLY)
            os.close(os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_APPEND))
        attempt("proc-fd-reopen", proc_fd)
        def proc_fd_chmod():
            fd = os.open("SKILL.md", os.O_RDONLY)
            os.chmod(f"/proc/self/fd/{fd}", 0o666)
        attempt("proc-fd-chmod", proc_fd_chmod)
        work = os.environ["WORK_DIR"]
        attempt("hardlink-elsewhere", lambda: os.link("USAGE.md", f"{work}/linked"))
        def moved():
            os.rename("scripts/hello.sh", f"{work}/moved.sh")
            append(f"{work}/moved.sh")
        attempt("rename-then-append", moved)
        attempt("chmod-moved", lambda: os.chmod(f"{work}/moved.sh", 0o777))
        def over_rename():
            # Replace the name, then try the inode that was there through a link kept aside.
            os.rename("SKILL.md", "kept.md")
            with open("SKILL.md", "w") as f:
                f.write("mine")
            append("kept.md")
        attempt("replace-then-append", over_rename)
        with open("mine.txt", "w") as f:
            f.write("a file of my own")
        print(results)
    """)
    result = await rt.run(make_request(attack, workspace_id=ws("edit")))
    assert result.exit_code == 0, result.stderr
    results = ast.literal_eval(result.stdout.strip())
    assert all(outcome != "DONE" for name, outcome in results.items() if name != "replace-then-append"), results
    assert results["replace-then-append"] != "DONE"
    for path in lib_files:
        assert _state(path) == before[path], path
    # What the command may do, it did: a file of its own; the skill's own names it could not move (sticky folders).
    staged = rt.workspaces.find_known(ws("edit")).skills_dir / "demo"
    assert (staged / "mine.txt").read_text() == "a file of my own"
    assert (staged / "SKILL.md").read_text().startswith("---\nname: demo") and not (staged / "kept.md").exists()
    assert (library / "demo" / "SKILL.md").read_text().startswith("---\nname: demo")


@pytest.mark.root
async def test_the_file_tools_decline_a_library_inode_a_command_moved_into_its_work_folder(rt, make_request,
                                                                                            library):
    """The worker writes workspace files itself (``WorkspaceFiles``, as root): a library inode must never reach a
    name the tools then write. The skill's folders are sticky, so the command cannot move one out; had it, the
    tools would decline it rather than truncate it."""
    target = library / "demo" / "USAGE.md"
    before = _state(target)
    result = await rt.run(make_request("mv USAGE.md \"$WORK_DIR/notes.md\"; mv scripts/hello.sh \"$OUTPUT_DIR/h.sh\"",
                                       workspace_id=ws("tools")))
    assert result.stderr.count("Operation not permitted") == 2, result.stderr
    workspace = rt.workspaces.find_known(ws("tools"))
    assert not (workspace.work_dir / "notes.md").exists() and not (workspace.path / "out" / "h.sh").exists()
    files = WorkspaceFiles(workspace.path, workspace.uid, workspace.gid)
    assert files.write("work/notes.md", b"written by the tools") is True  # a file of the workspace's own
    assert files.write("out/h.sh", b"x") is True
    assert _state(target) == before
    assert (library / "demo" / "scripts" / "hello.sh").read_text() == "echo \"hello from $SKILL_NAME\"\n"


@pytest.mark.root
async def test_an_input_named_like_a_moved_library_inode_replaces_it_and_never_writes_through(rt, make_request,
                                                                                               library):
    from worker.contract import InputFile

    before = _state(library / "demo" / "USAGE.md")
    await rt.run(make_request("mv USAGE.md \"$WORK_DIR/inputs/data.txt\"", workspace_id=ws("inputs")))
    result = await rt.run(make_request("cat \"$WORK_DIR/inputs/data.txt\"", workspace_id=ws("inputs"),
                                       inputs=[InputFile(name="data.txt", content=base64.b64encode(b"the input\n").decode())]))
    assert result.stdout == "the input\n", result.stderr
    assert _state(library / "demo" / "USAGE.md") == before


# --- What a command plants in its staged folder, at the next staging and at removal --------------------------------


PLANT = """
set -u
cd "$SKILLS_DIR/demo"
rm -rf scripts && ln -s {victim} scripts
rm -f USAGE.md && ln -s {victim}/keep.txt USAGE.md
ln -s {victim}/keep.txt ADDED.md
ln -s {victim} ADDEDDIR
ln -s {other} other-workspace
mkfifo fifo
mkdir -p nest/a && ln -s {victim}/inner nest/a/b && ln -s {victim} nest/up
ln -s / root-link
echo ok
"""


@pytest.mark.root
async def test_links_planted_in_the_staged_folder_are_not_followed_by_restaging_or_removal(rt, make_request, library,
                                                                                        victim):
    other = await rt.run(make_request("echo theirs > \"$WORK_DIR/secret\"; echo ok", workspace_id=ws("other")))
    assert other.stdout == "ok\n"
    other_ws = rt.workspaces.find_known(ws("other"))
    other_before = _tree_state(other_ws.path / "skills") | {"secret": _state(other_ws.work_dir / "secret")}
    victim_before, library_before = _tree_state(victim), _tree_state(library)

    command = PLANT.format(victim=victim, other=other_ws.skills_dir / "demo")
    planted = await rt.run(make_request(command, workspace_id=ws("plant")))
    assert planted.stdout == "ok\n", planted.stderr
    staged = rt.workspaces.find_known(ws("plant")).skills_dir / "demo"
    assert not (staged / "scripts").is_symlink(), "the skill's own folder was swapped (its parent is sticky)"
    assert (staged / "ADDED.md").is_symlink() and (staged / "root-link").is_symlink()

    # The library changes where the links stand (a file named like the planted link, a folder's mtime): restaged.
    _touch_folder(library / "demo")
    (library / "demo" / "scripts" / "new.sh").write_text("echo new\n")
    (library / "demo" / "ADDEDDIR").mkdir()
    (library / "demo" / "ADDEDDIR" / "f").write_text("lib\n")
    library_before = _tree_state(library)
    again = await rt.run(make_request("cat ADDED.md scripts/new.sh ADDEDDIR/f; ls", workspace_id=ws("plant")))
    assert again.exit_code == 0, again.stderr
    assert again.stdout.startswith("added ") and "echo new\nlib\n" in again.stdout
    assert "fifo" not in again.stdout.split() and "root-link" not in again.stdout.split()
    assert not (staged / "scripts").is_symlink() and (staged / "scripts" / "new.sh").stat().st_ino == (
        library / "demo" / "scripts" / "new.sh").stat().st_ino
    assert _tree_state(victim) == victim_before
    assert _tree_state(library) == library_before
    assert not [p for p in staged.parent.iterdir() if p.name.startswith((".old-", ".staging-"))]

    # Plant again, then the workspace goes.
    replant = (command.replace("mkfifo fifo", "mkfifo fifo2")
               .replace(f"ln -s {victim}/keep.txt ADDED.md", f"rm -f ADDED.md; ln -s {victim}/keep.txt ADDED.md")
               .replace(f"ln -s {victim} ADDEDDIR", f"rm -rf ADDEDDIR; ln -s {victim} ADDEDDIR"))
    assert (await rt.run(make_request(replant, workspace_id=ws("plant")))).stdout == "ok\n"
    rt.remove_workspace(ws("plant"))
    assert _tree_state(victim) == victim_before
    assert _tree_state(library) == library_before
    assert (_tree_state(other_ws.path / "skills") | {"secret": _state(other_ws.work_dir / "secret")}) == other_before


@pytest.mark.root
async def test_restaging_while_a_run_swaps_links_into_its_staged_folder_never_touches_the_host(rt, make_request,
                                                                                             library, victim):
    """One run keeps swapping its staged subfolder for a link to a host folder (and back) while other runs of its
    workspace stage the changed skill again and again: the rename aside and the removal of the old folder must
    never follow the link."""
    victim_before = _tree_state(victim)
    await rt.run(make_request("true", workspace_id=ws("race")))
    swapper = (
        f"cd \"$SKILLS_DIR\"; end=$((SECONDS+4)); while [ $SECONDS -lt $end ]; do "
        f"for d in demo .old-demo-* .staging-demo-*; do "
        f"(cd \"$d\" 2>/dev/null && rm -rf scripts 2>/dev/null; ln -sfn {victim} scripts 2>/dev/null; "
        f"ln -sfn {victim}/keep.txt ADDED.md 2>/dev/null; rm -f scripts 2>/dev/null; mkdir scripts 2>/dev/null; "
        f"ln -sfn {victim} scripts/x 2>/dev/null; rm -f scripts/x; rm -rf scripts; ln -sfn {victim} scripts) "
        f"2>/dev/null; done; done; echo swapped"
    )
    task = asyncio.create_task(rt.run(make_request(swapper, workspace_id=ws("race"))))
    await asyncio.sleep(0.3)
    for i in range(8):
        _touch_folder(library / "demo", f"ADDED-{i}.md")
        (library / "demo" / "scripts" / f"s{i}.sh").write_text("echo s\n")
        await rt.run(make_request("ls scripts >/dev/null 2>&1; true", workspace_id=ws("race")))
        assert _tree_state(victim) == victim_before
    swapped = await task
    assert "swapped" in swapped.stdout, swapped.stderr
    assert _tree_state(victim) == victim_before
    rt.remove_workspace(ws("race"))
    assert _tree_state(victim) == victim_before


# --- Hostile library content ---------------------------------------------------------------------------------------


@pytest.mark.root
async def test_links_out_root_only_files_setuid_files_and_special_files_in_the_library_give_the_command_nothing(
        rt, make_request, library, shared_dir):
    other_team = write_skill(shared_dir / "other-library", "private", files={"secret.txt": "other team secret\n"})
    os.chmod(other_team.parent, 0o700)
    host_secret = shared_dir / "host-secret"
    host_secret.write_text("root only\n")
    os.chmod(host_secret, 0o600)
    skill = write_skill(library, "hostile")
    os.symlink("/etc/shadow", skill / "shadow")
    os.symlink(other_team / "secret.txt", skill / "their-secret")
    os.symlink(other_team, skill / "their-skill")
    os.link(host_secret, skill / "hardlinked-secret")
    shutil.copy2("/usr/bin/id", skill / "suid-id")
    os.chmod(skill / "suid-id", 0o4755)
    os.mkfifo(skill / "fifo")
    os.mknod(skill / "mem", 0o644 | stat.S_IFCHR, os.makedev(1, 1))  # /dev/mem
    library_before = _tree_state(library)
    request = make_request(
        "for f in shadow their-secret their-skill/secret.txt hardlinked-secret; do cat $f 2>/dev/null "
        "&& echo LEAK-$f; done; ./suid-id -u; ls -A; readlink shadow", workspace_id=ws("hostile"),
        skill=SkillRef(name="hostile", root=str(library), path="hostile"),
        output_files=["shadow", "their-secret", "their-skill/secret.txt", "fifo", "mem"])
    result = await asyncio.wait_for(rt.run(request), 60)
    assert "LEAK" not in result.stdout, result.stdout
    assert "root only" not in result.stdout and "other team secret" not in result.stdout
    lines = result.stdout.split()
    assert lines[0] != "0"  # the set-uid file does not make the command root
    assert "fifo" not in lines and "mem" not in lines  # special files are left out
    assert lines[-1] == "/etc/shadow"  # links are kept as they are
    assert not result.output_files, [f.name for f in result.output_files]
    assert _tree_state(library) == library_before
    assert host_secret.read_text() == "root only\n" and stat.S_IMODE(host_secret.stat().st_mode) == 0o600


@pytest.mark.root
async def test_a_library_file_the_workspace_user_cannot_read_is_not_handed_out_by_output_collection(
        rt, make_request, library, shared_dir):
    """A library file only root may read (mode 0600: a key, or a hard link to a root-only host file) was staged as a
    hard link in the workspace: the command could not read it, but a skill-relative output pattern naming it had
    the collector (``worker.collect.collect_outputs``, which runs as root) read it and return its bytes. What others
    may not read is now left out of the staged folder."""
    host_secret = shared_dir / "root-only-key"
    host_secret.write_text("ROOT-ONLY-KEY\n")
    os.chmod(host_secret, 0o600)
    skill = write_skill(library, "keyed")
    os.link(host_secret, skill / "key.pem")
    request = make_request("cat key.pem 2>/dev/null && echo READ; true", workspace_id=ws("keyed"),
                           skill=SkillRef(name="keyed", root=str(library), path="keyed"), output_files=["key.pem"])
    result = await rt.run(request)
    assert "ROOT-ONLY-KEY" not in result.stdout  # the command itself cannot read it ...
    staged = rt.workspaces.find_known(ws("keyed")).skills_dir / "keyed" / "key.pem"
    assert not staged.exists(), "a file others may not read was staged"
    leaked = [f.name for f in result.output_files if "ROOT-ONLY-KEY" in base64.b64decode(f.content).decode()
              or "ROOT-ONLY-KEY" in f.content]
    assert not leaked, "a root-only library file was collected as an output of the run"  # ... nor get it collected


@pytest.mark.root
@pytest.mark.parametrize("how", ["owner", "group"])
async def test_a_library_file_of_a_uid_in_the_sandbox_range_cannot_be_changed_by_the_workspace_of_that_uid(
        rt, make_request, library, how):
    """Workspace users are 30000–59999 with no host user; a library file may still belong to such an id (a
    tarball unpacked as root keeps the owner it was made by: 30000+ is common in directory services) or to that
    group with g+w (umask 002). ``_refuse_writable_by_others`` refuses only o+w, and ``_place_file`` hard-links
    the file into the workspace of that uid, whose command then wrote the library file itself (its owner, or its
    group's write bit). Such a file is now copied (the copy root's, read-only)."""
    await rt.run(make_request("true", workspace_id=ws(f"range-{how}")))
    workspace = rt.workspaces.find_known(ws(f"range-{how}"))
    assert 30000 <= workspace.uid < 60000
    skill = write_skill(library, f"range-{how}", files={"data.txt": "library data\n"})
    target = skill / "data.txt"
    if how == "owner":
        os.chown(target, workspace.uid, 0)
        os.chmod(target, 0o644)
    else:
        os.chown(target, 0, workspace.gid)
        os.chmod(target, 0o664)
    request = make_request("echo PWNED >> data.txt; chmod 666 data.txt 2>/dev/null; true",
                           workspace_id=ws(f"range-{how}"),
                           skill=SkillRef(name=f"range-{how}", root=str(library), path=f"range-{how}"))
    result = await rt.run(request)
    # Either the skill is refused (clearly) or it is staged so that the library file cannot change.
    assert target.read_text() == "library data\n", f"the command wrote the library file ({result.stderr!r})"
    assert stat.S_IMODE(target.stat().st_mode) in (0o644, 0o664)


@pytest.mark.root
async def test_library_entries_named_like_the_workspace_links_do_not_replace_them(rt, make_request, library, victim):
    skill = write_skill(library, "named", files={"work/evil.txt": "lib work\n", "sub/work/ok.txt": "nested\n",
                                                  "sub/inputs": "a file\n"})
    (skill / "out").write_text("a file named out\n")
    os.symlink(victim, skill / "inputs")
    result = await rt.run(make_request(
        "readlink work out inputs; ls work/; cat sub/work/ok.txt sub/inputs; echo made > out/o.txt",
        workspace_id=ws("named"), skill=SkillRef(name="named", root=str(library), path="named"),
        output_files=["$OUTPUT_DIR/o.txt"]))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["../../work", "../../out", "../../work/inputs"]
    assert "evil.txt" not in result.stdout and "nested\na file\n" in result.stdout
    assert [f.content for f in result.output_files] == ["made\n"]
    assert not (victim / "o.txt").exists()


@pytest.mark.root
async def test_a_large_deep_library_skill_stages_in_bounded_time_and_stays_off_the_event_loop(rt, make_request,
                                                                                             library):
    skill = write_skill(library, "big")
    deep = skill
    for i in range(120):
        deep = deep / f"d{i}"
    deep.mkdir(parents=True)
    (deep / "bottom.txt").write_text("bottom\n")
    wide = skill / "wide"
    wide.mkdir()
    for i in range(3000):
        (wide / f"f{i}").write_text("x")
    request = make_request("cat d0/d1/d2/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/*/* >/dev/null 2>&1; "
                           "ls wide | wc -l", workspace_id=ws("big"),
                           skill=SkillRef(name="big", root=str(library), path="big"))
    started = time.monotonic()
    result = await rt.run(request)
    assert result.stdout.strip() == "3000", result.stderr
    assert time.monotonic() - started < 30
    workspace = rt.workspaces.find_known(ws("big"))
    staged = workspace.skills_dir / "big"
    assert (staged / os.path.relpath(deep, skill) / "bottom.txt").stat().st_ino == (deep / "bottom.txt").stat().st_ino
    assert rt.stager.current(workspace, request.skill) is None  # > MAX_QUICK_FOLDERS: never on the event loop
    # The deep tree the worker made goes with the workspace.
    rt.remove_workspace(ws("big"))
    assert not workspace.path.exists()


# --- Without a separate workspace user: copies ----------------------------------------------------------------------


def test_without_a_workspace_user_the_staged_files_are_copies_and_an_edit_in_place_is_restaged(work_root, library):
    manager = WorkspaceManager(work_root, isolate_users=False)
    workspace = manager.acquire(ws("nouser"))
    assert workspace.uid is None
    stager = TreeSkillStager()
    skill = SkillRef(name="demo", root=str(library), path="demo")
    staged = stager.stage(workspace, skill)
    source = library / "demo" / "USAGE.md"
    copy = staged / "USAGE.md"
    assert copy.stat().st_ino != source.stat().st_ino  # a real file, not the library's
    assert stat.S_IMODE(copy.stat().st_mode) & 0o222 == 0
    before = _state(source)
    os.chmod(copy, 0o644)
    copy.write_text("edited by the command\n")  # the command's own user owns the copy: it may do this
    assert _state(source) == before
    # The library file edited in place (no folder mtime moves): copies are checked file by file.
    time.sleep(0.02)
    with open(source, "a") as f:
        f.write("more usage\n")
    staged = stager.stage(workspace, skill)
    assert (staged / "USAGE.md").read_text() == "Call scripts/hello.sh.\nmore usage\n"


@pytest.mark.root
async def test_across_file_systems_the_staged_files_are_read_only_copies_the_command_cannot_change(
        rt, make_request, shared_dir):
    """A library on another file system (``EXDEV``): copies, made read-only; writing them fails, replacing works,
    the library is untouched; an edit of the library file in place is restaged."""
    mount = shared_dir / "otherfs"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0755", "tmpfs", str(mount)], check=False)  # noqa: ASYNC221
    if mounted.returncode:
        unavailable("cannot mount a tmpfs here (the test mounts one as root to stage across file systems)")
    try:
        library = mount / "library"
        write_skill(library, "far", files={"data.txt": "far data\n"})
        library_before = _tree_state(library)
        skill = SkillRef(name="far", root=str(library), path="far")
        result = await rt.run(make_request(
            "echo x >> data.txt 2>/dev/null && echo WROTE; chmod 666 data.txt 2>/dev/null && echo CHMOD; "
            "stat -c %a data.txt; rm -f data.txt && echo mine > data.txt && cat data.txt",
            workspace_id=ws("far"), skill=skill))
        lines = result.stdout.split()
        assert "WROTE" not in lines and "CHMOD" not in lines and lines[-1] == "444", result.stdout + result.stderr
        assert "Operation not permitted" in result.stderr  # a copy is root's, in a sticky folder
        assert _tree_state(library) == library_before
        await asyncio.sleep(0.02)
        with open(library / "far" / "data.txt", "a") as f:  # noqa: ASYNC230
            f.write("edited\n")
        again = await rt.run(make_request("cat data.txt", workspace_id=ws("far"), skill=skill))
        assert again.stdout == "far data\nedited\n"
    finally:
        rt.remove_workspace(ws("far")) if rt.workspaces.find_known(ws("far")) else None
        subprocess.run(["umount", "-l", str(mount)], check=False)  # noqa: ASYNC221


# --- The Docker runtime: the command runs in a container as the workspace's uid ------------------------------------


@pytest.mark.docker
@pytest.mark.root
async def test_in_a_container_a_command_cannot_change_a_hard_linked_library_file(docker_runtime_factory,
                                                                                make_request, library):
    runtime = docker_runtime_factory()
    lib_files = [library / "demo" / "USAGE.md", library / "demo" / "scripts" / "hello.sh"]
    before = {p: _state(p) for p in lib_files}
    result = await runtime.run(make_request(
        "stat -c %i USAGE.md; echo x >> USAGE.md 2>/dev/null && echo WROTE; truncate -s0 scripts/hello.sh "
        "2>/dev/null && echo TRUNC; chmod 777 USAGE.md 2>/dev/null && echo CHMOD; touch -d 2001-01-01 USAGE.md "
        "2>/dev/null && echo TOUCH; mv USAGE.md \"$WORK_DIR/m\" && { echo y >> \"$WORK_DIR/m\" 2>/dev/null "
        "&& echo MOVEDWROTE; }; echo mine > USAGE.md; cat USAGE.md", workspace_id=ws("docker")))
    lines = result.stdout.split()
    assert lines[0] == str(before[lib_files[0]][5]), result.stdout + result.stderr  # the library's inode itself
    assert not {"WROTE", "TRUNC", "CHMOD", "TOUCH", "MOVEDWROTE"} & set(lines), result.stdout
    assert lines[-1] != "mine" and "Permission denied" in result.stderr  # the skill's file stays the library's
    for path in lib_files:
        assert _state(path) == before[path]


@pytest.mark.docker
@pytest.mark.root
async def test_in_a_container_a_library_file_of_the_workspace_uid_cannot_be_changed(docker_runtime_factory,
                                                                                   make_request, library):
    """As on the local runtime: a library file owned by the workspace's uid, hard-linked into the workspace the
    container mounts writable, let the command append to the library file; it is now copied."""
    runtime = docker_runtime_factory()
    await runtime.run(make_request("true", workspace_id=ws("docker-range")))
    workspace = runtime.workspaces.find_known(ws("docker-range"))
    assert workspace.uid is not None
    skill = write_skill(library, "docker-range", files={"data.txt": "library data\n"})
    os.chown(skill / "data.txt", workspace.uid, 0)
    result = await runtime.run(make_request(
        "echo PWNED >> data.txt; true", workspace_id=ws("docker-range"),
        skill=SkillRef(name="docker-range", root=str(library), path="docker-range")))
    assert (skill / "data.txt").read_text() == "library data\n", f"the command wrote the library file {result.stderr!r}"
