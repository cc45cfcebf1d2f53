"""Escapes a normal account's sandboxed runs might try: reaching the account's home and its other workspaces (they
share its uid), steering the worker's host-side work (staging, run folders, removal, output collection) with what a
run leaves in its workspace, outliving the run, reaching the account's other processes, sockets and shared memory,
exhausting the account, and swapping the work root under a checked runtime. Every check runs as the account
(``tests.normal_user``), through the local runtime the guide builds (``resolve_runtime("local")``) or the CLI.

The account owns its workspaces, so file modes keep nothing of them from its runs: the sandbox shows the workspace
read-only but for ``work/``, ``out/``, the run folder and the staged skill. The tests here plant what a run could
plant and look at what the worker does with it next.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import time
from pathlib import Path

import pytest

from tests.normal_user import REPO, Account, cli, driver, job_line, local_runs, results_of, run_as
from tests.services import unavailable
from worker.roots.folders import remove_tree

@pytest.fixture
def home_folder(account: Account) -> Path:
    """A folder of the account's own in its home (as its documents are), removed afterwards."""
    path = account.home / f"documents-{secrets.token_hex(4)}"
    path.mkdir()
    if os.geteuid() == 0:
        os.chown(path, account.uid, account.gid)
    yield path
    remove_tree(path)


def _as_account(account: Account, path: Path) -> None:
    if os.geteuid() == 0:
        for folder, _, files in os.walk(path):
            os.chown(folder, account.uid, account.gid)
            for name in files:
                os.chown(os.path.join(folder, name), account.uid, account.gid)


def drive(account: Account, skill_root: Path, runs: list[dict], cache: Path, *, options: dict | None = None,
          env: dict[str, str] | None = None) -> list[dict]:
    """Run ``runs`` on one local runtime, as the account, its default work root under ``cache``."""
    return local_runs(account, skill_root, runs, options=options, env={"XDG_CACHE_HOME": str(cache), **(env or {})})


def one(account: Account, skill_root: Path, command: str, cache: Path, **fields) -> dict:
    [result] = drive(account, skill_root, [{"command": command, **fields}], cache)
    return result


POISON_UID = """python3 -c '
import json, os
path = os.environ["WORKSPACE_DIR"] + "/metadata.json"
meta = json.load(open(path))
meta["uid"] = meta["gid"] = os.getuid()
open(path, "w").write(json.dumps(meta))
'; echo poisoned"""
"""Says in the workspace's metadata that the workspace has a user of its own: the account's uid."""


@pytest.mark.root
def test_a_run_cannot_have_the_worker_kill_the_accounts_processes(account, skill_root, cache):
    """The CLI's one-off run (its workspace removed after the result) whose command names the account's uid as its
    workspace's user: the account's other processes (its editor, its session) and the CLI itself must live on."""
    victim = subprocess.Popen(["sleep", "120"], user=account.uid, group=account.gid, extra_groups=[])
    try:
        done = run_as(account, [*cli(account), "run", "--skills-root", str(skill_root), "probe", POISON_UID],
                      env={"XDG_CACHE_HOME": str(cache)}, timeout=120)
        time.sleep(0.2)
        alive = victim.poll() is None
    finally:
        victim.kill()
        victim.wait()
    assert (done.returncode, done.stdout, alive) == (0, "poisoned\n", True), (done.returncode, done.stderr[-2000:])


PLANT_SKILLS = """mv "$WORKSPACE_DIR/skills" "$WORKSPACE_DIR/skills.was" && ln -s {target} "$WORKSPACE_DIR/skills" &&
python3 -c '
import json, os
path = os.environ["WORKSPACE_DIR"] + "/metadata.json"
meta = json.load(open(path))
meta["staged"] = {{}}
open(path, "w").write(json.dumps(meta))
' && echo planted"""
"""Swaps the workspace's ``skills`` folder for a link to ``target`` (a folder of the account's, outside the sandbox:
the link is a name only there) and forgets what was staged, so the next worker stages again."""


def test_a_planted_skills_link_does_not_steer_staging_into_the_accounts_home(account, skill_root, cache, home_folder):
    precious = home_folder / "probe" / "precious.txt"
    precious.parent.mkdir()
    precious.write_text("the account's own\n")
    _as_account(account, home_folder)
    [planted] = drive(account, skill_root, [{"command": PLANT_SKILLS.format(target=home_folder),
                                             "workspace_id": "kept"}], cache)
    assert planted["stdout"] == "" and "Read-only file system" in planted["stderr"], planted  # skills/ is the worker's
    # A later worker (the next CLI call, a restarted one) runs in the kept workspace: it stages the skill again.
    drive(account, skill_root, [{"command": "true", "workspace_id": "kept"},
                                {"command": "true", "workspace_id": "kept", "skill": "other"}], cache)
    assert precious.read_text() == "the account's own\n"
    assert sorted(os.listdir(home_folder)) == ["probe"] and os.listdir(home_folder / "probe") == ["precious.txt"]


def test_a_planted_runs_link_does_not_steer_run_folders_out_of_the_workspace(account, skill_root, cache, home_folder):
    plant = f'mv "$WORKSPACE_DIR/runs" "$WORKSPACE_DIR/runs.was" && ln -s {home_folder} "$WORKSPACE_DIR/runs" && echo planted'
    results = drive(account, skill_root, [{"command": plant, "workspace_id": "kept"},
                                          {"command": "true", "workspace_id": "kept"},
                                          {"command": "true", "workspace_id": "kept"}], cache)
    assert results[0]["stdout"] == "" and "Read-only file system" in results[0]["stderr"], results  # the worker's
    assert [result["exit_code"] for result in results[1:]] == [0, 0] and os.listdir(home_folder) == []


def test_a_run_finds_nothing_of_the_accounts_other_workspaces(account, skill_root, cache):
    """Two workspaces of one runtime share the account's uid: the second finds nothing of the first, by its path,
    through the work root, ``/workspace``'s parent, ``/proc`` or a search of the whole file system."""
    tag = secrets.token_hex(6)
    [first] = drive(account, skill_root, [{"command": f'echo {tag} > "$WORK_DIR/secret-{tag}.txt"; echo "$WORKSPACE_DIR"',
                                           "workspace_id": "first"}], cache)
    path = first["stdout"].strip()
    assert (Path(path) / "work" / f"secret-{tag}.txt").read_text() == f"{tag}\n", first  # there, outside
    [second] = drive(account, skill_root, [{"command": f"""
        cat {path}/work/secret-{tag}.txt 2>/dev/null
        cat "$(dirname "$WORKSPACE_DIR")"/ws_first_*/work/secret-{tag}.txt 2>/dev/null
        ls -A "$(dirname "$WORKSPACE_DIR")" | grep -v "^$(basename "$WORKSPACE_DIR")$"
        ls -A /workspace/.. | grep -e ws_ -e skillrun
        cat /proc/[0-9]*/root{path}/work/secret-{tag}.txt 2>/dev/null
        find / -path /proc -prune -o -name "secret-{tag}.txt" -print 2>/dev/null
        grep -rl {tag} /tmp /dev/shm "$(dirname "$WORKSPACE_DIR")" 2>/dev/null | grep -v "^$WORKSPACE_DIR"
        true
    """, "workspace_id": "second"}], cache)
    assert second["exit_code"] == 0 and second["stdout"] == "", second


def test_a_run_never_sees_nor_changes_the_work_roots_registry(account, skill_root, cache):
    """The work root's ``.skillrun`` (use files, identities, artifacts, environments) is the account's like the
    workspace, but not in the sandbox: nothing there to read, nor to plant."""
    result = one(account, skill_root, """
        root="$(dirname "$WORKSPACE_DIR")"
        ls -A "$root/.skillrun" 2>/dev/null && echo "registry listed"
        mkdir -p "$root/.skillrun/planted" 2>/dev/null && echo "registry planted"
        ln -s /workspace "$root/.skillrun/link" 2>/dev/null && echo "link planted"
        mkdir "$root/ws_planted_1" 2>/dev/null && echo "workspace planted"
        true
    """, cache)
    registry = cache / "skillrun" / ".skillrun"
    assert result["exit_code"] == 0 and result["stdout"] == "", result
    assert not (registry / "planted").exists() and not (registry / "link").is_symlink()
    assert not (cache / "skillrun" / "ws_planted_1").exists()


def test_a_run_cannot_hard_link_files_from_outside_its_workspace(account, skill_root, cache):
    """Hard links reach only within a mount: the system folders, /tmp and the workspace's other alias are other
    mounts, so nothing the worker later reads or removes in the workspace is a file of elsewhere."""
    result = one(account, skill_root, """
        for file in /etc/hostname /usr/bin/bash /etc/passwd /workspace/metadata.json /proc/self/environ; do
            ln "$file" "$WORK_DIR/linked-$(basename "$file")" 2>/dev/null && echo "linked $file"
        done
        ln "$WORKSPACE_DIR/metadata.json" /tmp/linked 2>/dev/null && echo "linked out to /tmp"
        true
    """, cache)
    assert result["exit_code"] == 0 and result["stdout"] == "", result


def test_links_planted_in_out_collect_nothing_of_the_accounts_home(account, skill_root, cache, home_folder):
    secret = home_folder / "secret.txt"
    secret.write_text(f"the account's secret {secrets.token_hex(6)}\n")
    _as_account(account, home_folder)
    result = one(account, skill_root, f"""
        ln -s {secret} "$OUTPUT_DIR/absolute.txt"
        ln -s ../../../../{secret.relative_to('/')} "$OUTPUT_DIR/relative.txt"
        ln -s /workspace/../../../../{secret.relative_to('/')} "$OUTPUT_DIR/alias.txt"
        mkdir "$OUTPUT_DIR/folder" && rmdir "$OUTPUT_DIR/folder" && ln -s {home_folder} "$OUTPUT_DIR/folder"
        echo done
    """, cache, output_files=["out/*.txt", "out/folder/secret.txt", "out/folder/*"])
    contents = "".join(result["files"].values())
    assert result["stdout"] == "done\n", result
    assert "secret" not in contents, result["files"]


def test_a_run_reads_no_environment_of_the_worker(account, skill_root, cache):
    """The worker's environment (its settings, tokens) is in its ``/proc/<pid>/environ``; the run's ``/proc`` has
    none of the worker's processes, and the command's environment is built from scratch."""
    token = secrets.token_hex(8)
    [result] = drive(account, skill_root, [{"command": """
        cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep '^SKILLRUN_TEST_TOKEN='
        cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' '\\n'
        env | grep '^SKILLRUN_TEST_TOKEN='
        true
    """}], cache, env={"SKILLRUN_TEST_TOKEN": token})
    assert result["exit_code"] == 0 and "bash" in result["stdout"], result  # its own command lines are there
    assert token not in result["stdout"], result


LISTENER = r"""
import socket, sys
sockets = []
for family, address in ((socket.AF_UNIX, "\0" + sys.argv[1]), (socket.AF_UNIX, sys.argv[2]),
                        (socket.AF_INET, ("127.0.0.1", 0))):
    s = socket.socket(family)
    s.bind(address)
    s.listen(8)
    s.settimeout(0.2)
    sockets.append(s)
print(sockets[2].getsockname()[1], flush=True)
sys.stdin.readline()
for s in sockets:
    try:
        s.accept()
        print("connected", flush=True)
    except OSError:
        pass
"""
"""Listens, as the account outside any sandbox, on an abstract unix socket, a unix socket in /tmp and a loopback
TCP port (printed); once told, says ``connected`` for each that was reached."""


SYSTEM_PYTHON = "/usr/bin/python3"
"""An interpreter any account may run (the checkout's may be a link into /root); the listener needs no packages."""


@pytest.mark.root
def test_a_run_reaches_none_of_the_accounts_sockets(account, skill_root, cache):
    tag = f"skillrun-test-{secrets.token_hex(4)}"
    path = f"/tmp/{tag}.sock"
    listener = subprocess.Popen([SYSTEM_PYTHON, "-c", LISTENER, tag, path], user=account.uid, group=account.gid,
                                extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(listener.stdout.readline())
        result = one(account, skill_root, f"""python3 -c '
import socket
for family, address in ((socket.AF_UNIX, "\\0{tag}"), (socket.AF_UNIX, "{path}"), (socket.AF_INET, ("127.0.0.1", {port}))):
    s = socket.socket(family)
    s.settimeout(1)
    try:
        s.connect(address)
        print("reached", address)
    except OSError:
        pass
'""", cache)
        said, _ = listener.communicate("go\n", timeout=30)
    finally:
        listener.kill()
        Path(path).unlink(missing_ok=True)
    assert result["exit_code"] == 0 and result["stdout"] == "", result
    assert said == "", said


@pytest.mark.root
def test_a_run_shares_no_memory_or_ipc_with_the_account(account, skill_root, cache):
    """``/dev/shm`` is the run's own, and so is the IPC namespace (System V shared memory, message queues)."""
    tag = secrets.token_hex(6)
    outside = Path(f"/dev/shm/skillrun-outside-{tag}")
    outside.write_text("the account's\n")
    os.chown(outside, account.uid, account.gid)
    made = run_as(account, ["ipcmk", "-M", "4096"])
    if made.returncode != 0:
        unavailable(f"ipcmk could not make a shared memory segment: {made.stderr.strip()}")
    segment = made.stdout.split(":")[-1].strip()
    try:
        result = one(account, skill_root, f"""
            ls -A /dev/shm
            echo run > /dev/shm/skillrun-inside-{tag}
            ipcs -m -i {segment} 2>&1 | grep -q "not found" || echo "segment seen"
            ipcs -m | grep -c '^0x'
            true
        """, cache)
    finally:
        outside.unlink()
        run_as(account, ["ipcrm", "-m", segment])
    assert result["exit_code"] == 0 and result["stdout"] == "0\n", result
    assert not Path(f"/dev/shm/skillrun-inside-{tag}").exists()


TRACE_INIT = """python3 -c '
import ctypes, os, sys, time
if os.fork():
    os._exit(0)
os.setsid()
if os.fork():
    os._exit(0)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, 0)  # no parent-death signal
libc.ptrace(16, 1, 0, 0)  # hold the sandbox init stopped, so it reaps nothing and reports nothing
time.sleep(600)
' {tag} </dev/null >/dev/null 2>&1 &
sleep 0.3; echo started"""


def test_a_run_that_holds_its_sandboxs_init_stopped_ends_with_its_timeout(account, skill_root, cache):
    """A run's process that detaches (double fork, ``setsid``) and stops the sandbox's init with ``ptrace`` (so it
    neither reaps the command nor reports its end) still ends with the run, by its deadline at the latest; nothing
    of it is left running as the account."""
    tag = secrets.token_hex(6)
    started = time.monotonic()
    result = one(account, skill_root, TRACE_INIT.format(tag=tag), cache, timeout=5)
    took = time.monotonic() - started
    time.sleep(0.3)
    left = subprocess.run(["pgrep", "-u", str(account.uid), "-f", tag], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
    assert result.get("stdout", "").startswith("started") and took < 30, (took, result)


def test_a_run_is_held_to_its_memory_limit(account, skill_root, cache):
    result = one(account, skill_root, "python3 -c 'b = bytearray(512 * 1024 * 1024); print(\"ALLOCATED\")'", cache,
                 limits={"memory_bytes": 128 * 1024 * 1024})
    assert result["exit_code"] != 0 and "ALLOCATED" not in result["stdout"] and "MemoryError" in result["stderr"], \
        result


@pytest.mark.xfail(strict=True, reason="HOLE (limitation): a normal account's workspace has no disk cap (disk_bytes "
                   "needs root; ulimit -f caps one file): a run fills the file system of the account's home with "
                   "as many files as it likes")
def test_a_run_cannot_fill_the_accounts_disk(account, skill_root, cache):
    result = one(account, skill_root, """
        for n in 1 2 3; do fallocate -l 1000M "$WORK_DIR/fill-$n" 2>/dev/null || break; done
        du -sm "$WORK_DIR" | cut -f1
    """, cache)
    remove_tree(cache / "skillrun")  # at once: the disk is shared
    assert result["exit_code"] == 0, result
    assert int(result["stdout"]) < 2000, result  # held to one file's size at least


@pytest.mark.root
def test_a_work_root_that_is_a_link_to_another_accounts_folder_is_refused(account, skill_root, shared, cache):
    """``~/.cache/skillrun`` a link to a folder of another account (root's here), or to a sticky shared folder
    another account used first: refused in one line, and nothing is made there."""
    others = shared / "others"
    others.mkdir(mode=0o755)
    sticky = shared / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / ".skillrun").mkdir(mode=0o755)
    cache.mkdir()
    os.chown(cache, account.uid, account.gid)
    said = []
    for target in (others, sticky):
        link = cache / "skillrun"
        link.unlink(missing_ok=True)
        link.symlink_to(target)
        os.lchown(link, account.uid, account.gid)
        done = run_as(account, [*cli(account), "run", "--skills-root", str(skill_root), "probe", "echo ESCAPED"],
                      env={"XDG_CACHE_HOME": str(cache)})
        said.append((done.returncode, "ESCAPED" in done.stdout, "cannot be used" in done.stderr))
    assert said == [(2, False, True), (2, False, True)], said
    assert os.listdir(others) == [] and os.listdir(sticky) == [".skillrun"]
    assert os.listdir(sticky / ".skillrun") == []


NOBODY = Account("nobody", 65534, 65534, Path("/nonexistent"))
"""Another account of the machine."""


@pytest.mark.root
def test_a_work_root_swapped_by_another_account_after_its_check_gets_nothing(account, skill_root, shared):
    drop = shared / "drop"
    drop.mkdir()
    drop.chmod(0o777)  # writable by everyone, not sticky
    root = drop / "skillrun"
    root.mkdir(mode=0o755)
    os.chown(root, account.uid, account.gid)
    secret = f"the account's input {secrets.token_hex(6)}"
    job = job_line(skill_root, options={"work_root": str(root)}, runs=[
        {"command": "true", "workspace_id": "kept"},
        {"pause": True, "command": "echo ran", "workspace_id": "kept",
         "inputs": [{"name": "secret.txt", "content": base64.b64encode(secret.encode()).decode()}]},
    ])
    running = subprocess.Popen(driver(account), env=account.environment(), cwd=REPO, user=account.uid,
                               group=account.gid, extra_groups=[], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        running.stdin.write(job)
        running.stdin.flush()
        assert json.loads(running.stdout.readline()) == {"paused": True}
        swapped = run_as(NOBODY, ["bash", "-ec", """
            cd "$1"; ws=$(ls skillrun | grep '^ws_kept_' || echo ws_kept_1)
            mv skillrun taken
            mkdir -p "skillrun/$ws/work/inputs" "skillrun/$ws/skills/probe" "skillrun/$ws/runs" "skillrun/$ws/out" \
                skillrun/.skillrun/uses
            chmod -R 777 skillrun
        """, "swap", str(drop)], cwd=shared)
        assert swapped.returncode == 0, swapped.stderr
        out, err = running.communicate("go\n", timeout=60)
    finally:
        running.kill()
    taken = [path for path in (drop / "skillrun").rglob("*") if path.is_file() and secret in path.read_text()]
    assert taken == [], (taken, out[-2000:], err[-2000:])
    results = results_of(out)
    assert [result.get("error", "").split(": ")[0] for result in results] == ["WorkspaceError"] * 2, results
    assert f"others may write in {drop}, a folder above it, which is not sticky" in results[0]["error"]
