"""Attacks on the local runtime as root: a skill command tries to reach other tenants, the worker and the host.

Each test runs the attack for real (a real bubblewrap sandbox, real control groups, real users) once starting
the command directly and once through the workspace's spawner (the ``runtime`` fixture), and asserts it is
contained. The names say what each defends.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import socket
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import write_skill
from tests.processes import running_with, sleeper, wait_none_with
from worker.contract import RunLimits, SkillRef
from worker.runtimes.local.runtime import LocalWorkspaceRuntime
from worker.workspaces.manager import WorkspaceManager

pytestmark = pytest.mark.root


async def _run(runtime: LocalWorkspaceRuntime, make_request, command: str, **fields):
    return await runtime.run(make_request(command, **fields))


async def test_a_run_sees_only_its_own_processes(runtime, make_request):
    sleep, marker = sleeper()
    victim = asyncio.create_task(_run(runtime, make_request, f"{sleep}", workspace_id="victim", timeout=30))
    for _ in range(500):
        if running_with(marker):
            break
        await asyncio.sleep(0.01)
    assert running_with(marker), "the victim's command did not start"
    spy = await _run(runtime, make_request, "ps -eo pid,user,args; ls /proc | grep -c '^[0-9]'", workspace_id="spy")
    victim.cancel()  # its caller gives up: the victim's command ends
    await asyncio.gather(victim, return_exceptions=True)
    assert marker not in spy.stdout, "another tenant's command line is visible"
    # pid 1 is its init, or in its workspace's held sandbox the workspace's own spawner (SPAWNER_SOURCE)
    others = [line for line in spy.stdout.splitlines() if not line.split()[0] == "1"]
    assert "pytest" not in spy.stdout and not any("python" in line for line in others), "the worker is visible"
    assert int(spy.stdout.split()[-1]) <= 5, spy.stdout  # its init or spawner, bash, ps, ls, grep at most


async def test_a_run_cannot_see_other_workspaces_or_list_the_work_root(runtime, make_request):
    victim = await _run(runtime, make_request, "echo secret > $WORK_DIR/secret; echo $WORKSPACE_DIR", workspace_id="victim")
    victim_dir = victim.stdout.strip()
    spy = await _run(runtime, make_request, f"ls -a $(dirname $WORKSPACE_DIR); cat {victim_dir}/work/secret",
                     workspace_id="spy")
    listed = spy.stdout.split()
    assert Path(victim_dir).name not in listed and ".skillrun" not in listed
    assert [name for name in listed if name.startswith("ws_")] == [runtime.workspaces.find("spy").path.name]
    assert "secret" not in spy.stdout and "No such file or directory" in spy.stderr


async def test_a_run_cannot_read_the_artifact_store(runtime, make_request):
    await _run(runtime, make_request, "echo private > out/report.txt", workspace_id="victim",
               output_files=["out/report.txt"], save_as_artifacts=True)
    store = runtime.artifact_store.root
    stored = [p for p in store.rglob("*") if p.is_file()]
    assert stored, "the artifact was not stored"
    spy = await _run(runtime, make_request, f"cat {stored[0]}; ls {store}", workspace_id="spy")
    assert "private" not in spy.stdout
    assert "No such file or directory" in spy.stderr
    # and should the store be reachable some other way, it is its owner's alone
    assert all(p.stat().st_mode & 0o077 == 0 for p in [store, *store.rglob("*")])


async def test_a_run_cannot_read_another_library_or_the_host_home(runtime, make_request, shared_dir):
    other = write_skill(shared_dir / "other-team", "secret-skill", body="The other team's secret.\n")
    spy = await _run(runtime, make_request, f"cat {other}/SKILL.md; ls /root /home /var/lib /srv", workspace_id="spy")
    assert "secret" not in spy.stdout
    assert spy.stderr.count("No such file or directory") >= 5


async def test_a_run_cannot_change_its_own_skills_files_and_its_new_ones_stay_in_its_workspace(
        runtime, make_request, library):
    before = (library / "demo" / "SKILL.md").stat()
    result = await _run(runtime, make_request, "cat SKILL.md | head -2; touch SKILL.md; echo x >> SKILL.md; "
                                               "rm -f SKILL.md; echo x > scripts/new.sh")
    assert "name: demo" in result.stdout
    assert result.stderr.count("Permission denied") + result.stderr.count("Operation not permitted") == 3, result.stderr
    assert not (library / "demo" / "scripts" / "new.sh").exists()
    after = (library / "demo" / "SKILL.md").stat()
    assert (after.st_mtime_ns, after.st_size) == (before.st_mtime_ns, before.st_size)


@pytest.mark.parametrize("detach", ["setsid {sleep} &", "nohup {sleep} >/dev/null 2>&1 &", "( {sleep} & ) ",
                                    "{sleep} & disown", "setsid bash -c '{sleep} & exit' </dev/null >/dev/null 2>&1"])
async def test_a_detached_process_does_not_outlive_its_run(runtime, make_request, detach):
    sleep, marker = sleeper()
    result = await _run(runtime, make_request, detach.format(sleep=sleep) + "\nsleep 0.2; echo left", workspace_id="d")
    assert result.exit_code == 0 and "left" in result.stdout
    assert wait_none_with(marker), f"{detach!r} outlived its run"
    after = await _run(runtime, make_request, "ps -eo args", workspace_id="d")
    assert marker not in after.stdout


async def test_a_detached_process_does_not_outlive_a_timed_out_run(runtime, make_request):
    sleep, marker = sleeper()
    result = await _run(runtime, make_request, f"setsid {sleep} & nohup {sleep} & {sleep}", timeout=0.5)
    assert result.timed_out
    assert wait_none_with(marker)


async def test_a_run_cannot_stop_kill_or_trace_its_spawner(work_root, make_request):
    async with LocalWorkspaceRuntime(work_root, spawners="eager") as runtime:
        await runtime.run(make_request("true", workspace_id="sp"))
        spawner = runtime._spawners["sp"]
        attack = ("kill -STOP -1; kill -9 -1; "
                  "for p in /proc/[0-9]*; do grep -qs recv_fds $p/cmdline && echo found-spawner; done; "
                  "python3 -c 'import ctypes, os; libc = ctypes.CDLL(None); "
                  f"print(\"attach\", libc.ptrace(16, {spawner.pid}, 0, 0))'")
        await runtime.run(make_request(attack, workspace_id="sp"))
        with open(f"/proc/{spawner.pid}/status") as status:
            state = next(line for line in status if line.startswith("State:"))
        assert spawner.alive and "T (stopped)" not in state and "t (tracing stop)" not in state
        result = await runtime.run(make_request("echo still served", workspace_id="sp"))
        assert result.stdout == "still served\n"
        assert runtime._spawners["sp"] is spawner


async def test_a_run_cannot_make_user_namespaces(runtime, make_request):
    result = await _run(runtime, make_request, "unshare -r id; unshare --user --map-root-user true; echo end")
    assert "uid=0" not in result.stdout
    assert result.stdout.strip() == "end"
    assert "unshare failed" in result.stderr


async def test_private_tmp_and_dev_shm_are_capped_and_gone_with_the_run(work_root, make_request):
    cap = 4 * 1024 * 1024
    left = f"left-{uuid.uuid4().hex}"
    async with LocalWorkspaceRuntime(work_root, tmpfs_bytes=cap) as runtime:
        first = await runtime.run(make_request(
            f"echo a > /tmp/{left}; echo b > /dev/shm/{left}; head -c 8M /dev/zero > /tmp/big; echo tmp=$?; "
            "head -c 8M /dev/zero > /dev/shm/big; echo shm=$?", workspace_id="t"))
        assert "tmp=1" in first.stdout and "shm=1" in first.stdout
        assert "No space left on device" in first.stderr
        again = await runtime.run(make_request("ls -A /tmp /dev/shm", workspace_id="t"))
        other = await runtime.run(make_request("ls -A /tmp /dev/shm", workspace_id="other"))
    for result in (again, other):
        assert left not in result.stdout and "big" not in result.stdout
    assert not Path(f"/tmp/{left}").exists() and not Path(f"/dev/shm/{left}").exists()


async def test_memory_limit_holds_for_the_whole_run_not_per_process(runtime, make_request):
    hog = "python3 -c 'import time; b = bytearray(120 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(2)'"
    limits = RunLimits(memory_bytes=256 * 1024 * 1024)
    result = await _run(runtime, make_request, f"{hog} & {hog} & {hog} & wait; echo done", limits=limits)
    assert result.oom_killed, result.stderr
    assert "went past its memory limit" in result.stderr


async def test_a_run_is_held_by_a_control_group_of_its_own(runtime, make_request):
    sleep, marker = sleeper()
    limits = RunLimits(memory_bytes=300 * 1024 * 1024, processes=77)
    task = asyncio.create_task(_run(runtime, make_request, f"{sleep}", limits=limits, timeout=30, workspace_id="cg"))
    for _ in range(500):
        if running_with(marker):
            break
        await asyncio.sleep(0.01)
    [pid] = running_with(marker)
    groups = dict(line.strip().split(":", 2)[1:] for line in open(f"/proc/{pid}/cgroup"))
    memory = Path("/sys/fs/cgroup/memory") / groups["memory"].lstrip("/")
    pids = Path("/sys/fs/cgroup/pids") / groups["pids"].lstrip("/")
    cpu_key = next(key for key in groups if "cpu" in key.split(",") and "cpuset" not in key)
    cpu = Path("/sys/fs/cgroup/cpu") / groups[cpu_key].lstrip("/")
    assert re.search(r"/skillrun/[0-9a-f]{16}/run-[0-9a-f]{16}$", groups["memory"]), groups["memory"]
    assert int((memory / "memory.limit_in_bytes").read_text()) == 300 * 1024 * 1024
    assert (pids / "pids.max").read_text().strip() == "77"
    assert int((cpu / "cpu.cfs_quota_us").read_text()) == 100_000  # one core, the runtime's default
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert wait_none_with(marker)
    await runtime.idle()
    # kept for the workspace's next run (its ready shell may wait in it already); removed when the runtime closes
    left = (memory / "cgroup.procs").read_text().split() if memory.exists() else []
    assert not [pid for pid in left if marker in Path(f"/proc/{pid}/cmdline").read_text()]
    await runtime.close()
    assert not memory.exists() and not pids.exists(), "the run's control group was left behind"


async def test_a_fork_bomb_stops_at_the_process_limit(runtime, make_request):
    bomb = ("python3 -c 'import os, time\nn = 0\nfor _ in range(400):\n    try:\n        pid = os.fork()\n"
            "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(5)\n        os._exit(0)\n"
            "    n += 1\nprint(\"forked\", n)'")
    result = await _run(runtime, make_request, bomb, limits=RunLimits(processes=64), timeout=20)
    forked = int(result.stdout.split()[-1])
    assert 0 < forked < 64


async def test_a_run_without_network_reaches_nothing_on_the_host(runtime, make_request):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        result = await _run(runtime, make_request, f"echo hi > /dev/tcp/127.0.0.1/{port} && echo connected")
    finally:
        server.close()
    assert "connected" not in result.stdout


async def test_another_skill_root_in_the_same_workspace_is_not_shown(runtime, make_request, shared_dir):
    other = write_skill(shared_dir / "second-library", "other")
    await runtime.run(make_request("true", workspace_id="two", skill=SkillRef(name="other", root=str(other.parent),
                                                                            path="other")))
    result = await runtime.run(make_request(f"ls {other}", workspace_id="two"))
    assert "No such file or directory" in result.stderr
    assert os.path.isdir(other)


def test_a_workspace_never_gets_the_id_of_a_host_user_or_group(work_root):
    manager = WorkspaceManager(work_root)
    start = int.from_bytes(hashlib.sha256(b"collide").digest()[:8], "big") % manager.user_ids.count
    taken = manager.user_ids.base + start  # the id "collide" would get first
    name = f"skillrun-test-{taken}"
    subprocess.run(["groupadd", "-g", str(taken), name], check=True, capture_output=True)
    try:
        workspace = manager.acquire("collide")
    finally:
        subprocess.run(["groupdel", name], check=True, capture_output=True)
    assert workspace.uid != taken
    assert manager.user_ids.base <= workspace.uid < manager.user_ids.base + manager.user_ids.count
