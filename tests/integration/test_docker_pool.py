"""The Docker runtime's warm pool: new workspaces take containers made ahead; a warm container runs nothing but its
executor and holds nothing until taken, serves one workspace, fits only its own template, is replaced when it
died, and is removed (with its reserved folder) when its worker is gone or closes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import write_skill
from worker import defaults
from worker.config import get_worker_settings
from worker.contract import RunRequest, SkillRef
from worker.runtimes import resolve_runtime
from worker.runtimes.docker.runtime import ContainerWorkspaceRuntime
from worker.runtimes.docker.boxes import WARM_LABEL
from worker.runtimes.docker.host import RESIDENT_UID
from worker.runtimes.docker.engine import engine_time
from worker.workspaces.manager import RESERVED_PREFIX

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
LIBRARY = REPO / "skills"
SKILL = SkillRef(name="python-math", root=str(LIBRARY), path="python-math")


def _request(workspace_id: str, command: str = "echo hi", skill: SkillRef = SKILL) -> RunRequest:
    return RunRequest(skill=skill, command=command, workspace_id=workspace_id)


def _warm(docker_engine, runtime) -> list:
    return docker_engine.client.containers.list(all=True, filters={"label": [
        WARM_LABEL, f"skillrun.work_root={runtime.work_root.resolve()}"]})


async def test_new_workspaces_take_warm_containers_and_the_pool_refills(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory(pool_size=2)
    first = await runtime.run(_request("first"))  # no template yet: made the usual way; the pool fills after it
    await runtime.idle()
    warm = {c.id for c in _warm(docker_engine, runtime)}
    assert first.stdout == "hi\n" and len(warm) == 2
    taken, asked = [], []
    for i in range(3):
        asked.append(time.time())
        result = await runtime.run(_request(f"new-{i}", "echo hi; id -u; ls $WORKSPACE_DIR"))
        lines = result.stdout.split()
        assert lines[0] == "hi" and 30000 <= int(lines[1]) < 60000, result
        assert lines[2:] == ["metadata.json", "out", "runs", "skills", "work"]
        taken.append(runtime.container_id(f"new-{i}"))
        await runtime.idle()
        assert len(_warm(docker_engine, runtime)) == 2 + i + 1  # the taken ones keep their label; the pool refilled
    assert taken[:2] == [c for c in taken[:2] if c in warm] and len(set(taken)) == 3
    assert len({runtime.workspaces.find(f"new-{i}").path for i in range(3)}) == 3
    assert all(runtime.workspaces.find(f"new-{i}").path.name.startswith(RESERVED_PREFIX) for i in range(3))
    # Each run's container was made (by the pool) before the run was asked for.
    created = [engine_time(docker_engine.client.api.inspect_container(c)["Created"]) for c in taken]
    assert all(made < at for made, at in zip(created, asked)), (created, asked)


async def test_nothing_runs_in_a_warm_container_and_it_holds_nothing_until_taken(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory(pool_size=2)
    await runtime.run(_request("first"))
    await runtime.idle()
    for container in _warm(docker_engine, runtime):
        top = docker_engine.client.api.top(container.id, ps_args="-eo pid,args")["Processes"]
        assert [" ".join(p[1:]) for p in top] == [f"python3 -I -S /.skillrun/program/executor.py "
                                                  f"{container.labels[WARM_LABEL]}:{container.labels[WARM_LABEL]} "
                                                  f"{RESIDENT_UID}:{RESIDENT_UID}"]
        folder = runtime.work_root / container.labels["skillrun.workspace"]
        assert os.listdir(folder) == [] and (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (0, 0o700)
        mounts = {m["Destination"]: m["RW"] for m in docker_engine.client.api.inspect_container(container.id)["Mounts"]}
        assert mounts == {str(folder): True, defaults.SANDBOX_WORKSPACE_ALIAS: True, str(LIBRARY.resolve()): False,
                          "/.skillrun/control": True, "/.skillrun/program": False}
        events = docker_engine.client.events(since=int(time.time()) - 120, until=int(time.time()) + 1, decode=True,
                                             filters={"container": container.id, "event": "exec_create"})
        assert sum(1 for _ in events) == 0  # nothing was ever executed in it through the engine


async def test_a_warm_container_is_taken_only_for_its_own_library_and_serves_one_workspace(
        docker_runtime_factory, docker_engine, shared_dir):
    other_library = shared_dir / "other-lib"
    write_skill(other_library, "other")
    other = SkillRef(name="other", root=str(other_library), path="other")
    runtime = docker_runtime_factory(pool_size=1)
    await runtime.run(_request("first"))
    await runtime.idle()
    (warm,) = _warm(docker_engine, runtime)
    stranger = await runtime.run(_request("stranger", f"ls {LIBRARY} 2>&1 | tail -1", skill=other))
    assert runtime.container_id("stranger") != warm.id  # another library: the warm container is not its
    assert "No such file or directory" in stranger.stdout  # and it sees no library but its own
    await runtime.idle()  # one ask for another library does not make the pool drop what it holds
    mine = await runtime.run(_request("mine"))
    assert mine.stdout == "hi\n" and runtime.container_id("mine") == warm.id
    runtime.remove_workspace("mine")
    assert not docker_engine.client.containers.list(all=True, filters={"id": warm.id})  # it went with its workspace
    for name in ("stranger-2", "stranger-3"):  # asked for twice with no hit between: the pool fills for it
        await runtime.run(_request(name, skill=other))
    await runtime.idle()
    (for_other,) = [c for c in _warm(docker_engine, runtime)
                    if c.id not in {runtime.container_id(w) for w in ("mine", "stranger-2", "stranger-3")}]
    mounts = {m["Destination"] for m in docker_engine.client.api.inspect_container(for_other.id)["Mounts"]}
    assert str(other_library.resolve()) in mounts and str(LIBRARY.resolve()) not in mounts


async def test_pool_size_zero_makes_no_warm_container(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory()
    for i in range(2):
        await runtime.run(_request(f"w{i}"))
        await runtime.idle()
    assert _warm(docker_engine, runtime) == [] and runtime.pool is None


async def test_warm_containers_that_died_are_replaced_and_a_new_workspace_still_runs(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory(pool_size=2)
    await runtime.run(_request("first"))
    await runtime.idle()
    dead = _warm(docker_engine, runtime)
    for container in dead:  # as an engine restart leaves them: stopped
        docker_engine.client.api.kill(container.id)
    result = await runtime.run(_request("after"))
    assert (result.stdout, result.exit_code, result.timings.exec_via) == ("hi\n", 0, "executor")
    await runtime.idle()
    alive = _warm(docker_engine, runtime)
    assert {c.id for c in alive}.isdisjoint(c.id for c in dead)
    assert [c.status for c in alive].count("running") >= 2
    for container in dead:  # the dead ones went, with their reserved folders
        assert not (runtime.work_root / container.labels["skillrun.workspace"]).exists()


async def test_closing_a_runtime_removes_its_warm_containers_and_reserved_folders(docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory(pool_size=2)
    await runtime.run(_request("first"))
    await runtime.idle()
    folders = [runtime.work_root / c.labels["skillrun.workspace"] for c in _warm(docker_engine, runtime)]
    assert len(folders) == 2
    await runtime.close()
    assert _warm(docker_engine, runtime) == []
    assert not any(folder.exists() for folder in folders)


async def test_a_gone_workers_warm_containers_are_reaped_with_their_folders_and_user_ids(
        docker_runtime_factory, docker_engine, work_root):
    crashed = docker_runtime_factory(pool_size=2)
    await crashed.run(_request("first"))
    await crashed.idle()
    left = _warm(docker_engine, crashed)
    folders = [crashed.work_root / c.labels["skillrun.workspace"] for c in left]
    uids = [int(c.labels[WARM_LABEL]) for c in left]
    crashed.pool = None  # the worker is gone: nobody renews or removes what its pool held
    survivor = ContainerWorkspaceRuntime(crashed.work_root, client=docker_engine.client, idle_seconds=1)
    try:
        await asyncio.sleep(2.5)  # older than the survivor's idle time
        await survivor.run(_request("survivor"))
        assert _warm(docker_engine, crashed) == []
        assert not any(folder.exists() for folder in folders)
        registry = survivor.workspaces.user_ids.path
        assert not any((registry / str(uid)).exists() for uid in uids)
    finally:
        await survivor.close()


async def test_an_engine_restart_under_a_worker_ends_its_runs_clearly_and_the_pool_is_rebuilt(
        docker_runtime_factory, docker_engine):
    runtime = docker_runtime_factory(pool_size=2)
    await runtime.run(_request("first"))
    await runtime.idle()
    before = {c.id for c in _warm(docker_engine, runtime)}
    busy = asyncio.create_task(runtime.run(_request("first", "echo started; sleep 60")))
    await asyncio.sleep(1)
    await asyncio.to_thread(docker_engine.restart)
    lost = await busy
    assert lost.exit_code == 137 and lost.stdout == "started\n" and "executor closed the connection" in lost.stderr
    again = await runtime.run(_request("first", "echo back"))  # its container ended with the engine: made again
    fresh = await runtime.run(_request("fresh"))  # the warm containers ended too: not handed out
    assert (again.stdout, fresh.stdout, fresh.timings.exec_via) == ("back\n", "hi\n", "executor")
    await runtime.idle()
    rebuilt = [c for c in _warm(docker_engine, runtime) if c.status == "running" and c.id not in before]
    assert len(rebuilt) >= 2


@pytest.mark.parametrize("oci_runtime", ["runc", "runsc"])
async def test_a_default_first_run_takes_its_warm_container_as_it_is(docker_runtime_factory, docker_engine, oci_runtime):
    """A warm container has the limits a run with default limits gets, so taking it needs no change (gVisor's
    engine cannot change a running container's limits: the container would be made again)."""
    if oci_runtime != "runc":
        docker_engine.require_runtime(oci_runtime)
    runtime = docker_runtime_factory(pool_size=1, oci_runtime=oci_runtime)
    await runtime.run(_request("first"))
    await runtime.idle()
    (warm,) = _warm(docker_engine, runtime)
    result = await runtime.run(_request("second"))
    assert result.stdout == "hi\n" and runtime.container_id("second") == warm.id


async def test_a_worker_that_stops_removes_its_warm_containers(docker_engine, redis_url, work_root):
    """A worker process (here one that stops once the queue is empty) closes its runtimes as it stops: its pool's
    warm containers and reserved folders go with it."""
    from orchestrator.dispatch import QueueDispatcher

    root = work_root / "stopping-worker"
    dispatcher = QueueDispatcher(redis_url)
    try:
        ids = [(await dispatcher.submit(RunRequest(skill=SKILL, command="echo hi", runtime="docker",
                                                    workspace_id=f"kept-{i}", keep_workspace=True))).id
               for i in range(3)]
        env = {**os.environ, "SKILLRUN_WORK_ROOT": str(root), "SKILLRUN_DOCKER_POOL_SIZE": "2"}
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "worker", "--redis-url", redis_url,
                                                        "--burst", "--runtime", "docker"],
                                       env=env, cwd=REPO, timeout=300, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        for run_id in ids:
            assert (await dispatcher.get(run_id)).result.stdout == "hi\n"
    finally:
        await dispatcher.close()
    left = docker_engine.client.containers.list(all=True, filters={"label": f"skillrun.work_root={root.resolve()}"})
    assert left == []
    assert not [p for p in root.iterdir() if p.name.startswith(RESERVED_PREFIX)
                and not (p / "metadata.json").exists()]


async def test_a_runtime_by_name_keeps_the_workers_warm_pool_and_its_first_new_workspace_takes_one(
        docker_runtime_factory, docker_engine, work_root, monkeypatch):
    monkeypatch.delenv("SKILLRUN_DOCKER_POOL_SIZE", raising=False)
    get_worker_settings.cache_clear()
    runtime = resolve_runtime("docker", work_root=work_root / "by-name", client=docker_engine.client)
    try:
        assert runtime.pool.size == get_worker_settings().docker_pool_size == 2 and _warm(docker_engine, runtime) == []
        await runtime.start(SKILL)  # the pool fills for the library now, before any run
        await runtime.idle()
        warm = {c.id for c in _warm(docker_engine, runtime)}
        assert len(warm) == 2
        first = await runtime.run(_request("brand-new"))  # the runtime's first run, in a new workspace
        assert first.stdout == "hi\n" and runtime.container_id("brand-new") in warm
        await runtime.idle()
        assert len(_warm(docker_engine, runtime)) == 3  # the taken one keeps its label; the pool refilled
        taken = runtime.workspaces.find("brand-new").path
    finally:
        await runtime.close()
        get_worker_settings.cache_clear()
    assert _warm(docker_engine, runtime) == []  # close removed the pool's containers (and the taken one's)
    assert [p for p in runtime.work_root.iterdir() if p.name.startswith(RESERVED_PREFIX)] == [taken]


async def test_a_runtime_by_name_used_as_a_context_manager_removes_its_pool_on_exit(docker_engine, work_root,
                                                                                    docker_runtime_factory):
    async with resolve_runtime("docker", work_root=work_root / "ctx", client=docker_engine.client,
                               pool_size=1) as runtime:
        assert runtime.pool.size == 1  # the argument wins over the setting
        await runtime.run(_request("first"))  # no library named at start: the first run teaches the pool
        await runtime.idle()
        assert len(_warm(docker_engine, runtime)) == 1
    assert _warm(docker_engine, runtime) == []
