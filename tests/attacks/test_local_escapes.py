"""More escapes tried against the local runtime as root, by a skill command that wants out of its run.

Each attack runs for real (bubblewrap sandboxes, control groups, per-workspace users, spawners and ready shells)
and is asserted contained. Where it could be arranged, each assertion was seen to fail against an undefended
target: the same code in an unsandboxed process of an unprivileged user (the kernel-facing attacks), a larger
limit (the memory ones), a leaked pipe, the code before the fix (the discarded ready shell). Attacks that get
through are written as the safe behaviour and marked ``xfail(strict=True)`` with what gets through, so fixing the
hole turns them into failures to be unmarked. ``tests/attacks/test_local_attacks.py`` holds the first round;
nothing here repeats it.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import write_skill
from tests.host_network import host_address
from tests.processes import running_with, sleeper, wait_gone
from tests.services import ensure_installed, unavailable
from worker.sandbox import user_network
from worker.sandbox import command_watch as watch
from worker.contract import RunLimits, SkillRef
from worker.errors import InvalidRunRequestError, RuntimeUnavailableError, SandboxError
from worker.sandbox.ready_shell import READY_SHELL_LOADER
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.workspaces.manager import WorkspaceManager

pytestmark = pytest.mark.root


SESSION = uuid.uuid4().hex[:8]


def ws(name: str) -> str:
    """A workspace id of this session: its user id is derived from it, and a timeout anywhere on the host kills
    every process of a workspace's user (see the uid test below), so ids shared with other suites running at the
    same time would let their runs kill these."""
    return f"{name}-{SESSION}"


def _py(code: str) -> str:
    """A shell command running ``code`` with the sandbox's system Python."""
    return f"python3 -c {shlex.quote(textwrap.dedent(code))}"


async def _wait_for(path: Path, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if path.exists():
            return True
        await asyncio.sleep(0.02)
    return False


async def _appears(argument: str, seconds: float) -> bool:
    """Whether a process with ``argument`` on its command line shows up within ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if running_with(argument):
            return True
        await asyncio.sleep(0.02)
    return False


# --- Holes: the safe behaviour, marked xfail(strict=True) until fixed -------------------------------------------


async def _discard_a_ready_shell_holding(runtime: LocalWorkspaceRuntime, make_request, command: str) -> None:
    """Have the workspace's ready shell start with ``__skillrun_command`` in its environment, then be discarded: the
    next run has another environment. A request may not name it (refused, below); the attack sets it in the
    runtime's environment builder, as a variable that reached the shell's environment some other way would."""
    build = runtime.command_environment

    def planting(run_dir, request, variables):  # noqa: ANN001, ANN202 - the runtime's own signature
        env = build(run_dir, request, variables)
        return {**env, "__skillrun_command": command} if request.command == "echo first" else env

    runtime.command_environment = planting
    first = await runtime.run(make_request("echo first", workspace_id=ws("rs")))
    assert first.stdout == "first\n"
    await runtime.idle()  # the ready shell for the next run waits, with the first run's environment
    assert runtime._spawners[ws("rs")].waiting_shell is not None
    second = await runtime.run(make_request("echo second", workspace_id=ws("rs")))  # another env: it is discarded
    assert second.stdout == "second\n" and second.exit_code == 0
    await runtime.idle()


async def test_a_request_cannot_name_the_ready_shells_own_variable(runtime, make_request):
    with pytest.raises(InvalidRunRequestError, match="env"):
        await runtime.run(make_request("true", env={"__skillrun_command": "id"}))


async def test_a_discarded_ready_shell_runs_nothing_the_run_before_left_in_its_environment(work_root, make_request):
    # A discarded shell reads an empty script, so its loader evals whatever $__skillrun_command its environment
    # (the run before's) holds. In a sandbox, the discarded shell is killed first, with everything in it.
    sleep, marker = sleeper()
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await _discard_a_ready_shell_holding(runtime, make_request, sleep)
        assert not await _appears(marker, 2.0), "code of a finished run is running, outside any limit"


async def test_without_the_sandbox_a_discarded_ready_shell_runs_nothing_the_run_before_left(work_root, make_request):
    sleep, marker = sleeper()
    async with LocalWorkspaceRuntime(work_root, spawners="eager", sandbox=False) as runtime:
        await _discard_a_ready_shell_holding(runtime, make_request, sleep)
        assert not await _appears(marker, 2.0), "code of a finished run is running, outside any limit"


async def test_flooding_the_output_past_its_cap_is_slowed_not_drained_at_full_speed(work_root, make_request):
    # Output past the cap costs the worker whatever draining it costs: past a free allowance the pipes are drained
    # once per pause, so what a flood gets through in its 2 s is bounded (unthrottled, /dev/zero gives gigabytes,
    # read by the worker at the cost of a core). At most one pipe's worth (1 MiB, F_SETPIPE_SZ) per pause.
    async with LocalWorkspaceRuntime(work_root) as runtime:
        result = await runtime.run(make_request("cat /dev/zero & cat /dev/zero >&2", timeout=2))
    assert result.timed_out and result.stdout_truncated and result.stderr_truncated
    pauses = 2 / watch.DROP_PAUSE_SECONDS + 50  # the run's timeout in pauses, and the kill's grace
    bound = watch.FREE_DROP_BYTES + pauses * watch.READS_PER_TURN * 64 * 1024
    for text in (result.stdout, result.stderr):
        dropped = int(re.search(r"(\d+) more bytes were not kept", text).group(1))
        assert dropped < bound, f"{dropped} bytes were drained past the cap in 2 s"


async def test_a_run_cannot_store_more_than_the_tmpfs_cap_in_the_sandbox_root_or_dev(work_root, make_request):
    cap = 4 * 1024 * 1024
    async with LocalWorkspaceRuntime(work_root, tmpfs_bytes=cap) as runtime:
        result = await runtime.run(make_request(
            "head -c 8M /dev/zero > /tmp/big; echo tmp=$?; "
            "head -c 8M /dev/zero > /stash && echo root-written $(stat -c %s /stash); "
            "head -c 8M /dev/zero > /dev/stash && echo dev-written $(stat -c %s /dev/stash)"))
    assert "tmp=1" in result.stdout  # the documented cap holds for /tmp
    assert "root-written" not in result.stdout, result.stdout
    assert "dev-written" not in result.stdout, result.stdout


# --- Contained ---------------------------------------------------------------------------------------------------

I386_UNSHARE = """
    import ctypes, mmap, os
    before = os.readlink("/proc/self/ns/user")
    # push rbx; mov eax, 310 (i386 unshare); mov ebx, CLONE_NEWUSER; int 0x80; pop rbx; ret
    code = bytes.fromhex("53" "b836010000" "bb00000010" "cd80" "5b" "c3")
    page = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    page.write(code)
    call = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(page)))
    returned = call()
    print("returned", returned, "new-userns", os.readlink("/proc/self/ns/user") != before, flush=True)
"""


async def test_a_32_bit_system_call_cannot_make_a_user_namespace(runtime, make_request):
    # Without the filter, an unprivileged 64-bit process makes a user namespace through the i386 entry point
    # (int 0x80), which a filter written for x86_64 numbers alone would not see.
    result = await runtime.run(make_request(_py(I386_UNSHARE) + "; echo status=$?"))
    assert "new-userns True" not in result.stdout
    assert "status=159" in result.stdout, result.stdout + result.stderr  # killed by SIGSYS: a foreign architecture


INJECT_INTO_INIT = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.restype = ctypes.c_long
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    Regs = ctypes.c_ulonglong * 27  # struct user_regs_struct (x86_64)
    RAX, RDI, ORIG_RAX, RIP = 10, 14, 15, 16
    def ptrace(request, addr=None, data=None):
        ctypes.set_errno(0)
        done = libc.ptrace(request, 1, addr, data)
        if done == -1 and ctypes.get_errno():
            raise OSError(ctypes.get_errno(), f"ptrace {request}")
        return done
    try:
        before = os.readlink("/proc/1/ns/user")
        ptrace(16)  # PTRACE_ATTACH to the sandbox's init (bwrap), which waits in wait4
    except PermissionError:  # a held sandbox's pid 1, its spawner, is non-dumpable
        print("init-untraceable", flush=True)
        raise SystemExit
    os.waitpid(1, 0x40000000)
    saved = Regs()
    ptrace(12, data=ctypes.addressof(saved))
    assert ptrace(1, addr=saved[RIP] - 2) & 0xFFFF == 0x050F, "not stopped after a syscall instruction"
    regs = Regs(*saved)
    regs[RAX], regs[RDI], regs[ORIG_RAX], regs[RIP] = 272, 0x10000000, 2**64 - 1, saved[RIP] - 2
    ptrace(13, data=ctypes.addressof(regs))  # unshare(CLONE_NEWUSER), made by init itself
    ptrace(9)  # PTRACE_SINGLESTEP
    os.waitpid(1, 0x40000000)
    after = Regs()
    ptrace(12, data=ctypes.addressof(after))
    made = os.readlink("/proc/1/ns/user") != before
    ptrace(13, data=ctypes.addressof(saved))
    ptrace(17)  # PTRACE_DETACH
    print("init-unshare", ctypes.c_longlong(after[RAX]).value, "new-userns", made, flush=True)
"""


async def test_tracing_the_sandbox_init_does_not_get_past_the_seccomp_filter(runtime, make_request):
    # The run may trace its own init (same user, same namespaces); if that init were not under the filter, code
    # injected into it would make user namespaces (and reach io_uring, bpf, ...). The injection itself works: on an
    # unfiltered process the same code makes a user namespace.
    result = await runtime.run(make_request(_py(INJECT_INTO_INIT)))
    contained = ("init-unshare -1 new-userns False\n", "init-untraceable\n")  # -EPERM, or no trace at all
    assert result.stdout in contained, result.stdout + result.stderr


REFUSED_CALLS = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def call(name, number, *args):
        ctypes.set_errno(0)
        done = libc.syscall(ctypes.c_long(number), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
        print(name, "allowed" if done >= 0 else os.strerror(ctypes.get_errno()))
    call("add_key", 248, b"user", b"skillrun", b"x", 1, -3)  # into the session keyring
    attr = (ctypes.c_char * 128)()
    ctypes.memmove(attr, (ctypes.c_uint32 * 2)(1, 128), 8)  # PERF_TYPE_SOFTWARE, size
    ctypes.memmove(ctypes.addressof(attr) + 40, (ctypes.c_uint64 * 1)(1 << 5 | 1 << 6), 8)  # user space only
    call("perf_event_open", 298, attr, 0, -1, -1, 0)
    call("io_uring_setup", 425, 4, (ctypes.c_char * 120)())
    call("userfaultfd", 323, 1)  # UFFD_USER_MODE_ONLY
    handle = (ctypes.c_char * 256)(*([b"\\x80"] + [b"\\0"] * 255))
    call("name_to_handle_at", 303, -100, b"/", handle, (ctypes.c_int * 1)(), 0)
"""


async def test_kernel_interfaces_an_unprivileged_user_may_use_are_refused_in_a_run(runtime, make_request):
    # Each of these succeeds for an unprivileged user outside the sandbox on this kind of host (checked with
    # setpriv --reuid=65534): the filter, not the lack of privilege, refuses them.
    result = await runtime.run(make_request(_py(REFUSED_CALLS)))
    lines = result.stdout.splitlines()
    refused = ("add_key", "perf_event_open", "io_uring_setup", "userfaultfd", "name_to_handle_at")
    assert lines == [f"{name} Operation not permitted" for name in refused], result.stderr


async def test_a_run_without_network_cannot_reach_an_abstract_unix_socket_of_the_host(runtime, make_request):
    name = f"skillrun-host-{uuid.uuid4().hex}"
    server = socket.socket(socket.AF_UNIX)
    server.bind("\0" + name)
    server.listen()
    try:
        result = await runtime.run(make_request(
            f"grep -c {name} /proc/net/unix; " + _abstract_connect(name, "connected")))
    finally:
        server.close()
    assert result.stdout.splitlines() == ["0", "refused 111"], result.stdout + result.stderr


def _abstract_connect(name: str, success: str) -> str:
    """A command that connects to the abstract unix socket ``name``: prints ``success``, or ``refused <errno>``."""
    return _py(f"""
        import socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect("\\0{name}")
            print("{success}")
        except OSError as exc:
            print("refused", exc.errno)
    """)


async def test_concurrent_runs_of_two_workspaces_share_no_abstract_socket_and_no_loopback(runtime, make_request):
    name = f"skillrun-tenant-{uuid.uuid4().hex}"
    with socket.socket() as probe:  # a port free here; the runs have loopbacks of their own anyway
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    listener = _py(f"""
        import os, socket, time
        u = socket.socket(socket.AF_UNIX); u.bind("\\0{name}"); u.listen()
        t = socket.socket(); t.bind(("127.0.0.1", {port})); t.listen()
        open(os.environ["WORK_DIR"] + "/listening", "w").close()
        time.sleep(20)
    """)
    victim = asyncio.create_task(runtime.run(make_request(listener, workspace_id=ws("victim"), timeout=30)))
    try:
        for _ in range(500):
            found = runtime.workspaces.find(ws("victim"))
            if found is not None and (found.work_dir / "listening").exists():
                break
            await asyncio.sleep(0.02)
        assert (runtime.workspaces.find(ws("victim")).work_dir / "listening").exists(), "the victim did not listen"
        spy = await runtime.run(make_request(
            f"grep -c {name} /proc/net/unix; (echo hi > /dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo tcp-connected; "
            + _abstract_connect(name, "abstract-connected"), workspace_id=ws("spy")))
    finally:
        victim.cancel()
        await asyncio.gather(victim, return_exceptions=True)
    assert spy.stdout.splitlines() == ["0", "refused 111"], spy.stdout + spy.stderr


async def test_system_v_ipc_is_neither_shared_with_another_tenant_nor_left_for_the_next_run(work_root, make_request):
    ids = "ipcs -m -q -s | awk '$1 ~ /^0x/ {print $2}' | sort | tr '\\n' ' '; echo"
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id=ws("ipc")))  # the next run of "ipc" is a ready shell's
        holder = asyncio.create_task(runtime.run(make_request(
            "ipcmk -M 65536 && ipcmk -Q && ipcmk -S 2 && " + ids.replace("; echo", " > $WORK_DIR/made.tmp") +
            " && mv $WORK_DIR/made.tmp $WORK_DIR/made; sleep 20", workspace_id=ws("ipc"), timeout=30)))
        try:
            made = runtime.workspaces.find(ws("ipc")).work_dir / "made"
            assert await _wait_for(made), "the holder did not make its objects"
            made_ids = made.read_text().split()
            assert len(made_ids) == 3
            other = await runtime.run(make_request(ids, workspace_id=ws("other")))
        finally:
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
        await runtime.idle()
        again = await runtime.run(make_request(f"{ids}; echo \"$BASH_EXECUTION_STRING\"", workspace_id=ws("ipc")))
    assert other.stdout.split() == [], other.stdout
    lines = again.stdout.splitlines()
    assert lines[0].split() == [], again.stdout
    assert lines[-1] == READY_SHELL_LOADER  # the next run was the one started ahead, after the holder


async def test_a_run_holds_no_capability_and_a_setuid_root_program_gives_it_none(shared_dir, make_request, runtime):
    folder = write_skill(shared_dir / "suid-library", "suid")
    subprocess.run(["install", "-o", "0", "-g", "0", "-m", "4755", "/usr/bin/id", str(folder / "id")], check=True)
    assert os.stat(folder / "id").st_mode & 0o4000
    result = await runtime.run(make_request(
        "./id; grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs):' /proc/self/status; "
        "unshare --mount --fork true && echo mount-namespace-made; "
        "mount -t tmpfs none $RUN_DIR && echo mounted",
        skill=SkillRef(name="suid", root=str(folder.parent), path="suid")))
    first = result.stdout.splitlines()[0]
    assert first.startswith("uid=") and "euid=0" not in first and not first.startswith("uid=0("), first
    status = dict(line.split(":\t") for line in result.stdout.splitlines()[1:] if ":\t" in line)
    assert status == {"CapInh": "0" * 16, "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapBnd": "0" * 16,
                      "CapAmb": "0" * 16, "NoNewPrivs": "1"}, result.stdout
    assert "mount-namespace-made" not in result.stdout and "mounted" not in result.stdout


async def test_files_in_the_private_tmpfs_count_against_the_runs_memory_limit(work_root, make_request):
    # 60 MiB in /tmp and 60 MiB in /dev/shm fit their 64 MiB caps, but not together in a 96 MiB run.
    async with LocalWorkspaceRuntime(work_root) as runtime:
        result = await runtime.run(make_request(
            "head -c 60M /dev/zero > /tmp/a && echo tmp-held; head -c 60M /dev/zero > /dev/shm/b && echo shm-held; "
            "sleep 0.1", limits=RunLimits(memory_bytes=96 * 1024 * 1024)))
    assert not ("tmp-held" in result.stdout and "shm-held" in result.stdout), result.stdout
    assert result.oom_killed, result.stderr


SOCKET_HOARD = """
    import socket
    kept, held = [], 0
    for _ in range(64):  # 4 MiB each: 256 MiB of kernel memory, queued on socket pairs nobody reads
        a, b = socket.socketpair()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        a.setblocking(False)
        sent = 0
        try:
            while sent < 4 << 20:
                sent += a.send(bytes(65536))
        except BlockingIOError:
            pass
        held += sent
        kept.append((a, b))
    print("held", held >> 20, "MiB", flush=True)
"""


async def test_socket_buffers_count_against_the_runs_memory_limit(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root) as runtime:
        result = await runtime.run(make_request(_py(SOCKET_HOARD), limits=RunLimits(memory_bytes=64 * 1024 * 1024)))
    held = [int(line.split()[1]) for line in result.stdout.splitlines() if line.startswith("held")]
    assert not held or held[0] < 64, result.stdout
    assert result.oom_killed, result.stdout + result.stderr


FORK_AND_HOLD = """
    import os, time
    n = 0
    for _ in range(200):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
    print("forked", n, flush=True)
"""


async def test_a_run_in_a_ready_shell_is_held_to_its_own_limits_not_those_of_the_run_before(work_root, make_request):
    hog = _py("import time; b = bytearray(120 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(2)")
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id=ws("warm")))  # default limits: 512 processes, 4 GiB
        await runtime.idle()
        pids = await runtime.run(make_request(
            'echo "$BASH_EXECUTION_STRING"; ulimit -u; ' + _py(FORK_AND_HOLD), workspace_id=ws("warm"),
            limits=RunLimits(processes=40)))
        await runtime.idle()
        memory = await runtime.run(make_request(
            f'echo "$BASH_EXECUTION_STRING"; {hog} & {hog} & {hog} & wait', workspace_id=ws("warm"),
            limits=RunLimits(memory_bytes=256 * 1024 * 1024)))
    loader, ulimit, forked = pids.stdout.splitlines()
    assert loader == READY_SHELL_LOADER  # the ready shell took the run
    assert ulimit == "40"
    assert 0 < int(forked.split()[1]) < 40, forked
    assert memory.stdout.splitlines()[0] == READY_SHELL_LOADER
    assert memory.oom_killed, memory.stderr


async def test_a_run_cannot_rename_or_replace_what_the_host_relies_on_in_its_workspace(runtime, make_request, library):
    attempts = [
        "mv skills skills.old", "mv skills/demo skills/demo.old", "ln -sfn / skills/demo/work",
        "rm -f skills/demo/SKILL.md", "touch skills/.staging-demo-1", "touch runs/planted", "mkdir runs/.next",
        "ln -s / runs/.next", "mv out out.old", "mv work work.old", "mv metadata.json metadata.old",
        "echo {} > metadata.json", "touch .metadata.json.1.tmp", "ln -s /etc/shadow planted", "mkfifo fifo",
    ]
    script = "cd $WORKSPACE_DIR; " + "; ".join(f"{{ {a}; }} 2>/dev/null && echo {shlex.quote('DID ' + a)}"
                                                for a in attempts)
    result = await runtime.run(make_request(script, workspace_id=ws("layout")))
    assert "DID" not in result.stdout, result.stdout
    workspace = runtime.workspaces.find(ws("layout"))
    assert sorted(p.name for p in workspace.path.iterdir()) == ["metadata.json", "out", "runs", "skills", "work"]
    assert workspace.read_metadata()["workspace_id"] == ws("layout")
    staged = workspace.skills_dir / "demo"
    assert os.readlink(staged / "work") == "../../work" and (staged / "SKILL.md").is_file()
    assert not (workspace.runs_dir / "planted").exists() and not (workspace.runs_dir / ".next").is_symlink()
    after = await runtime.run(make_request("cat SKILL.md | head -2", workspace_id=ws("layout")))
    assert after.stdout == "---\nname: demo\n"


async def test_a_run_cannot_raise_its_limits_or_reach_its_control_group(runtime, make_request):
    result = await runtime.run(make_request(
        "ulimit -n 100000 2>/dev/null && echo raised-files; ulimit -u 100000 2>/dev/null && echo raised-procs; "
        "ls /sys/fs/cgroup 2>/dev/null && echo cgroups-visible; "
        "mount -t cgroup -o pids none $RUN_DIR 2>/dev/null && echo cgroup-mounted; echo end",
        limits=RunLimits(open_files=256, processes=64)))
    assert result.stdout.splitlines() == ["end"], result.stdout


async def test_a_run_learns_nothing_of_the_worker_from_its_control_group_path(runtime, make_request):
    # Where bwrap makes the run's cgroup namespace before the run is moved into its group (a sandbox not started
    # by a launcher, a held sandbox), the run sees its group's path below the worker's: the name must say nothing
    # of the worker (its pid) or of other tenants (a counter). A launched sandbox sees its own group as the root.
    if runtime.groups.missing is not None:
        unavailable(f"no run groups on this host: {runtime.groups.missing}; run as root on a host with cgroups")
    seen = ""
    for name in ("cg-a", "cg-b", "cg-a", "cg-a"):
        result = await runtime.run(make_request("grep -E ':(memory|pids|cpu)[,:]' /proc/self/cgroup", workspace_id=ws(name)))
        await runtime.idle()
        lines = result.stdout.splitlines()
        assert len(lines) == 3 and all(
            line.endswith(":/") or re.search(r":(/\.\.)?/skillrun/[0-9a-f]{16}/run-[0-9a-f]{16}$|:/\.\./run-[0-9a-f]{16}$",
                                             line) for line in lines), lines
        seen += result.stdout
    assert str(os.getpid()) not in seen


PIPES_SURVEY = """
    import os
    own = sorted({os.readlink("/proc/self/fd/1"), os.readlink("/proc/self/fd/2")})
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                found.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:
            pass
    print(" ".join(own))
    print(" ".join(sorted(t for t in found if t.startswith("pipe:"))))
"""
"""Prints the run's own stdout and stderr pipes, then every pipe open in any process it can see."""


async def test_no_descriptor_of_the_host_is_open_in_any_process_of_a_run(work_root, make_request):
    # bwrap's report, block and seccomp pipes, and a ready shell's script and start pipes, stay out of the run: of
    # every process in the sandbox (its init included) the only pipes open are the run's own stdout and stderr.
    survey = _py(PIPES_SURVEY) + '; echo "$BASH_EXECUTION_STRING" | head -1'

    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        cold = await runtime.run(make_request(survey, workspace_id=ws("fd-cold")))
        await runtime.run(make_request("true", workspace_id=ws("fd-warm")))
        await runtime.idle()
        warm = await runtime.run(make_request(survey, workspace_id=ws("fd-warm")))
    for result in (cold, warm):
        own, found, _ = result.stdout.splitlines()
        assert len(own.split()) == 2 and found.split() == own.split(), result.stdout
    assert warm.stdout.splitlines()[2] == READY_SHELL_LOADER


async def test_a_run_cannot_signal_a_concurrent_run_of_another_workspace(runtime, make_request):
    victim = asyncio.create_task(runtime.run(make_request(
        "touch $WORK_DIR/started; sleep 1.5; echo survived", workspace_id=ws("victim"), timeout=30)))
    for _ in range(500):
        found = runtime.workspaces.find(ws("victim"))
        if found is not None and (found.work_dir / "started").exists():
            break
        await asyncio.sleep(0.02)
    # kill(-1) reaches every process the caller may signal but itself and its init: with a PID namespace of its
    # own (and another user besides) that is nothing of the victim's.
    spy = await runtime.run(make_request("sleep 5 & kill -STOP -1; kill -KILL -1; echo sent", workspace_id=ws("spy")))
    result = await victim
    assert result.stdout == "survived\n" and result.exit_code == 0
    assert spy.stdout == "sent\n"


async def test_a_concurrent_run_cannot_find_or_feed_the_ready_shell_of_its_own_workspace(work_root, make_request):
    # While a run is in its workspace's held sandbox no shell for a later run is started there (a concurrent run
    # gets a sandbox of its own); the scanner looks for one the whole time.
    attacker = (
        "shopt -s nullglob; for _ in $(seq 1000); do test -e $WORK_DIR/stop && break; for fd in /proc/[0-9]*/fd/3; do "
        "test ${fd%/fd/3} = /proc/$$ && continue; grep -qs 'source /proc/self/fd/3' ${fd%/fd/3}/cmdline || continue; "
        "echo 'echo injected' > $fd 2>/dev/null && echo written >> $WORK_DIR/attack; done; sleep 0.02; done; "
        "echo scanned >> $WORK_DIR/attack"
    )
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id=ws("rs")))
        await runtime.idle()
        scanner = asyncio.create_task(runtime.run(make_request(attacker, workspace_id=ws("rs"), timeout=30)))
        await asyncio.sleep(0.3)
        await runtime.run(make_request("true", workspace_id=ws("rs")))  # meanwhile, in a sandbox of its own
        await runtime.idle()
        assert runtime._spawners[ws("rs")].waiting_shell is None
        await asyncio.sleep(0.5)  # the scanner looks for a shell all this time
        assert not scanner.done(), scanner.result()
        (runtime.workspaces.find(ws("rs")).work_dir / "stop").touch()
        await scanner
        await runtime.idle()
        assert runtime._spawners[ws("rs")].waiting_shell is not None
        result = await runtime.run(make_request('echo legit; echo "$BASH_EXECUTION_STRING"', workspace_id=ws("rs")))
        attack = (runtime.workspaces.find(ws("rs")).work_dir / "attack").read_text()
    assert attack == "scanned\n"
    assert result.stdout == f"legit\n{READY_SHELL_LOADER}\n"


async def test_a_planted_link_or_fifo_cannot_become_a_runs_folder(runtime, make_request):
    await runtime.run(make_request("ln -s /etc $WORK_DIR/etc; ln -s /root $WORK_DIR/home; mkfifo $WORK_DIR/fifo",
                                   workspace_id=ws("cwd")))
    for cwd in ("$WORK_DIR/etc", "$WORK_DIR/home", "$WORK_DIR/fifo"):
        with pytest.raises(InvalidRunRequestError) as info:
            await asyncio.wait_for(runtime.run(make_request("pwd; ls", workspace_id=ws("cwd"), cwd=cwd)), 10)
        assert info.value.field == "cwd"


async def test_a_run_cannot_hard_link_files_it_does_not_own_into_its_outputs(runtime, make_request, library):
    result = await runtime.run(make_request(
        f"ln /etc/passwd $OUTPUT_DIR/passwd && echo linked-etc; "
        f"ln {library}/demo/SKILL.md $OUTPUT_DIR/skill && echo linked-library; "
        "ln $WORKSPACE_DIR/metadata.json $OUTPUT_DIR/meta && echo linked-metadata; echo end",
        output_files=["out/*"]))
    assert result.stdout == "end\n", result.stdout
    assert result.output_files == []


async def test_a_run_flooding_its_pipes_still_stops_at_its_timeout(work_root, make_request):
    flood = _py("""
        import fcntl, os
        for fd in (1, 2):
            fcntl.fcntl(fd, 1031, 1 << 20)  # F_SETPIPE_SZ: the largest pipe an unprivileged user may have
        chunk = bytes(1 << 20)
        os.fork()
        fd = 1 if os.fork() else 2
        while True:
            os.write(fd, chunk)
    """)
    async with LocalWorkspaceRuntime(work_root) as runtime:
        result = await runtime.run(make_request(flood, timeout=1))  # ends (the test's own timeout bounds it)
    assert result.timed_out and result.exit_code == 124
    assert len(result.stdout.encode()) < 1024 * 1024 + 1024


async def test_a_timeout_in_another_work_root_does_not_kill_this_tenants_run(shared_dir, make_request):
    name = ws("tenant")
    async with LocalWorkspaceRuntime(shared_dir / "root-a") as first, \
            LocalWorkspaceRuntime(shared_dir / "root-b") as second:
        victim = asyncio.create_task(first.run(make_request(
            "touch $WORK_DIR/started; sleep 2; echo survived", workspace_id=name, timeout=30)))
        for _ in range(500):
            found = first.workspaces.find(name)
            if found is not None and (found.work_dir / "started").exists():
                break
            await asyncio.sleep(0.02)
        other = await second.run(make_request("sleep 5", workspace_id=name, timeout=0.3))  # another tenant's
        result = await victim
    assert other.timed_out
    assert result.stdout == "survived\n" and result.exit_code == 0, "another tenant's timeout killed this run"


async def test_two_work_roots_never_give_two_tenants_the_same_user_id(shared_dir):
    # Two runtimes with different work roots on one host (two workers, the API's embedded runtime and a worker,
    # the local and Docker runtimes) would otherwise give the same workspace id the same user id.
    name = ws("tenant")
    first, second = WorkspaceManager(shared_dir / "root-a"), WorkspaceManager(shared_dir / "root-b")
    one, two = first.acquire(name), second.acquire(name)
    assert one.uid != two.uid, "two tenants share a user id"
    first.remove(name)
    # an id is held while its workspace exists: given back on removal, and taken again once its folder is gone
    assert WorkspaceManager(shared_dir / "root-c").acquire(name).uid == one.uid


# --- Network runs: a network namespace of their own, behind user-mode networking ----------------------------------


@pytest.fixture
def slirp4netns() -> str:
    """slirp4netns, installed with apt-get (as root) where it is missing."""
    return ensure_installed("slirp4netns", "slirp4netns")


@pytest.fixture
async def network_runtime(slirp4netns, work_root):
    """A runtime that allows network runs."""
    async with LocalWorkspaceRuntime(work_root, allow_network=True) as runtime:
        yield runtime


def _connect(targets: dict[str, tuple[str, int]]) -> str:
    """A command that connects to each named address and sends a line: prints ``<name> connected``, or
    ``<name> refused <errno>``."""
    return _py(f"""
        import socket
        for name, address in {targets!r}.items():
            try:
                with socket.create_connection(address, timeout=5) as s:
                    s.sendall(b"from the run\\n")
                print(name, "connected")
            except OSError as exc:
                print(name, "refused", exc.errno)
    """)


def _listener(address: str) -> socket.socket:
    server = socket.socket()
    server.bind((address, 0))
    server.listen()
    return server


async def test_a_network_run_cannot_reach_the_hosts_loopback_services_or_abstract_sockets(network_runtime, make_request):
    # Before its own namespace, a network run shared the host's: every service on the host's loopback (Redis, the
    # API) and every abstract unix socket of the host answered it, and /proc/net/unix listed them.
    name = f"skillrun-host-{uuid.uuid4().hex}"
    tcp = _listener("127.0.0.1")
    port = tcp.getsockname()[1]
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + name)
    abstract.listen()
    attack = (f"grep -c {name} /proc/net/unix; "
              + _connect({"loopback": ("127.0.0.1", port), "gateway": ("10.0.2.2", port)}) + "; "
              + _abstract_connect(name, "abstract-connected"))
    try:
        result = await network_runtime.run(make_request(attack, network=True))
        tcp.settimeout(0.5)
        with pytest.raises(TimeoutError):
            tcp.accept()  # nothing came through, by any address
    finally:
        tcp.close()
        abstract.close()
    lines = result.stdout.splitlines()
    assert lines[0] == "0", result.stdout + result.stderr
    assert lines[1] == "loopback refused 111", "a service on the host's loopback answered"
    assert lines[2].startswith("gateway refused"), "the host's loopback answered through the gateway"
    assert lines[3] == "refused 111", "an abstract unix socket of the host answered"


async def test_a_network_run_reaches_an_outside_address_but_never_the_hosts_loopback(network_runtime, make_request):
    # No internet is promised here: "outside" is a server on an address of the host that is not loopback, reached
    # as from any other machine. The same run is refused the host's loopback, directly and through the gateway.
    outside, loopback = _listener(host_address()), _listener("127.0.0.1")
    port = loopback.getsockname()[1]
    try:
        result = await network_runtime.run(make_request(_connect({
            "outside": outside.getsockname(), "loopback": ("127.0.0.1", port), "gateway": ("10.0.2.2", port),
        }), network=True))
        outside.settimeout(5)
        peer, _ = outside.accept()
        with peer:
            peer.settimeout(5)
            received = peer.recv(100)
        loopback.settimeout(0.5)
        with pytest.raises(TimeoutError):
            loopback.accept()
    finally:
        outside.close()
        loopback.close()
    lines = result.stdout.splitlines()
    assert lines[0] == "outside connected", result.stdout + result.stderr
    assert received == b"from the run\n"
    assert lines[1] == "loopback refused 111" and lines[2].startswith("gateway refused"), result.stdout


SURVEY_NETWORK = """
    import os
    print(" ".join(sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:])))
    print(open("/proc/net/fib_trie").read().count(ADDRESS), open("/proc/net/tcp").read().count(PORT))
    pids = [pid for pid in os.listdir("/proc") if pid.isdigit()]
    names = [open(f"/proc/{pid}/comm").read().strip() for pid in pids]
    print(len(names), names.count("slirp4netns"))
    held = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except FileNotFoundError:  # the listing's own descriptor, closed since
                pass
    own = {os.readlink("/proc/self/fd/1"), os.readlink("/proc/self/fd/2")}
    print(sorted(t for t in held - own if t.startswith(("pipe:", "net:", "user:", "/memfd:"))))
"""


async def test_a_network_run_sees_none_of_the_hosts_interfaces_addresses_sockets_nor_its_helper(
        network_runtime, make_request):
    # Shared with the host, /proc/net listed the host's interfaces (eth0, docker0, ...), addresses and listening
    # sockets. The run sees its own loopback and tap device alone, and neither the helper serving it nor any of
    # the descriptors the worker holds for it (namespaces, its ready and exit pipes, its error log).
    address = host_address()
    listener = _listener(address)
    port = f":{listener.getsockname()[1]:04X} "
    try:
        survey = SURVEY_NETWORK.replace("ADDRESS", repr(address)).replace("PORT", repr(port))
        result = await network_runtime.run(make_request(_py(survey), network=True))
    finally:
        listener.close()
    interfaces, seen, helpers, leaked = result.stdout.splitlines()
    assert interfaces == "lo tap0", result.stdout + result.stderr
    assert seen == "0 0", "the run sees the host's address or listening socket"
    assert helpers.split()[1] == "0" and int(helpers.split()[0]) >= 2, "the run sees its slirp4netns"
    assert leaked == "[]", "a descriptor of the host or of the helper is open in the run"


async def test_network_runs_started_together_each_get_their_own_network(network_runtime, make_request):
    # Each gets a namespace and a helper of its own, set up alongside the others'. A helper that brought its
    # sandbox's loopback up before bwrap had addressed it made bwrap fail ("loopback: Failed RTM_NEWADDR"): seen
    # about once in 160 such runs on a loaded host, never since the runtime waits for bwrap first.
    command = "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort | tr '\\n' ' '"
    await network_runtime.run(make_request("true", network=True))
    for batch in range(10):
        results = await asyncio.gather(*(
            network_runtime.run(make_request(command, network=True, workspace_id=ws(f"together-{k}")))
            for k in range(4)))
        for result in results:
            assert (result.exit_code, result.stdout) == (0, "lo tap0 "), result.stderr


def _helpers(parent: int) -> list[int]:
    """slirp4netns processes started by process ``parent`` (a runtime's), running or not yet reaped."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                name, rest = stat.read().rsplit(")", 1)
            if name.endswith("(slirp4netns") and int(rest.split()[1]) == parent:
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


async def _helpers_of(parent: int, appear: bool, seconds: float = 5.0) -> list[int]:
    """Wait until a helper of ``parent`` runs (``appear``) or none is left, even unreaped; the helpers then."""
    end = time.monotonic() + seconds
    while bool(found := _helpers(parent)) != appear and time.monotonic() < end:
        await asyncio.sleep(0.01)
    return found


async def test_a_network_runs_helper_ends_with_it_whether_it_finishes_times_out_or_is_cancelled(
        network_runtime, make_request):
    me = os.getpid()

    async def finish(task: asyncio.Task, request) -> None:  # noqa: ANN001 - a RunRequest
        (network_runtime.workspaces.find(request.workspace_id).work_dir / "go").touch()

    async def cancel(task: asyncio.Task, request) -> None:  # noqa: ANN001
        assert network_runtime.cancel(request.run_id)

    async def give_up(task: asyncio.Task, request) -> None:  # noqa: ANN001
        task.cancel()

    async def let_time_out(task: asyncio.Task, request) -> None:  # noqa: ANN001
        pass

    until_told = "until test -e $WORK_DIR/go; do sleep 0.02; done"
    for how, command, timeout, stop in [("finished", until_told, 30, finish), ("timed out", "sleep 30", 1, let_time_out),
                                        ("cancelled", "sleep 30", 30, cancel),
                                        ("given up by its caller", "sleep 30", 30, give_up)]:
        request = make_request(command, network=True, timeout=timeout, workspace_id=ws("net-end"))
        task = asyncio.create_task(network_runtime.run(request))
        assert await _helpers_of(me, appear=True), f"{how}: no helper was seen while the run ran"
        await stop(task, request)
        result = (await asyncio.gather(task, return_exceptions=True))[0]
        assert how != "timed out" or result.timed_out
        assert not await _helpers_of(me, appear=False), f"{how}: slirp4netns outlived its run"


async def test_a_network_run_whose_helper_fails_to_start_fails_and_leaves_nothing_behind(
        network_runtime, make_request, monkeypatch):
    monkeypatch.setattr(user_network, "MTU", 100000)  # slirp4netns refuses it and exits at once
    sleep, marker = sleeper()
    with pytest.raises(SandboxError, match="slirp4netns.*MTU"):
        await network_runtime.run(make_request(sleep, network=True))
    assert not await _helpers_of(os.getpid(), appear=False), "slirp4netns outlived its failed start"
    assert not await _appears_anywhere(marker, 1.0), "the sandbox whose network failed is still there"


async def _appears_anywhere(text: str, seconds: float) -> bool:
    """Whether a process with ``text`` anywhere in its command line runs within ``seconds`` (a blocked sandbox has
    its command in bwrap's)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for entry in os.scandir("/proc"):
            try:
                if entry.name.isdigit() and text.encode() in open(f"/proc/{entry.name}/cmdline", "rb").read():
                    return True
            except OSError:
                continue
        await asyncio.sleep(0.05)
    return False


WORKER = """
import asyncio, sys
from worker.contract import RunRequest, SkillRef
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
work_root, library = sys.argv[1:3]
runtime = LocalWorkspaceRuntime(work_root, allow_network=True)
request = RunRequest(skill=SkillRef(name="demo", root=library, path="demo"), network=True, timeout=60,
                     command="touch $WORK_DIR/started; sleep 60")
asyncio.run(runtime.run(request))
"""


async def test_a_network_runs_helper_does_not_outlive_a_killed_worker(slirp4netns, work_root, library):
    # Killed, the worker closes nothing and reaps nothing: the helper must end on its own (its exit descriptor,
    # held by the worker alone, closes), as the sandbox does (bwrap dies with its parent).
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(work_root / "killed"), str(library)],
                              cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL)
    try:
        for _ in range(1000):
            if list((work_root / "killed").glob("*/work/started")) or worker.poll() is not None:
                break
            await asyncio.sleep(0.01)
        helpers = _helpers(worker.pid)
        assert len(helpers) == 1, "the worker's network run did not start"
    finally:
        worker.kill()
        worker.wait()
    assert wait_gone(helpers[0]), "slirp4netns outlived its killed worker"


async def test_without_slirp4netns_a_network_run_fails_and_names_the_fix(work_root, make_request, monkeypatch):
    # Never a silent fall back to the host's network namespace.
    user_network.find_slirp4netns.cache_clear()
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None if name == "slirp4netns" else which(name, path=path))
    try:
        async with LocalWorkspaceRuntime(work_root, allow_network=True) as runtime:
            with pytest.raises(RuntimeUnavailableError, match="apt-get install slirp4netns"):
                await runtime.run(make_request("echo ran", network=True))
    finally:
        user_network.find_slirp4netns.cache_clear()
