"""Attacks on the Docker runtime's warm pool and its folder-keyed containers: what one workspace's run can reach of
a warm container or reserved folder another workspace takes later, whether a taken container is ever handed out
twice (one runtime, two runtimes on one work root), whether reserved folders, user ids, disks, control folders or
containers leak (close, a crash, a failure mid-make, removal right after a take), whether another worker's
reaper removes what a live pool holds, and whether the pool stays bounded (size, churn)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from pathlib import Path

import docker.errors
import pytest

from tests.attacks.conftest import run_in  # noqa: F401 - shared fixture
from tests.conftest import write_skill
from tests.integration.conftest import docker_engine, docker_runtime_factory  # noqa: F401 - shared fixtures
from worker.contract import RunRequest, SkillRef
from worker.runtimes.docker.boxes import LABEL, WARM_LABEL
from worker.runtimes.docker.launch import EXECUTOR_LABEL
from worker.workspaces.manager import METADATA_FILE, RESERVED_PREFIX

pytestmark = pytest.mark.docker


def _request(library: Path, workspace_id: str, command: str = "echo hi", **fields) -> RunRequest:
    return RunRequest(skill=SkillRef(name="demo", root=str(library), path="demo"), command=command,
                      workspace_id=workspace_id, **fields)


def _labelled(engine, runtime) -> list:
    return engine.client.containers.list(all=True, ignore_removed=True, filters={"label": [
        f"skillrun.work_root={runtime.work_root.resolve()}"]})


def _warm(engine, runtime) -> list:
    return [c for c in _labelled(engine, runtime) if WARM_LABEL in c.labels]


def _untaken(engine, runtime) -> list:
    """Warm containers no workspace took (their folder has no workspace laid out)."""
    return [c for c in _warm(engine, runtime)
            if not (runtime.work_root / c.labels[LABEL] / METADATA_FILE).exists()]


def _reserved_unused(runtime) -> list[Path]:
    return sorted(p for p in runtime.work_root.iterdir()
                  if p.name.startswith(RESERVED_PREFIX) and not (p / METADATA_FILE).exists())


def _uid_held_by(runtime, folder: Path) -> bool:
    registry = runtime.workspaces.user_ids.path
    for entry in registry.iterdir():
        if entry.is_symlink() and os.readlink(entry) == str(folder):
            return True
    return False


def _libraries(shared_dir: Path, count: int) -> list[Path]:
    roots = []
    for i in range(count):
        root = shared_dir / f"lib-{i}"
        write_skill(root, "demo")
        roots.append(root)
    return roots


async def _filled(runtime, library: Path, first: str = "first") -> None:
    """Run a first new workspace (it sets the template) and wait for the pool to fill."""
    result = await runtime.run(_request(library, first))
    assert result.exit_code == 0, result
    await runtime.idle()


# ---------------------------------------------------------------------------------------------------------------
# What a run can reach of warm containers and reserved folders
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.root
async def test_a_run_cannot_see_or_reach_warm_containers_or_reserved_folders(docker_runtime_factory, docker_engine,
                                                                            library):
    runtime = docker_runtime_factory(pool_size=2)
    try:
        await _filled(runtime, library)
        warm = _untaken(docker_engine, runtime)
        assert len(warm) == 2
        folders = [str(runtime.work_root / c.labels[LABEL]) for c in warm]
        probe = "; ".join([
            'echo "PARENT:$(ls -A "$(dirname "$WORKSPACE_DIR")" | tr "\\n" " ")"',
            *(f'echo "SEE:$(ls -A {f} 2>&1 | head -1)"; echo "PLANT:$(touch {f}/planted 2>&1 | head -1)"'
              for f in folders),
            "echo \"PROCS:$(ps -eo args | grep -c '[e]xecutor.py')\"",
        ])
        result = await runtime.run(_request(library, "first", probe))  # an existing workspace: takes none
        assert result.exit_code == 0, result
        lines = dict.fromkeys(result.stdout.splitlines())
        mine = runtime.workspaces.find("first").path.name
        said = [line.split(":", 1) for line in lines]
        # The parent of its workspace shows nothing but its own folder; the warm folders do not exist in its view.
        assert [v.split() for k, v in said if k == "PARENT"] == [[mine]], result.stdout
        assert all("No such file or directory" in v for k, v in said if k in ("SEE", "PLANT")), result.stdout
        assert [v for k, v in said if k == "PROCS"] == ["1"], result.stdout  # its own executor, no other
        for folder in folders:
            assert os.listdir(folder) == []
    finally:
        await runtime.close()


@pytest.mark.root
async def test_a_run_leaves_nothing_for_the_workspace_that_takes_the_next_warm_container(
        docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=1)
    try:
        await _filled(runtime, library, "planter")
        (warm,) = _untaken(docker_engine, runtime)
        plant = ("echo x > /tmp/planted; echo x > /dev/shm/planted; echo x > $WORK_DIR/planted; "
                 "(sleep 1000 >/dev/null 2>&1 &); id -u")
        planter = await runtime.run(_request(library, "planter", plant))
        taker = await runtime.run(_request(library, "taker",
                                           "ls -A /tmp /dev/shm $WORK_DIR; ps -eo args | grep -c '[s]leep 1000'; id -u"))
        assert runtime.container_id("taker") == warm.id
        assert "planted" not in taker.stdout and taker.stdout.split()[-2] == "0", taker.stdout
        assert taker.stdout.split()[-1] != planter.stdout.split()[-1]  # its own user, not the planter's
    finally:
        await runtime.close()


@pytest.mark.root
async def test_a_taken_warm_container_shows_no_library_but_the_one_its_first_run_uses(
        docker_runtime_factory, docker_engine, shared_dir):
    first, second = _libraries(shared_dir, 2)
    runtime = docker_runtime_factory(pool_size=2)
    try:
        await _filled(runtime, first)
        # New workspaces of the other library: take no warm container made for the first; asked for twice, the
        # other library becomes the pool's.
        for name in ("other", "other-2"):
            other = await runtime.run(_request(second, name, f"ls {first} 2>&1 | tail -1"))
            assert "No such file or directory" in other.stdout
        await runtime.idle()
        for container in _untaken(docker_engine, runtime):
            mounts = {m["Destination"] for m in docker_engine.client.api.inspect_container(container.id)["Mounts"]}
            assert str(first.resolve()) not in mounts  # the pool dropped the first's for the second's
        again = await runtime.run(_request(first, "again", f"ls {second} 2>&1 | tail -1"))
        assert "No such file or directory" in again.stdout
    finally:
        await runtime.close()


# ---------------------------------------------------------------------------------------------------------------
# A taken container is never handed out twice
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.root
async def test_two_first_runs_of_one_new_workspace_at_once_share_one_folder_and_give_the_other_back(
        docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=2)
    try:
        await _filled(runtime, library)
        before = {c.labels[LABEL] for c in _untaken(docker_engine, runtime)}
        results = await asyncio.gather(*(runtime.run(_request(library, "twin", "echo $WORKSPACE_DIR; id -u"))
                                         for _ in range(2)))
        assert [r.exit_code for r in results] == [0, 0], results
        assert len({r.stdout for r in results}) == 1  # one folder, one user
        workspace = runtime.workspaces.find("twin")
        assert results[0].stdout.split()[0] == str(workspace.path)
        await runtime.idle()
        untaken = {c.labels[LABEL] for c in _untaken(docker_engine, runtime)}
        names = {workspace.path.name, runtime.workspaces.find("first").path.name}
        # Every warm-labelled container is the pool's or the twin's; the other reservation taken went back.
        assert all(c.labels[LABEL] in names | untaken for c in _warm(docker_engine, runtime))
        for name in before - names - untaken:
            folder = runtime.work_root / name
            assert not folder.exists() and not _uid_held_by(runtime, folder)
        assert len(untaken) <= 2 and len(_reserved_unused(runtime)) == len(untaken)
    finally:
        await runtime.close()


@pytest.mark.root
async def test_two_workers_on_one_work_root_taking_at_once_for_one_new_workspace_share_it(
        docker_runtime_factory, docker_engine, library):
    one = docker_runtime_factory(pool_size=1)
    two = type(one)(one.work_root, client=docker_engine.client, pool_size=1)
    try:
        await _filled(one, library, "first-one")
        await _filled(two, library, "first-two")
        results = await asyncio.gather(one.run(_request(library, "contested", "echo $WORKSPACE_DIR; id -u")),
                                       two.run(_request(library, "contested", "echo $WORKSPACE_DIR; id -u")))
        assert [r.exit_code for r in results] == [0, 0], results
        assert results[0].stdout == results[1].stdout  # one workspace, one folder, one user
        await one.idle()
        await two.idle()
        folder = one.workspaces.find("contested").path.name
        # Exactly one container of the workspace's folder; no warm container serves two folders.
        holders = [c for c in _labelled(docker_engine, one) if c.labels[LABEL] == folder]
        assert len(holders) == 1, holders
        assert len(_reserved_unused(one)) == len(_untaken(docker_engine, one)) <= 2
    finally:
        await two.close()
        await one.close()


@pytest.mark.root
async def test_a_workspace_id_shaped_like_a_reserved_folder_gets_its_own_folder_and_container(
        docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=1)
    try:
        await _filled(runtime, library)
        (warm,) = _untaken(docker_engine, runtime)
        folder = warm.labels[LABEL]
        lookalike = folder.removeprefix("ws_")  # its folder is ws_<id>_<time>: the warm one's name and more
        # Made without the pool (a network run, refused after its workspace is made): its own folder.
        with contextlib.suppress(Exception):
            await runtime.run(_request(library, lookalike, "true", network=True))
        path = runtime.workspaces.find(lookalike).path
        assert path.name != folder and path.name.startswith(folder + "_")
        assert runtime.pool.holds(folder) and _untaken(docker_engine, runtime)[0].id == warm.id
        mine = await runtime.run(_request(library, lookalike, "echo $WORKSPACE_DIR"))
        taker = await runtime.run(_request(library, "taker", "echo $WORKSPACE_DIR"))
        assert (mine.stdout, taker.stdout) == (f"{path}\n", f"{runtime.work_root / folder}\n")
        assert runtime.container_id("taker") == warm.id != runtime.container_id(lookalike)
        assert runtime.workspaces.find(lookalike).path == path  # the taker did not touch it
    finally:
        await runtime.close()


# ---------------------------------------------------------------------------------------------------------------
# Removal and leaks
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.root
async def test_removing_a_pooled_workspace_right_after_its_take_removes_container_folder_uid_turn_and_control(
        docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=1)
    try:
        await _filled(runtime, library)
        (warm,) = _untaken(docker_engine, runtime)
        result = await runtime.run(_request(library, "brief"))
        assert runtime.container_id("brief") == warm.id
        folder = runtime.workspaces.find("brief").path
        control = Path(warm.labels[EXECUTOR_LABEL])
        await runtime.end_workspace("brief")
        assert result.exit_code == 0
        assert not docker_engine.client.containers.list(all=True, filters={"id": warm.id})
        assert not folder.exists() and not _uid_held_by(runtime, folder)
        assert not (runtime.boxes.turns / folder.name).exists() and not control.exists()
        assert runtime.workspaces.find("brief") is None
    finally:
        await runtime.close()


@pytest.mark.root
async def test_a_pool_with_workspace_disks_leaves_no_mount_or_disk_image_after_remove_and_close(
        docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=2, disk_bytes=8 * 1024 * 1024)
    try:
        await _filled(runtime, library)
        await runtime.run(_request(library, "disked", "df -P $WORKSPACE_DIR | tail -1"))
        await runtime.end_workspace("disked")
        await runtime.end_workspace("first")
    finally:
        await runtime.close()
    with open("/proc/self/mounts") as mounts:
        left = [line.split()[1] for line in mounts if line.split()[1].startswith(str(runtime.work_root) + "/")]
    assert left == []
    disks = runtime.workspaces.registry / "disks"
    assert not disks.exists() or os.listdir(disks) == []
    assert _warm(docker_engine, runtime) == [] and _reserved_unused(runtime) == []


@pytest.mark.root
async def test_a_failure_after_the_container_started_mid_make_leaves_nothing_once_reaped(
        docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=1, idle_seconds=2)
    start = runtime.boxes.launcher.start
    failed = []

    def start_then_fail(spec):
        made = start(spec)
        if WARM_LABEL in spec.labels and not failed:
            failed.append(spec.name)
            raise docker.errors.APIError("engine went away right after the start")
        return made

    runtime.boxes.launcher.start = start_then_fail
    try:
        await _filled(runtime, library)
        assert failed and runtime.pool.problem
        assert _reserved_unused(runtime) == []  # its folder was given back at once
        await asyncio.sleep(3)  # the orphan container is older than the idle time now
        await runtime.run(_request(library, "first", "true"))  # a run reaps
        orphans = [c for c in _labelled(docker_engine, runtime) if c.name == failed[0]]
        assert orphans == []
    finally:
        await runtime.close()


def _gate_make_warm(runtime, entered: threading.Event, go: threading.Event, done: threading.Event) -> None:
    make_warm = runtime.boxes.make_warm

    def slow_make_warm(*args, **kwargs):
        try:
            entered.set()
            go.wait(60)
            return make_warm(*args, **kwargs)
        finally:
            done.set()

    runtime.boxes.make_warm = slow_make_warm


@pytest.mark.root
async def test_closing_while_the_pool_makes_a_container_leaves_no_container_or_reserved_folder(
        docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=1)
    entered, go, done = threading.Event(), threading.Event(), threading.Event()
    _gate_make_warm(runtime, entered, go, done)
    await runtime.run(_request(library, "first"))
    assert await asyncio.to_thread(entered.wait, 60)  # the pool is making its first warm container
    closing = asyncio.create_task(runtime.close())
    await asyncio.sleep(0.5)
    go.set()
    await closing
    assert await asyncio.to_thread(done.wait, 60)
    assert _warm(docker_engine, runtime) == [] and _reserved_unused(runtime) == []


@pytest.mark.root
async def test_a_cancelled_close_while_the_pool_makes_a_container_leaves_no_container_or_reserved_folder(
        docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=1)
    entered, go, done = threading.Event(), threading.Event(), threading.Event()
    _gate_make_warm(runtime, entered, go, done)
    await runtime.run(_request(library, "first"))
    assert await asyncio.to_thread(entered.wait, 60)
    closing = asyncio.create_task(runtime.close())
    await asyncio.sleep(0.5)
    closing.cancel()  # the worker's shutdown gave up waiting
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    go.set()
    assert await asyncio.to_thread(done.wait, 60)
    await asyncio.sleep(1)  # the thread's result is dropped; nothing else will run for it
    leaked, folders = _untaken(docker_engine, runtime), _reserved_unused(runtime)
    assert leaked == [] and folders == []


@pytest.mark.root
async def test_a_take_racing_close_makes_no_warm_container_after_it(docker_runtime_factory, docker_engine, library):
    runtime = docker_runtime_factory(pool_size=1)
    await _filled(runtime, library)
    take = runtime.pool.take
    entered, go = threading.Event(), threading.Event()

    def late_take(template):
        entered.set()
        go.wait(60)
        return take(template)

    runtime.pool.take = late_take
    late = asyncio.create_task(runtime.run(_request(library, "late")))
    assert await asyncio.to_thread(entered.wait, 60)
    await runtime.close()
    go.set()
    await asyncio.gather(late, return_exceptions=True)
    await runtime.pool.wait_filled()
    leaked = _untaken(docker_engine, runtime)
    folders = _reserved_unused(runtime)
    await runtime.pool.close()  # clean up whatever leaked
    assert leaked == [] and folders == []


@pytest.mark.root
async def test_a_worker_that_died_mid_make_leaves_no_reserved_folder_or_uid(docker_runtime_factory, docker_engine,
                                                                           library):
    crashed = docker_runtime_factory(pool_size=1, idle_seconds=1)
    entered, go = threading.Event(), threading.Event()

    def dying_make_warm(reserved, *args, **kwargs):
        entered.set()
        go.wait(60)  # the worker "dies" here: nothing after this point runs for it
        raise RuntimeError("crashed")

    crashed.boxes.make_warm = dying_make_warm
    await crashed.run(_request(library, "first"))
    assert await asyncio.to_thread(entered.wait, 60)
    (orphan,) = _reserved_unused(crashed)
    crashed.pool._loop = None  # the worker is gone: its pool neither refills nor removes anything
    survivor = type(crashed)(crashed.work_root, client=docker_engine.client, idle_seconds=1)
    try:
        await asyncio.sleep(2.5)  # older than the survivor's idle time
        await survivor.run(_request(library, "survivor"))
        await survivor.run(_request(library, "survivor", "true"))
        still = orphan.exists() or _uid_held_by(survivor, orphan)
    finally:
        go.set()  # the "dead" thread ends (and gives its folder back as it unwinds)
        await survivor.close()
    assert not still


# ---------------------------------------------------------------------------------------------------------------
# Other workers' reapers
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.root
async def test_another_workers_reaper_leaves_a_live_pools_warm_containers(docker_runtime_factory, docker_engine,
                                                                           library):
    # The pool renews at half the idle time; the idle time leaves a renewal 2 s to make its container on a
    # loaded machine before the one it replaces comes of the reaper's age.
    owner = docker_runtime_factory(pool_size=1, idle_seconds=4)
    other = type(owner)(owner.work_root, client=docker_engine.client, idle_seconds=4)
    try:
        await _filled(owner, library)
        (warm,) = _untaken(docker_engine, owner)
        assert owner.pool.holds(warm.labels[LABEL])
        await asyncio.sleep(5)  # past the idle time: the live pool has renewed what it holds meanwhile
        await other.run(_request(library, "other-worker"))  # its reaper looks
        # A renewal makes the new container before it removes the old: whenever the reaper looked, one was held.
        held = [c for c in _untaken(docker_engine, owner) if owner.pool.holds(c.labels[LABEL])]
        assert len(held) == 1, "reaped under its live pool"
        assert held[0].id != warm.id, "not renewed"
        assert all(c.status == "running" and (owner.work_root / c.labels[LABEL]).is_dir() for c in held)
    finally:
        await other.close()
        await owner.close()


@pytest.mark.root
async def test_a_live_pool_whose_warm_containers_another_worker_reaped_still_runs_new_workspaces_in_their_own_folder(
        docker_runtime_factory, docker_engine, library):
    owner = docker_runtime_factory(pool_size=1, idle_seconds=2)
    other = type(owner)(owner.work_root, client=docker_engine.client, idle_seconds=2)
    try:
        await _filled(owner, library)
        (warm,) = _untaken(docker_engine, owner)
        gone = owner.work_root / warm.labels[LABEL]
        await asyncio.sleep(3)
        await other.run(_request(library, "other-worker"))
        result = await owner.run(_request(library, "after-reap", "echo $WORKSPACE_DIR; ls $WORKSPACE_DIR"))
        assert result.exit_code == 0, result
        assert result.stdout.split()[0] != str(gone) or gone.exists()
        assert owner.container_id("after-reap") != warm.id
        await owner.idle()
        assert len(_reserved_unused(owner)) == len(_untaken(docker_engine, owner)) <= 1
    finally:
        await other.close()
        await owner.close()


@pytest.mark.root
async def test_another_workers_reaper_never_removes_a_taken_container_a_run_is_in(
        docker_runtime_factory, docker_engine, library):
    owner = docker_runtime_factory(pool_size=1, idle_seconds=2)
    other = type(owner)(owner.work_root, client=docker_engine.client, idle_seconds=2)
    try:
        await _filled(owner, library)
        (warm,) = _untaken(docker_engine, owner)
        busy = asyncio.create_task(owner.run(_request(library, "busy", "sleep 6; echo survived")))
        await asyncio.sleep(4)  # the warm container is older than the idle time; the run holds its turn
        await other.run(_request(library, "reaper-a"))
        result = await busy
        assert (result.stdout, result.exit_code) == ("survived\n", 0), result
        assert owner.container_id("busy") == warm.id
    finally:
        await other.close()
        await owner.close()


# ---------------------------------------------------------------------------------------------------------------
# Bounds
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.root
async def test_the_pool_never_holds_more_than_its_size_with_alternating_templates_and_concurrent_takes(
        docker_runtime_factory, docker_engine, shared_dir):
    roots = _libraries(shared_dir, 2)
    runtime = docker_runtime_factory(pool_size=2)
    try:
        await _filled(runtime, roots[0])
        for i in range(4):
            await runtime.run(_request(roots[i % 2], f"alt-{i}"))
            await runtime.idle()
            assert len(_untaken(docker_engine, runtime)) <= 2
        results = await asyncio.gather(*(runtime.run(_request(roots[i % 2], f"burst-{i}")) for i in range(4)))
        assert all(r.exit_code == 0 for r in results)
        await runtime.idle()
        assert len(_untaken(docker_engine, runtime)) <= 2
        assert len(_reserved_unused(runtime)) == len(_untaken(docker_engine, runtime))
    finally:
        await runtime.close()
    assert _untaken(docker_engine, runtime) == [] and _reserved_unused(runtime) == []


@pytest.mark.root
async def test_a_flood_of_new_workspaces_with_different_libraries_does_not_multiply_container_churn(
        docker_runtime_factory, docker_engine, shared_dir):
    roots = _libraries(shared_dir, 4)
    runtime = docker_runtime_factory(pool_size=2)
    made = []
    make_warm = runtime.boxes.make_warm

    def counting(*args, **kwargs):
        made.append(args[1:])
        return make_warm(*args, **kwargs)

    runtime.boxes.make_warm = counting
    try:
        for i, root in enumerate(roots):
            await runtime.run(_request(root, f"flood-{i}"))
            await runtime.idle()
        # Not one warm container was taken; at most one container per new workspace is fair.
        assert len(made) <= len(roots), f"{len(made)} warm containers made for {len(roots)} new workspaces"
    finally:
        await runtime.close()


@pytest.mark.root
async def test_a_pool_whose_containers_cannot_be_handed_out_does_not_churn(docker_runtime_factory, docker_engine,
                                                                           library):
    runtime = docker_runtime_factory(pool_size=2)
    runtime.boxes.launcher._no_executor[runtime.image] = "test: this image runs no executor"
    made = []
    make_warm = runtime.boxes.make_warm

    def counting(*args, **kwargs):
        made.append(args[1])
        return make_warm(*args, **kwargs)

    runtime.boxes.make_warm = counting
    try:
        for i in range(3):
            result = await runtime.run(_request(library, f"plain-{i}"))
            assert result.exit_code == 0
            await runtime.idle()
        assert len(made) <= 2, f"{len(made)} warm containers made, none handed out"
    finally:
        await runtime.close()
