"""Attacks on what a workspace's held sandbox (``worker.sandbox.held``) shares between runs of one workspace.

A warm run goes into a sandbox made once per workspace, where the spawner is pid 1 and the runs before it ran:
each test here tries to use that, from one run against the spawner, the runs after it or the limits of its own.
The runtime starts its spawner eagerly, so every run but the first goes through the held sandbox (asserted by
``_held``: consecutive runs share one PID namespace).
"""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.attacks.held import PID_NAMESPACE, py, run, warm_held
from tests.conftest import write_skill
from tests.processes import running_with, sleeper, wait_none_with
from worker.contract import RunLimits, SkillRef
from worker.runtimes.local.runtime import LocalWorkspaceRuntime

pytestmark = pytest.mark.root

SESSION = uuid.uuid4().hex[:8]


def ws(name: str) -> str:
    return f"held-{name}-{SESSION}"


async def _run(runtime: LocalWorkspaceRuntime, make_request, command: str, name: str, **fields):
    return await run(runtime, make_request, command, ws(name), **fields)


async def _held(runtime: LocalWorkspaceRuntime, make_request, name: str) -> str:
    return await warm_held(runtime, make_request, ws(name))


async def test_a_run_cannot_signal_trace_or_read_the_spawner_that_is_its_pid_1(held, make_request):
    namespace = await _held(held, make_request, "pid1")
    spawner = held._spawners[ws("pid1")]
    attack = py("""
        import ctypes, os, signal
        libc = ctypes.CDLL(None, use_errno=True)
        for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGSTOP, signal.SIGSEGV, signal.SIGUSR1):
            os.kill(1, sig)
        print("attach", libc.ptrace(16, 1, 0, 0), ctypes.get_errno())
        print("seize", libc.ptrace(0x4206, 1, 0, 0), ctypes.get_errno())
        for path in ("/proc/1/mem", "/proc/1/environ", "/proc/1/fd/0", "/proc/1/fd/3"):
            try:
                open(path, "rb").read(1)
                print("read", path)
            except OSError:
                pass
        try:
            os.listdir("/proc/1/fd")
            print("listed fds")
        except OSError:
            pass
        """)
    result = await _run(held, make_request, attack, "pid1")
    assert result.stdout == "attach -1 1\nseize -1 1\n", result.stdout + result.stderr
    after = await _run(held, make_request, PID_NAMESPACE, "pid1")
    assert held._spawners[ws("pid1")] is spawner and spawner.alive
    assert after.stdout == namespace


async def test_a_runs_detached_processes_are_gone_before_the_next_run_of_its_workspace(held, make_request):
    await _held(held, make_request, "leftover")
    sleep, marker = sleeper()
    detach = (f"setsid {sleep} >/dev/null 2>&1 < /dev/null & "
              f"( ( nohup {sleep} >/dev/null 2>&1 & ) & ) ; disown -a; echo left")
    result = await _run(held, make_request, detach, "leftover")
    assert result.stdout == "left\n"
    assert wait_none_with(marker, 0.5), "a detached process of the run outlived it"
    # A whole-line match: grep's own line never matches (whether ps saw grep yet is a race of the pipeline).
    found = await _run(held, make_request, f"ps -eo args= | grep -cx '{sleep}' || true", "leftover")
    assert found.stdout.strip() == "0", found


async def test_a_run_sees_no_process_of_another_run_or_shell_in_its_held_sandbox(held, make_request):
    await _held(held, make_request, "alone")
    look = py("""
        import os
        me = open("/proc/self/cgroup").read()
        for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
            if pid == 1:
                continue
            try:
                group = open(f"/proc/{pid}/cgroup").read()
            except OSError:
                continue
            if group != me:
                print("foreign", pid, open(f"/proc/{pid}/cmdline").read())
        print("looked")
        """)
    result = await _run(held, make_request, look, "alone")
    assert result.stdout == "looked\n", result.stdout


async def test_a_concurrent_run_of_the_workspace_gets_a_sandbox_of_its_own(held, make_request, work_root):
    namespace = await _held(held, make_request, "concurrent")
    workspace = held.workspaces.find(ws("concurrent"))
    first = asyncio.create_task(held.run(make_request(
        f"{PID_NAMESPACE} > $WORK_DIR/first; touch $WORK_DIR/started; sleep 1", workspace_id=ws("concurrent"))))
    for _ in range(500):
        if (workspace.work_dir / "started").exists():
            break
        await asyncio.sleep(0.01)
    second = await held.run(make_request(PID_NAMESPACE, workspace_id=ws("concurrent")))
    await first
    assert (workspace.work_dir / "first").read_text() == namespace
    assert second.stdout != namespace and second.stdout.startswith("pid:[")



async def test_a_concurrent_run_of_another_skill_leaves_the_run_in_the_held_sandbox_alone(held, make_request, library):
    # The held sandbox shows one skill's library folder: a run of another skill needs another. While a run is in
    # it, that run must go on (not be killed with the spawner of a sandbox made anew); the other gets its own.
    write_skill(library, "other", files={"scripts/x.sh": "echo other\n"})
    namespace = await _held(held, make_request, "two-skills")
    workspace = held.workspaces.find(ws("two-skills"))
    first = asyncio.create_task(held.run(make_request(
        f"{PID_NAMESPACE} > $WORK_DIR/first; touch $WORK_DIR/started; until [ -e $WORK_DIR/go ]; do sleep 0.05; "
        "done; echo done", workspace_id=ws("two-skills"), timeout=60)))
    for _ in range(500):
        if (workspace.work_dir / "started").exists():
            break
        await asyncio.sleep(0.01)
    other = SkillRef(name="other", root=str(library), path="other")
    second = await held.run(make_request(f"{PID_NAMESPACE}; echo other", workspace_id=ws("two-skills"), skill=other))
    (workspace.work_dir / "go").touch()
    ended = await first
    assert (ended.exit_code, ended.stdout) == (0, "done\n"), ended
    assert (workspace.work_dir / "first").read_text() == namespace
    seen, said = second.stdout.split()
    assert (second.exit_code, said) == (0, "other") and seen != namespace.strip(), second

async def test_files_and_ipc_objects_a_run_leaves_are_gone_for_the_next_run(held, make_request):
    await _held(held, make_request, "tmp")
    plant = ("mkdir -p /tmp/deep/locked && echo secret > /tmp/deep/locked/f && chmod 0 /tmp/deep/locked /tmp/deep; "
             "echo secret > /dev/shm/s; ln -s /etc/passwd /tmp/link; mkfifo /tmp/fifo; "
             "ipcmk -M 4096 >/dev/null && ipcmk -Q >/dev/null && ipcmk -S 1 >/dev/null && echo planted")
    assert (await _run(held, make_request, plant, "tmp")).stdout == "planted\n"
    look = py("""
        import os
        mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
        for top in ("/tmp", "/dev/shm"):
            for folder, dirs, files in os.walk(top):
                for name in dirs + files:
                    path = os.path.join(folder, name)
                    if not any(m == path or m.startswith(path + "/") for m in mounts):
                        print("left", path)
                dirs[:] = [d for d in dirs if os.path.join(folder, d) not in mounts]
        print(len(os.popen("ipcs -m -q -s").read().split("0x")) - 1, "ipc objects")
        """)
    result = await _run(held, make_request, look, "tmp")
    assert result.stdout == "0 ipc objects\n", result.stdout


async def test_a_run_cannot_open_a_posix_message_queue_the_next_run_would_find(held, make_request):
    await _held(held, make_request, "mq")
    result = await _run(held, make_request, py("""
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.mq_open(b"/left", 0o100 | 0o2, 0o600, None), ctypes.get_errno())
        """), "mq")
    assert result.stdout == "-1 1\n", result.stdout + result.stderr


async def test_a_run_in_the_held_sandbox_is_held_to_its_own_limits(held, make_request):
    await _held(held, make_request, "limits")
    fork = py("""
        import os, time
        n = 0
        try:
            for _ in range(200):
                if os.fork() == 0:
                    time.sleep(5)
                    os._exit(0)
                n += 1
        except OSError:
            pass
        print(n)
        """)
    small = await _run(held, make_request, fork, "limits", limits=RunLimits(processes=20))
    assert 0 < int(small.stdout) < 20
    large = await _run(held, make_request, fork, "limits", limits=RunLimits(processes=100))
    assert 20 < int(large.stdout) < 100


async def test_a_run_of_another_skill_does_not_see_the_skill_the_held_sandbox_showed(
    held, make_request, library
):
    write_skill(library, "other", files={"scripts/x.sh": "echo other\n"})
    await _held(held, make_request, "skills")
    demo = library / "demo"
    other = SkillRef(name="other", root=str(library), path="other")
    result = await _run(held, make_request, f"ls {demo} >/dev/null 2>&1 && echo sees-demo; echo end", "skills",
                        skill=other)
    assert result.stdout == "end\n"
    assert not running_with(f"--ro-bind {demo} {demo} --remount-ro")
