"""The Docker runtime's in-container executor: runs reach the container without ``docker exec``, and every way it
can fail — killed, flooded, its container gone, an image without it, a lie about what a run left — ends in a
clear result and a working next run."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
from pathlib import Path

import pytest

from worker.contract import RunLimits, RunRequest, SkillRef
from worker.runtimes.docker import executor_confine
from worker.runtimes.docker import executor_inside
from worker.runtimes.docker.executor import ExecutorFiles
from worker.runtimes.docker.launch import container_limits

pytestmark = pytest.mark.docker

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
SKILL = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")
NO_PYTHON_IMAGE = "skillrun/test-no-python:latest"


def _request(command: str, **fields) -> RunRequest:
    fields.setdefault("workspace_id", "exec")
    return RunRequest(skill=SKILL, command=command, **fields)


def _execs_in(docker_engine, container_id: str, since: float) -> int:
    """``docker exec`` calls into the container since ``since`` (the engine's own events)."""
    events = docker_engine.client.events(since=int(since), until=int(time.time()) + 1, decode=True,
                                         filters={"container": container_id, "event": "exec_create"})
    return sum(1 for _ in events)


def _running(docker_engine, container_id: str, marker: str) -> bool:
    return any(marker in " ".join(p) for p in docker_engine.client.api.top(container_id)["Processes"])


async def test_runs_reach_the_container_through_its_executor_not_docker_exec(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory()
    first = await runtime.run(_request("echo first"))
    container = runtime.container_id("exec")
    since = time.time() - 1
    results = [await runtime.run(_request(f"echo run {i}; sleep 0.01 & exit {i}")) for i in range(5)]
    assert [(r.stdout, r.exit_code, r.timings.exec_via) for r in results] == [
        (f"run {i}\n", i, "executor") for i in range(5)]
    assert first.timings.exec_via == "executor" and runtime.container_id("exec") == container
    assert _execs_in(docker_engine, container, since) == 0


@pytest.mark.parametrize("oci_runtime", ["runc", "runsc"])
async def test_a_command_of_another_user_than_the_executor_may_open_its_standard_streams_again(
        docker_runtime_factory, docker_engine, oci_runtime):
    """The executor makes a command's pipes as the workspace's user (whom ``/dev/stdout`` and ``/dev/stderr``, opened
    again, are checked against; so is ``/dev/stdin`` when a shell reads its script), in a new shell and a ready one."""
    if oci_runtime != "runc":
        docker_engine.require_runtime(oci_runtime)
    runtime = docker_runtime_factory(oci_runtime=oci_runtime)
    command = "echo out > /dev/stdout; echo err > /dev/stderr; stat -L -c %u /proc/$$/fd/1 | tr -d '\\n'"
    results = [await runtime.run(_request(command)) for _ in range(2)]
    uid = str(runtime.workspaces.find("exec").uid)
    assert [(r.stdout, r.stderr, r.exit_code) for r in results] == [(f"out\n{uid}", "err\n", 0)] * 2, results


async def test_an_image_without_python3_falls_back_to_docker_exec_and_says_why(docker_runtime_factory, docker_engine):
    dockerfile = b"FROM skillrun/sandbox:latest\nUSER 0\nRUN rm -f /usr/bin/python3*\nUSER 65533:65533\n"
    docker_engine.client.images.build(fileobj=io.BytesIO(dockerfile), tag=NO_PYTHON_IMAGE, rm=True)
    try:
        runtime = docker_runtime_factory(image=NO_PYTHON_IMAGE)
        first = await runtime.run(_request("echo works; sleep 30 & true"))
        second = await runtime.run(_request("ps -eo args= | grep -c '^sleep 30$' || true"))
        assert first.stdout == "works\n" and second.stdout == "0\n"  # the run's leftovers ended through the engine
        for result in (first, second):
            assert result.timings.exec_via.startswith("docker exec (the executor could not start"), result.timings
            assert "python3" in result.timings.exec_via
    finally:
        for container in docker_engine.client.containers.list(all=True, filters={"ancestor": NO_PYTHON_IMAGE}):
            container.remove(force=True)
        docker_engine.client.images.remove(NO_PYTHON_IMAGE, force=True)


@pytest.mark.root
async def test_a_run_whose_executor_dies_reports_it_and_the_next_run_gets_a_new_container(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory()
    await runtime.run(_request("true"))
    container = runtime.container_id("exec")
    task = asyncio.create_task(runtime.run(_request("echo started; sleep 30", timeout=60)))
    for _ in range(400):
        if _running(docker_engine, container, "sleep 30"):
            break
        await asyncio.sleep(0.025)
    os.kill(docker_engine.client.api.inspect_container(container)["State"]["Pid"], signal.SIGKILL)  # from the host
    lost = await task
    assert lost.exit_code == 137 and "executor closed the connection" in lost.stderr
    assert "its next run gets a new one" in lost.stderr and lost.stdout == "started\n"
    after = await runtime.run(_request("echo fine"))
    assert (after.stdout, after.timings.exec_via) == ("fine\n", "executor")
    assert runtime.container_id("exec") not in (None, container)


async def test_a_flood_is_capped_and_the_executor_stays_responsive(docker_runtime_factory):
    runtime = docker_runtime_factory()
    limits = RunLimits(stdout_bytes=64 * 1024, stderr_bytes=1024)
    endless = await runtime.run(_request("yes flood; echo unreachable", timeout=2, limits=limits))
    assert endless.timed_out and endless.exit_code == 124 and endless.stdout_truncated
    kept, marker = endless.stdout.split("\n[skillrun: output truncated here; ", 1)
    assert len(kept.encode()) == 64 * 1024 and kept == ("flood\n" * 11000)[: 64 * 1024] and "more bytes were not kept" in marker
    finite = await runtime.run(_request("head -c 30000000 /dev/zero | tr '\\0' x; echo done >&2", limits=limits))
    assert finite.exit_code == 0 and finite.stderr == "done\n" and finite.stdout_truncated
    assert finite.stdout.startswith("x" * 64 * 1024 + "\n[skillrun: output truncated here; ")
    assert f"{30_000_000 - 64 * 1024} more bytes" in finite.stdout
    assert (await runtime.run(_request("echo still here"))).stdout == "still here\n"


async def test_a_container_that_died_between_runs_is_made_again(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory()
    await runtime.run(_request("echo kept > $WORK_DIR/k"))
    container = runtime.container_id("exec")
    docker_engine.client.api.kill(container)
    after = await runtime.run(_request("cat $WORK_DIR/k"))
    assert (after.stdout, after.exit_code, after.timings.exec_via) == ("kept\n", 0, "executor")
    assert runtime.container_id("exec") not in (None, container)


@pytest.mark.root
async def test_what_the_executor_says_a_run_left_is_checked_from_the_host(docker_runtime_factory, docker_engine):
    """An executor that kills nothing and says the container is clean (as one a command had taken over might):
    the worker sees the run's processes from the host and ends them through the engine."""
    confining = Path(executor_confine.__file__).read_text()
    lying_confine = confining.replace("def kill_all() -> None:",
                                      "def kill_all() -> None:\n    return\n\n\ndef _unused() -> None:")
    executor = Path(executor_inside.__file__).read_text()
    lying = executor.replace('"clean": confine.clean_up(self.uid, self.gid, run.scrub)', '"clean": True')
    assert lying_confine.count("return\n\n\ndef _unused") == 1 and '"clean": True' in lying
    runtime = docker_runtime_factory()
    files = ExecutorFiles(runtime.boxes.executors.folder.parent,
                          sources={"executor.py": lying.encode(), "executor_confine.py": lying_confine.encode()})
    runtime.boxes.executors = runtime.boxes.launcher.executors = files
    result = await runtime.run(_request("setsid sleep 1003 >/dev/null 2>&1 & echo left > /tmp/left; echo ok"))
    assert result.stdout == "ok\n" and result.timings.exec_via == "executor"
    container = runtime.container_id("exec")
    assert not _running(docker_engine, container, "sleep 1003")
    after = await runtime.run(_request("ls -A /tmp"))
    assert "left" not in after.stdout.split() and runtime.container_id("exec") == container


@pytest.mark.parametrize("oci_runtime", ["runc", "runsc"])
async def test_a_later_run_with_other_limits_gets_them_where_the_engine_cannot_update_them(
        docker_runtime_factory, docker_engine, oci_runtime):
    """gVisor's containers cannot have their limits changed while they run: the container is made again."""
    if oci_runtime != "runc":
        docker_engine.require_runtime(oci_runtime)
    runtime = docker_runtime_factory(oci_runtime=oci_runtime)
    await runtime.run(_request("echo kept > $WORK_DIR/k"))
    tight = await runtime.run(_request("cat $WORK_DIR/k; ulimit -u", limits=RunLimits(memory_bytes=256 * 1024**2,
                                                                                        processes=32)))
    assert (tight.exit_code, tight.timings.exec_via) == (0, "executor"), tight.stderr
    kept, processes = tight.stdout.split()
    config = docker_engine.client.api.inspect_container(runtime.container_id("exec"))["HostConfig"]
    if oci_runtime == "runc":  # the container's control group holds the run's count
        assert (config["Memory"], config["PidsLimit"]) == container_limits((256 * 1024**2, 32), executor=True)
    else:  # gVisor's counts the sandbox's threads: the run's count is a ulimit of the workspace's user
        assert (config["Memory"], config["PidsLimit"]) == container_limits((256 * 1024**2, 1024), executor=True)
        assert processes == str(32)  # the workspace's user's: the executor is another
    assert kept == "kept"
