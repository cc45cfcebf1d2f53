"""Attacks on the Docker runtime, run for real against a real engine: each test runs the escape and asserts it
is contained (processes that outlive their run, scratch files left for the next run, limits per process, host
user ids, and the hardening the runtime claims)."""

from __future__ import annotations

import asyncio
import grp
import ipaddress
import os
import pwd
import subprocess

import pytest

from worker.contract import RunLimits
from worker.runtimes.docker.host import EXECUTOR_RESIDENTS
from worker.runtimes.docker.launch import container_limits

pytestmark = pytest.mark.docker

ROOMY = RunLimits(memory_bytes=16 * 1024**3, processes=4096)
"""Per-process limits out of the way, so what is tested is the container's."""

DETACHING = {
    "setsid": "setsid sleep 1001 >/dev/null 2>&1 </dev/null &",
    "nohup": "nohup sleep 1001 >/dev/null 2>&1 &",
    "double fork": "( ( sleep 1001 >/dev/null 2>&1 </dev/null & ) & )",
    "disown": "sleep 1001 >/dev/null 2>&1 </dev/null & disown",
    "cleared environment": "env -i setsid sleep 1001 >/dev/null 2>&1 </dev/null &",
    "holding the output": "setsid sleep 1001 &",
}
ENDINGS = {"finished": "true", "failed": "exit 3", "timed out": "sleep 60", "cancelled": "sleep 60"}


async def _run_until_cancelled(runtime, request, docker_engine, marker: str):
    """Start ``request``, cancel it once ``marker`` shows in its container, return its result."""
    task = asyncio.create_task(runtime.run(request))
    for _ in range(400):
        container = runtime.container_id(request.workspace_id)
        if container and any(marker in " ".join(p) for p in docker_engine.client.api.top(container)["Processes"]):
            break
        await asyncio.sleep(0.025)
    assert runtime.cancel(request.run_id)
    return await task


def _engine_side(docker_engine, container_id: str) -> list[str]:
    return [" ".join(p) for p in docker_engine.client.api.top(container_id, ps_args="-eo uid,pid,args")["Processes"]]


@pytest.mark.parametrize("ending", list(ENDINGS))
@pytest.mark.parametrize("detach", list(DETACHING))
async def test_docker_background_child_does_not_outlive_its_run(docker_runtime_factory, docker_engine, run_in, detach, ending):
    runtime = docker_runtime_factory()
    request = run_in(f"{DETACHING[detach]}\n{ENDINGS[ending]}", timeout=1 if ending == "timed out" else 60)
    if ending == "cancelled":
        result = await _run_until_cancelled(runtime, request, docker_engine, "sleep 60")
        assert "cancelled" in result.stderr
    else:
        result = await runtime.run(request)
        assert result.timed_out == (ending == "timed out")
    container = runtime.container_id("attacked")
    assert not [p for p in _engine_side(docker_engine, container) if "sleep 1001" in p or "sleep 60" in p]
    after = await runtime.run(run_in("ps -eo uid=,args="))
    assert "sleep 1001" not in after.stdout and "sleep 60" not in after.stdout
    # Not the probe, nor its own bash (the ready shell it ran in, named by its loader).
    others = [line for line in after.stdout.splitlines()
              if line.split()[1:2] != ["ps"] and "__skillrun_command" not in line]
    assert len(others) == 1 and "/.skillrun/program/executor.py" in others[0], after.stdout  # the executor alone


async def test_docker_overlapping_runs_of_one_workspace_take_turns_and_end_only_their_own(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    await runtime.run(run_in("true"))
    first = asyncio.create_task(runtime.run(run_in("setsid sleep 1002 >/dev/null 2>&1 & sleep 1; echo first done")))
    await asyncio.sleep(0.2)
    second = await runtime.run(run_in("ps -eo args=; echo second done"))
    assert (await first).stdout == "first done\n"
    assert second.stdout.endswith("second done\n") and "sleep 1002" not in second.stdout and "sleep 1" not in second.stdout


async def test_docker_tmp_and_shm_are_private_size_capped_and_emptied_between_runs(docker_runtime_factory, run_in):
    canary = f"/tmp/skillrun-host-canary-{os.getpid()}"
    open(canary, "w").close()
    try:
        runtime = docker_runtime_factory(tmpfs_bytes=8 * 1024**2, shm_bytes=4 * 1024**2)
        first = await runtime.run(run_in(
            "df -B1 --output=size /tmp /dev/shm | tail -2; ls /tmp; mkdir -p /tmp/d/e; echo x > /tmp/d/e/f; "
            "echo y > /tmp/.hidden; echo z > /dev/shm/left; "
            "head -c 16M /dev/zero > /tmp/fill 2>/dev/null || echo full", limits=ROOMY))
        sizes = first.stdout.split()[:2]
        assert sizes == [str(8 * 1024**2), str(4 * 1024**2)]
        assert os.path.basename(canary) not in first.stdout and "full" in first.stdout
        second = await runtime.run(run_in("ls -A /tmp /dev/shm /dev/mqueue; find /tmp /dev/shm -xdev -user $(id -u) | wc -l"))
        for left in ("d", ".hidden", "left", "fill"):
            assert left not in second.stdout.split()
        assert second.stdout.split()[-1] == "0"
        other = await runtime.run(run_in("echo mine > /tmp/o; ls /tmp", workspace_id="other"))
        neighbour = await runtime.run(run_in("ls -A /tmp /dev/shm"))
        assert "o" in other.stdout.split() and "o" not in neighbour.stdout.split()
    finally:
        os.unlink(canary)


async def test_docker_three_processes_together_cannot_use_three_times_the_memory_limit(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory(memory_bytes=256 * 1024**2)
    hog = "python3 -c 'import time; x = bytearray(150 * 1024 * 1024); time.sleep(3); print(\"kept\")'"
    result = await runtime.run(run_in(f"{hog} & {hog} & {hog} & wait", limits=ROOMY, timeout=60))
    assert result.stdout.count("kept") < 3
    assert result.oom_killed and "memory limit" in result.stderr


async def test_docker_fork_bomb_stops_at_the_pids_limit_without_harming_the_host(docker_runtime_factory, docker_engine, run_in):
    runtime = docker_runtime_factory(pids=64)
    task = asyncio.create_task(runtime.run(run_in("bomb() { bomb | bomb & }; bomb; sleep 3", timeout=4, limits=ROOMY)))
    most = 0
    while not task.done():
        container = runtime.container_id("attacked")
        if container:
            most = max(most, len(docker_engine.client.api.top(container)["Processes"]))
        assert subprocess.run(["true"]).returncode == 0  # the host still starts processes
        await asyncio.sleep(0.1)
    await task
    assert most <= 64 + EXECUTOR_RESIDENTS
    after = await runtime.run(run_in("ps -eo comm= > $RUN_DIR/ps; grep -c '^bash$' $RUN_DIR/ps", limits=ROOMY))
    assert after.stdout.strip() == "1"  # this run's own bash only: the bomb is gone


async def test_docker_a_later_run_gets_its_own_limits_in_the_same_container(docker_runtime_factory, docker_engine, run_in):
    runtime = docker_runtime_factory(memory_bytes=512 * 1024**2, pids=128)
    alloc = "python3 -c 'x = bytearray(200 * 1024 * 1024); print(\"allocated\")'"
    seen = ("cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/pids/pids.max 2>/dev/null || "
            "cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/pids.max")
    small = RunLimits(memory_bytes=128 * 1024**2, processes=20)
    tight = await runtime.run(run_in(f"{seen}; {alloc}", limits=small))
    container = runtime.container_id("attacked")
    config = docker_engine.client.api.inspect_container(container)["HostConfig"]
    expected = container_limits((128 * 1024**2, 20), executor=True)  # the executor's own process and memory on top
    assert (config["Memory"], config["PidsLimit"]) == expected
    assert tight.stdout.split() == [str(n) for n in expected]  # what the run itself sees
    roomy = await runtime.run(run_in(alloc, limits=RunLimits(memory_bytes=16 * 1024**3, processes=4096)))
    assert runtime.container_id("attacked") == container and roomy.stdout == "allocated\n"
    config = docker_engine.client.api.inspect_container(container)["HostConfig"]
    assert (config["Memory"], config["PidsLimit"]) == container_limits((512 * 1024**2, 128), executor=True)


async def test_docker_runs_as_a_workspace_id_that_no_host_user_or_group_has(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    result = await runtime.run(run_in(
        "id -u; id -g; echo mine > $WORK_DIR/file; cd ~ && pwd; "
        "python3 -c 'import pathlib, tempfile; print(pathlib.Path.home() == pathlib.Path.cwd()); tempfile.mkstemp()'"))
    uid, gid, home, python_ok = result.stdout.split()
    assert 30000 <= int(uid) < 60000 and python_ok == "True" and "/runs/run_" in home, result.stderr
    for lookup, key in ((pwd.getpwuid, int(uid)), (grp.getgrgid, int(gid))):
        with pytest.raises(KeyError):
            lookup(key)
    workspace = runtime.workspaces.find("attacked")
    assert os.stat(workspace.path / "work" / "file").st_uid == int(uid)
    other = await runtime.run(run_in("id -u", workspace_id="neighbour"))
    assert other.stdout.strip() != uid


async def test_docker_network_is_off(docker_runtime_factory, docker_engine, run_in):
    subnet = docker_engine.client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Subnet"]
    gateway = str(ipaddress.ip_network(subnet)[1])  # the host, as containers with a network reach it
    runtime = docker_runtime_factory()
    result = await runtime.run(run_in(
        "python3 -c \"import socket; print(socket.if_nameindex())\"; "
        f"python3 -c \"import socket; socket.create_connection(('{gateway}', 2375), timeout=2)\" 2>&1 | tail -1; "
        "python3 -c \"import socket; socket.getaddrinfo('example.com', 80)\" 2>&1 | tail -1"))
    lines = result.stdout.splitlines()
    assert lines[0] == "[(1, 'lo')]"
    assert "unreachable" in lines[1] and "gaierror" in lines[2]


async def test_docker_capabilities_are_dropped_and_privileges_cannot_be_gained(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    result = await runtime.run(run_in(
        "grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status; "
        "ls /proc/1/root/ 2>&1 | tail -1; cat /proc/1/environ 2>&1 | tail -1; ls /.skillrun/control 2>&1 | tail -1; "
        "chown 0 $WORK_DIR 2>&1 | tail -1; kill -9 1; sleep 0.2"))
    container = runtime.container_id("attacked")
    fields = dict(line.split(":\t") for line in result.stdout.splitlines()[:7])
    assert {fields[f"Cap{k}"] for k in ("Inh", "Prm", "Eff", "Bnd", "Amb")} == {"0000000000000000"}
    assert fields["NoNewPrivs"] == "1" and fields["Seccomp"] == "2"
    rest = "\n".join(result.stdout.splitlines()[7:]) + result.stderr
    assert rest.count("Operation not permitted") + rest.count("Permission denied") >= 4
    # The executor (the namespace's init, another user) is out of the kill's reach and still serves the container.
    after = await runtime.run(run_in("true"))
    assert after.timings.exec_via == "executor" and runtime.container_id("attacked") == container


async def test_docker_root_file_system_is_read_only_and_only_the_workspace_and_scratch_are_writable(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    result = await runtime.run(run_in(
        "for m in $(awk '{print $2}' /proc/self/mounts) /etc /usr/bin /root /var /; do "
        "  touch \"$m/.probe\" 2>/dev/null && echo \"writable $m\" && rm -f \"$m/.probe\"; done; "
        "touch $WORK_DIR/.probe $OUTPUT_DIR/.probe $RUN_DIR/.probe && echo workspace writable"))
    *writable, workspace = result.stdout.splitlines()
    assert sorted({line.split()[1] for line in writable}) == ["/dev/mqueue", "/dev/shm", "/tmp"]
    assert workspace == "workspace writable"  # its work/, out/ and run folder; its root and skills/ are root's


async def test_docker_no_other_workspace_or_platform_store_is_visible(docker_runtime_factory, shared_dir, run_in):
    runtime = docker_runtime_factory()
    token = f"victim-secret-{os.getpid()}"
    victim = await runtime.run(run_in(f"echo {token} > $WORK_DIR/s; echo $WORKSPACE_DIR", workspace_id="victim",
                                      output_files=["work/s"], save_as_artifacts=True))
    assert victim.artifact_files
    other_library = shared_dir / "other-team-library"
    other_library.mkdir()
    (other_library / "secret.txt").write_text(token)
    result = await runtime.run(run_in(
        f"ls -A $(dirname $WORKSPACE_DIR); ls {victim.stdout.strip()} {runtime.work_root}/.skillrun {other_library} "
        "/var/run/docker.sock /run/docker.sock 2>&1; "
        f"grep -rl {token} / --exclude-dir=proc --exclude-dir=sys --exclude-dir=usr 2>/dev/null; "
        "ls /proc | grep -c '^[0-9]'", workspace_id="attacker"))
    lines = result.stdout.splitlines()
    assert lines[0] == os.path.basename(runtime.workspaces.find("attacker").path)
    assert sum("No such file or directory" in line for line in lines) == 5
    assert not [line for line in lines if line.startswith("/")]  # the token is nowhere it can read
    assert int(lines[-1]) <= 6  # its own processes and the residents: no host's, no other container's


async def test_docker_scratch_a_run_locked_itself_out_of_is_emptied_and_the_container_kept(docker_runtime_factory, run_in):
    runtime = docker_runtime_factory()
    await runtime.run(run_in("mkdir -p /tmp/locked/deep; echo x > /tmp/locked/deep/f; chmod 000 /tmp/locked/deep /tmp/locked"))
    container = runtime.container_id("attacked")
    after = await runtime.run(run_in("ls -A /tmp"))
    assert "locked" not in after.stdout.split()
    assert runtime.container_id("attacked") == container  # emptied through the engine, not replaced
