"""The local runtime as a normal account, as a laptop user first tries it: a work root of its own, one clear line
for a work root it cannot use, and every run sandboxed without root. Each attack a skill could try there is refused
or finds nothing; each check runs as the account (``tests.normal_user``), through the runtime the guide builds
(``resolve_runtime("local")``) or the CLI.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from tests.conftest import IS_ROOT
from tests.normal_user import REPO, Account, cli, local_runs, python, run_as
from tests.services import ensure_installed, free_port, unavailable
from worker.errors import RuntimeUnavailableError
from worker.runtimes.local.runtime import UNSANDBOXED_NOTE
from worker.sandbox import bubblewrap

SKILL_TEXT = "---\nname: probe\ndescription: The probe skill.\n---\nProbe things.\n"


def _one(account: Account, skill_root: Path, command: str, cache: Path, **fields) -> dict:
    [result] = local_runs(account, skill_root, [{"command": command, **fields}], env={"XDG_CACHE_HOME": str(cache)})
    return result


def test_a_normal_account_gets_a_work_root_of_its_own(account, skill_root, cache):
    shown = run_as(account, [python(account), "-c",
                             "from worker.workspaces import default_work_root; print(default_work_root())"])
    assert shown.stdout.strip() == str(account.home / ".cache" / "skillrun")
    before = sorted(os.listdir("/tmp/.skillrun")) if os.path.isdir("/tmp/.skillrun") else None

    result = _one(account, skill_root, "echo hi > out/hi.txt; cat out/hi.txt", cache, output_files=["out/hi.txt"])

    assert (result["exit_code"], result["stdout"], result["files"]) == (0, "hi\n", {"out/hi.txt": "hi\n"})
    registry = cache / "skillrun" / ".skillrun"
    assert registry.is_dir() and registry.stat().st_uid == account.uid
    assert (sorted(os.listdir("/tmp/.skillrun")) if os.path.isdir("/tmp/.skillrun") else None) == before


def _another_accounts(root: Path, account: Account) -> None:
    root.mkdir(mode=0o755)


def _shared_with_another_accounts_registry(root: Path, account: Account) -> None:
    root.mkdir()
    root.chmod(0o1777)
    (root / ".skillrun" / "uses").mkdir(parents=True, mode=0o755)


def _writable_by_others(root: Path, account: Account) -> None:
    root.mkdir()
    os.chown(root, account.uid, account.gid)
    root.chmod(0o777)


def _registry_a_link(root: Path, account: Account) -> None:
    root.mkdir()
    (root / "elsewhere").mkdir()
    (root / ".skillrun").symlink_to(root / "elsewhere")
    for path in (root, root / "elsewhere"):
        os.chown(path, account.uid, account.gid, follow_symlinks=False)
    os.lchown(root / ".skillrun", account.uid, account.gid)


def _noexec(root: Path, account: Account) -> None:
    root.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "noexec,size=16m", "tmpfs", str(root)],
                             capture_output=True, text=True, timeout=30)
    if mounted.returncode != 0:
        unavailable(f"cannot mount a tmpfs for the noexec case: {mounted.stderr.strip()}")
    os.chown(root, account.uid, account.gid)


@pytest.mark.root
@pytest.mark.parametrize(("make", "said"), [
    (_another_accounts, "it belongs to uid 0, not to this account"),
    (_shared_with_another_accounts_registry, ".skillrun belongs to uid 0 (another account used this work root)"),
    (_writable_by_others, "others may write in it (mode 777) and it is not sticky"),
    (_registry_a_link, ".skillrun is not a folder (a link or a file)"),
    (_noexec, "its file system is mounted noexec"),
], ids=["another-accounts", "another-accounts-registry", "writable-by-others", "registry-a-link", "noexec"])
def test_a_work_root_the_account_cannot_use_is_one_line_saying_what_to_do(account, skill_root, shared, make, said):
    root = shared / "root"
    make(root, account)
    try:
        listing = sorted(str(path.relative_to(root)) for path in root.rglob("*"))
        done = run_as(account, [*cli(account), "run", "--skills-root", str(skill_root), "--work-root", str(root),
                                "probe", "echo ran > /tmp/ran"])
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2, done.stderr
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert lines[0].startswith(f"skillrun: error: work root {root} cannot be used: ")
        assert said in lines[0] and "set SKILLRUN_WORK_ROOT to a folder of your own" in lines[0]
        assert sorted(str(path.relative_to(root)) for path in root.rglob("*")) == listing  # nothing made or changed
    finally:
        subprocess.run(["umount", str(root)], capture_output=True, timeout=30)


def test_a_normal_accounts_run_is_sandboxed(account, skill_root, cache):
    marker = Path(f"/tmp/skillrun-host-marker-{secrets.token_hex(4)}")
    marker.write_text("the host's /tmp\n")
    marker.chmod(0o644)
    home_secret = account.home / f"secret-{secrets.token_hex(4)}.txt"
    home_secret.write_text("the account's own file\n")
    os.chown(home_secret, account.uid, account.gid)
    try:
        host_processes = len(os.listdir("/proc"))
        result = _one(account, skill_root, f"""
            echo "processes $(ls -d /proc/[0-9]* | wc -l)"
            ls -A /tmp | grep -c . || true
            cat {marker} 2>/dev/null || echo "no host tmp"
            cat {home_secret} 2>/dev/null || echo "no home"
            grep -c ':' /proc/net/dev
            grep -v -e Inter -e face /proc/net/dev | cut -d: -f1 | tr -d ' '
            touch /usr/planted 2>/dev/null || echo "usr read-only"
            touch /planted 2>/dev/null || echo "root read-only"
            echo written > out/w.txt && echo "workspace writable"
            echo "uid $(id -u) $(whoami)"
        """, cache)
    finally:
        marker.unlink()
        home_secret.unlink()
    lines = result["stdout"].splitlines()
    assert result["exit_code"] == 0, result
    assert int(lines[0].split()[1]) <= 6 < host_processes, lines[0]  # bash, its command substitution, ls, wc
    assert lines[1:] == ["0", "no host tmp", "no home", "1", "lo", "usr read-only", "root read-only",
                         "workspace writable", f"uid {account.uid} skillrun-{account.uid}"]
    assert UNSANDBOXED_NOTE not in result["stderr"]


def test_a_normal_accounts_run_cannot_change_its_library(account, skill_root, cache):
    before = (skill_root / "probe" / "SKILL.md").read_text()
    result = _one(account, skill_root, "chmod u+w SKILL.md scripts/hello.sh 2>/dev/null; echo changed >> SKILL.md; "
                                       "echo changed > scripts/hello.sh; cat SKILL.md | tail -1", cache)
    assert result["stdout"] == "changed\n"  # its own copy, in its workspace
    assert (skill_root / "probe" / "SKILL.md").read_text() == before == SKILL_TEXT
    assert (skill_root / "probe" / "scripts" / "hello.sh").read_text() == "echo hello\n"


ESCAPES = {
    "a user namespace": "unshare -U true",
    "a user namespace mapped to root": "unshare -r id -u",
    "setgroups": "echo deny > /proc/self/setgroups",
    "a mount": "mount -t tmpfs none /mnt",
    "a setuid program": "su -c 'id -u' root </dev/null",
    "setuid(0)": "python3 -c 'import os; os.setuid(0)'",
}


@pytest.mark.parametrize("command", ESCAPES.values(), ids=ESCAPES.keys())
def test_a_normal_accounts_sandbox_refuses(account, skill_root, cache, command):
    result = _one(account, skill_root, f"{command} && echo ESCAPED", cache)
    assert result["exit_code"] != 0 and "ESCAPED" not in result["stdout"], result


def test_a_normal_accounts_run_cannot_reach_the_accounts_other_processes(account, skill_root, cache):
    """A process of the same account outside the sandbox (its editor, its agent, the worker): not in the run's
    ``/proc``, and not signalled by its number."""
    switch = {"user": account.uid, "group": account.gid, "extra_groups": []} if IS_ROOT else {}
    other = subprocess.Popen(["sleep", "120"], **switch)
    try:
        result = _one(account, skill_root, f"test -e /proc/{other.pid} && echo SEEN; kill -STOP {other.pid} "
                                           f"2>/dev/null && echo SIGNALLED; true", cache)
        assert other.poll() is None
        state = Path(f"/proc/{other.pid}/stat").read_text().split(") ")[1].split()[0]
    finally:
        other.kill()
        other.wait()
    assert (result["exit_code"], result["stdout"], state) == (0, "", "S"), result


def test_the_accounts_agent_and_session_bus_are_not_there(account, skill_root, cache):
    """An SSH agent's socket and the D-Bus session bus: neither their variables nor their sockets reach a run."""
    runtime_dir = Path(f"/run/user/{account.uid}") if IS_ROOT else Path(os.environ.get("XDG_RUNTIME_DIR", "/nowhere"))
    made = IS_ROOT and not runtime_dir.exists()
    if IS_ROOT:
        runtime_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chown(runtime_dir, account.uid, account.gid)
    agent = account.home / f".ssh-agent-{secrets.token_hex(4)}.sock"
    listeners = []
    try:
        for path in (agent, runtime_dir / "bus"):
            if not path.parent.is_dir():
                continue
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(str(path))
            os.chown(path, account.uid, account.gid)
            listeners.append(listener)
        [result] = local_runs(account, skill_root, [{"command": f"""
            echo "agent ${{SSH_AUTH_SOCK:-unset}} bus ${{DBUS_SESSION_BUS_ADDRESS:-unset}}"
            test -e {agent} && echo "agent socket there"
            test -e {runtime_dir}/bus && echo "bus socket there"
            ls /run/user 2>/dev/null && echo "runtime folders there"
            true
        """}], env={"XDG_CACHE_HOME": str(cache), "SSH_AUTH_SOCK": str(agent),
                    "DBUS_SESSION_BUS_ADDRESS": f"unix:path={runtime_dir}/bus", "XDG_RUNTIME_DIR": str(runtime_dir)})
    finally:
        for listener in listeners:
            listener.close()
        agent.unlink(missing_ok=True)
        if made:
            shutil.rmtree(runtime_dir, ignore_errors=True)
    assert result["stdout"] == "agent unset bus unset\n", result


FORKS = """python3 -c '
import os, time
forked = 0
while forked < 40:
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    forked += 1
print(forked)
'"""
"""Forks children that wait until the limit stops it (or 40 of them), and says how many it made."""


def test_a_normal_accounts_run_is_held_to_its_process_limit_alone(account, skill_root, cache):
    """The sandbox's user namespace counts its own processes: the limit stops the run's fork loop, and the account's
    processes elsewhere neither count against it nor are stopped by it."""
    result = _one(account, skill_root, FORKS, cache, limits={"processes": 16})
    forked = int(result["stdout"])
    assert 8 <= forked < 16, result  # up to the limit, less the sandbox's init, the shell and python
    others = run_as(account, ["bash", "-c", "for i in $(seq 30); do sleep 0.5 & done; wait; echo fine"])
    assert others.stdout == "fine\n"


def test_what_a_normal_accounts_run_leaves_running_ends_with_it(account, skill_root, cache):
    tag = secrets.token_hex(6)
    result = _one(account, skill_root, f"setsid sleep 600 {tag} </dev/null >/dev/null 2>&1 & "
                                       f"nohup sleep 600 {tag} </dev/null >/dev/null 2>&1 & echo started", cache)
    assert result["stdout"] == "started\n"
    left = subprocess.run(["pgrep", "-u", str(account.uid), "-f", tag], capture_output=True, text=True)
    assert left.stdout == "", left.stdout


def test_a_normal_account_runs_unsandboxed_only_when_it_says_so(account, skill_root, cache):
    said = local_runs(account, skill_root, [{"command": "echo ran"}], options={"sandbox": False},
                      env={"XDG_CACHE_HOME": str(cache)})
    set_ = local_runs(account, skill_root, [{"command": "echo ran"}],
                      env={"XDG_CACHE_HOME": str(cache), "SKILLRUN_LOCAL_SANDBOX": "false"})
    for [result] in (said, set_):
        assert result["stdout"] == "ran\n" and f"[skillrun: {UNSANDBOXED_NOTE}]" in result["stderr"], result


NO_USER_NAMESPACES = """
import ctypes, os, sys
ready, mapped = os.pipe(), os.pipe()
child = os.fork()
if child == 0:  # a user namespace of its own, every id mapped to itself (by its parent, root), then no more of them
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
        sys.exit(f"unshare: {os.strerror(ctypes.get_errno())}")
    os.write(ready[1], b"1")
    os.read(mapped[0], 1)
    with open("/proc/sys/user/max_user_namespaces", "w") as limit:
        limit.write("0")
    os.execvp(sys.argv[1], sys.argv[1:])
os.read(ready[0], 1)
for name in ("uid_map", "gid_map"):
    with open(f"/proc/{child}/{name}", "w") as ids:
        ids.write("0 0 4294967295")
os.write(mapped[1], b"1")
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""
"""Runs its arguments in a user namespace that may make no user namespace (``user.max_user_namespaces`` 0 there),
as a distribution that forbids them or a container without them holds its users."""


@pytest.mark.root
def test_without_user_namespaces_a_normal_accounts_run_is_refused_naming_the_settings(account, skill_root, cache):
    """A user namespace whose user-namespace limit is 0 (as a distribution that restricts them, or a container
    without them) holds the account: a sandboxed run is refused, saying what to change; never run without it."""
    limited = (sys.executable, "-c", NO_USER_NAMESPACES)
    refused = local_runs(account, skill_root, [{"command": "echo ESCAPED"}], env={"XDG_CACHE_HOME": str(cache)},
                         prefix=limited)
    unsandboxed = local_runs(account, skill_root, [{"command": "echo ran"}], prefix=limited,
                             env={"XDG_CACHE_HOME": str(cache), "SKILLRUN_LOCAL_SANDBOX": "false"})
    [error] = refused
    assert "ESCAPED" not in str(error) and error.get("error", "").startswith("RuntimeUnavailableError: bubblewrap "
                                                                            "cannot make its namespaces here"), error
    assert "user.max_user_namespaces" in error["error"] and "SKILLRUN_LOCAL_SANDBOX=false" in error["error"]
    [ran] = unsandboxed
    assert ran["stdout"] == "ran\n" and UNSANDBOXED_NOTE in ran["stderr"], ran


def test_without_bubblewrap_a_sandboxed_run_is_refused_saying_what_to_install(monkeypatch):
    bubblewrap.find_bwrap.cache_clear()
    monkeypatch.setattr(bubblewrap.shutil, "which", lambda *args, **kwargs: None)
    try:
        with pytest.raises(RuntimeUnavailableError) as refused:
            bubblewrap.find_bwrap()
    finally:
        bubblewrap.find_bwrap.cache_clear()
    assert "apt-get install bubblewrap" in str(refused.value)
    assert "SKILLRUN_LOCAL_SANDBOX=false" in str(refused.value)


def test_the_readmes_first_command_works_for_a_normal_account(account, cache):
    """The demo of the README's quick start, as the account, in this checkout's example library."""
    done = run_as(account, [*cli(account), "run", "--skills-root", str(REPO / "skills"), "python-math",
                            "python3 scripts/fib.py 10 | tee out/fib.txt", "-o", "out/fib.txt"],
                  env={"XDG_CACHE_HOME": str(cache)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == "34" and "out/fib.txt" in done.stderr
    assert "Traceback" not in done.stderr and UNSANDBOXED_NOTE not in done.stderr
    assert stat.S_IMODE((cache / "skillrun").stat().st_mode) & 0o022 == 0


SANDBOX_CHECK = ("echo \"processes $(ls -d /proc/[0-9]* | wc -l)\"; ls -A /tmp | grep -c . || true; "
                 "ls -A \"$HOME_OUTSIDE\" | grep -c -v '^.cache-test-' || true; id -un")
"""What each way in runs: its processes, its /tmp, the account's home (named by the caller: only the folder the
work root is in shows there, empty but for the way to the workspace), its user."""


def _sandboxed(stdout: str, account: Account) -> None:
    lines = stdout.splitlines()
    assert int(lines[0].split()[1]) <= 6 and lines[1:] == ["0", "0", f"skillrun-{account.uid}"], stdout


async def test_skillrun_mcp_as_a_normal_account_runs_sandboxed(account, skill_root, cache):
    """``skillrun mcp`` over stdio, started as the account, driven by the ``mcp`` SDK's client."""
    argv = [*cli(account), "mcp", "--skills-root", str(skill_root)]
    command, args = (argv[0], argv[1:]) if not IS_ROOT else (
        "setpriv", [f"--reuid={account.uid}", f"--regid={account.gid}", "--clear-groups", *argv])
    params = StdioServerParameters(command=command, args=args, cwd=str(REPO),
                                   env=account.environment({"XDG_CACHE_HOME": str(cache),
                                                            "SKILLRUN_DATA_DIR": str(cache / "data")}))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        result = await session.call_tool("skill_run", {"skill": "probe", "command": SANDBOX_CHECK,
                                                       "env": {"HOME_OUTSIDE": str(account.home)}})
    assert not result.isError, result.content[0].text
    _sandboxed(json.loads(result.content[0].text)["stdout"], account)
    assert (cache / "skillrun" / ".skillrun").is_dir()  # its own default work root


async def test_skillrun_serve_as_a_normal_account_runs_sandboxed(account, skill_root, cache):
    """``skillrun serve`` on the embedded default, started as the account: a team of its own, a run through the
    HTTP API."""
    env = {"XDG_CACHE_HOME": str(cache), "SKILLRUN_DATA_DIR": str(cache / "data"), "SKILLS_ROOT": str(skill_root)}
    for step in (["teams", "create", "laptop"], ["keys", "create", "--json", "laptop"]):
        made = run_as(account, [*cli(account), *step], env=env, cwd=REPO)
        assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["key"]
    port = free_port()
    argv = [*cli(account), "serve", "--port", str(port)]
    switch = {"user": account.uid, "group": account.gid, "extra_groups": []} if IS_ROOT else {}
    server = subprocess.Popen(argv, env=account.environment(env), cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, **switch)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                     headers={"Authorization": f"Bearer {key}"}) as client:
            for _ in range(300):
                if server.poll() is not None:
                    raise AssertionError(f"skillrun serve ended: {server.stderr.read().decode()[-2000:]}")
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.1)
            submitted = await client.post("/v1/runs", json={"skill": "probe", "command": SANDBOX_CHECK,
                                                            "env": {"HOME_OUTSIDE": str(account.home)}})
            assert submitted.status_code in (200, 201, 202), submitted.text
            record = (await client.get(f"/v1/runs/{submitted.json()['id']}", params={"wait": 60})).json()
    finally:
        server.kill()
        server.wait()
    assert record["status"] == "finished", record
    _sandboxed(record["result"]["stdout"], account)


async def test_a_normal_accounts_run_may_reserve_more_than_its_memory_and_start_chromium(account, skill_root, cache):
    """Without control groups each process's memory is its data limit, which counts what it writes and not what it
    reserves: V8 and Chromium reserve tens of GiB at start, and an address-space limit stopped them."""
    chromium = ensure_installed("chromium", "chromium")
    reserve, browser = local_runs(account, skill_root, [
        {"command": "python3 -c 'import mmap; mmap.mmap(-1, 64 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, "
                    "prot=0); print(\"reserved\")'", "limits": {"memory_bytes": 300 * 1024 * 1024}},
        {"command": f"{chromium} --headless --no-sandbox --dump-dom 'data:text/html,<p>drawn</p>' 2>/dev/null",
         "timeout": 120},
    ], env={"XDG_CACHE_HOME": str(cache)})
    assert (reserve["exit_code"], reserve["stdout"]) == (0, "reserved\n"), reserve
    assert browser["exit_code"] == 0 and "<p>drawn</p>" in browser["stdout"], browser
