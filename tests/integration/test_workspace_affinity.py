"""Workspace affinity over a real Redis with real worker processes: two nodes (workers with work roots of their own,
as on two machines); a kept workspace's runs all go to the node it was placed on, a run taken by the wrong node is
forwarded, and a workspace whose node is gone is lost — refused, failed or forgotten, saying so."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from rq import Queue

from orchestrator.dispatch import QueueDispatcher, WorkspaceConflictError, stranded
from tests.integration.test_queue import repo  # noqa: F401 - fixtures
from tests.processes import WorkerProcesses
from worker.jobs import nodes
from worker.config import get_worker_settings
from worker.contract import RunRequest
from worker.run_store import RunStatus


@pytest.fixture
def two_nodes(shared_dir, redis_url):
    """Worker processes of two nodes: ``start("a")`` / ``start("b")``; each node's work root and node id."""
    roots = {name: shared_dir / f"node-{name}" for name in "ab"}
    groups = {}
    for name, root in roots.items():
        root.mkdir(mode=0o755)
        groups[name] = WorkerProcesses({"SKILLRUN_WORK_ROOT": str(root), "SKILLRUN_HEARTBEAT_TTL_SECONDS": "4",
                                        "SKILLRUN_ARTIFACTS_DIR": str(shared_dir / "artifacts")}, redis_url)
    ids = {name: nodes.node_id(root) for name, root in roots.items()}

    class Nodes:
        id = ids
        root = roots

        @staticmethod
        def start(name: str):
            return groups[name].start()

        @staticmethod
        def kill(name: str) -> None:
            for proc in groups[name].running():
                groups[name].kill(proc)

    get_worker_settings.cache_clear()
    yield Nodes
    for group in groups.values():
        group.stop()


def _request(repo, workspace_id: str, command: str) -> RunRequest:  # noqa: F811
    return RunRequest(skill=repo.skill_ref("python-math"), command=command, workspace_id=workspace_id, timeout=60)


async def _until_beating(dispatcher: QueueDispatcher, node: str) -> None:
    deadline = time.monotonic() + 60
    while node not in nodes.live_nodes(dispatcher.redis, "local"):
        assert time.monotonic() < deadline, f"node {node} never beat"
        await asyncio.sleep(0.05)


def _queue_key(node: str) -> str:
    return Queue.redis_queue_namespace_prefix + nodes.node_queue_name("local", node)


def _age(dispatcher: QueueDispatcher, node: str, seconds: float) -> None:
    """Make ``node``'s latest beat ``seconds`` old (its workers are gone)."""
    dispatcher.redis.zadd(nodes.nodes_key("local"), {node: time.time() - seconds})


async def test_a_kept_workspace_s_runs_all_go_to_its_node_and_see_its_files(redis_url, two_nodes, repo):  # noqa: F811
    dispatcher = QueueDispatcher(redis_url)
    for name in "ab":
        two_nodes.start(name)
        await _until_beating(dispatcher, two_nodes.id[name])
    records = []
    for i in range(6):
        record = await dispatcher.submit(_request(repo, "affine", f"echo {i} >> $WORK_DIR/log && cat $WORK_DIR/log"))
        records.append(await dispatcher.wait(record.id, 60))
    placed = dispatcher.store.workspaces.get("affine").node
    assert placed in two_nodes.id.values()
    assert {r.node for r in records} == {placed} and all(r.status == RunStatus.FINISHED for r in records)
    assert records[-1].result.stdout == "".join(f"{i}\n" for i in range(6))  # one work/ throughout
    other = next(name for name, node in two_nodes.id.items() if node != placed)
    assert not any(p.name == "affine" for p in two_nodes.root[other].rglob("affine"))
    one_off = await dispatcher.wait((await dispatcher.submit(
        RunRequest(skill=repo.skill_ref("python-math"), command="true"))).id, 60)
    assert one_off.status == RunStatus.FINISHED  # one-off runs take the shared queue, any node
    await dispatcher.close()


async def test_a_run_taken_by_the_wrong_node_is_forwarded_to_the_workspace_s_node(
        redis_url, two_nodes, repo):  # noqa: F811
    dispatcher = QueueDispatcher(redis_url)
    record = await dispatcher.submit(_request(repo, "raced", "echo here"))  # no node beats: the shared queue
    dispatcher.redis.zadd(nodes.nodes_key("local"), {two_nodes.id["b"]: time.time()})  # b is alive, not running yet
    assert dispatcher.store.workspaces.place("raced", two_nodes.id["b"]) == two_nodes.id["b"]  # b won the race
    two_nodes.start("a")  # a takes the run from the shared queue, and forwards it
    node_b_queue = dispatcher.redis.lrange(_queue_key(two_nodes.id["b"]), 0, -1)
    deadline = time.monotonic() + 60
    while not node_b_queue:
        assert time.monotonic() < deadline, "the run was never forwarded"
        await asyncio.sleep(0.05)
        node_b_queue = dispatcher.redis.lrange(_queue_key(two_nodes.id["b"]), 0, -1)
    assert [j.decode() for j in node_b_queue] == [f"{record.id}-1-f"]
    assert (await dispatcher.get(record.id)).status == RunStatus.QUEUED  # not started on a
    two_nodes.start("b")
    done = await dispatcher.wait(record.id, 60)
    assert done.status == RunStatus.FINISHED and done.node == two_nodes.id["b"] and done.attempts == 1
    await dispatcher.close()


async def test_a_workspace_whose_node_is_gone_is_lost_and_says_so(redis_url, two_nodes, repo, monkeypatch):  # noqa: F811
    monkeypatch.setattr(stranded, "STRANDED_SECONDS", 0.0)
    dispatcher = QueueDispatcher(redis_url)
    two_nodes.start("a")
    node = two_nodes.id["a"]
    await _until_beating(dispatcher, node)
    first = await dispatcher.wait((await dispatcher.submit(_request(repo, "doomed", "echo kept > $WORK_DIR/f"))).id, 60)
    assert first.status == RunStatus.FINISHED and first.node == node
    two_nodes.kill("a")
    queued = await dispatcher.submit(_request(repo, "doomed", "cat $WORK_DIR/f"))  # a's beat is still fresh
    _age(dispatcher, node, nodes.NODE_GONE_SECONDS + 1)
    with pytest.raises(WorkspaceConflictError, match="workspace_lost") as refused:
        await dispatcher.submit(_request(repo, "doomed", "cat $WORK_DIR/f"))
    assert node in str(refused.value) and "DELETE" in str(refused.value)
    assert dispatcher.requeue_stranded() == []  # the run queued on the gone node fails, saying why
    failed = await dispatcher.get(queued.id)
    assert failed.status == RunStatus.FAILED and failed.error.startswith("workspace_lost")
    assert await dispatcher.remove_workspace("doomed") == "removed"  # nothing to remove it: its entry goes
    assert dispatcher.store.workspaces.get("doomed") is None
    fresh = await dispatcher.submit(_request(repo, "doomed", "true"))  # a new workspace of the same name
    assert fresh.status == RunStatus.QUEUED
    await dispatcher.close()


async def test_nodes_gone_for_a_week_are_forgotten_with_their_queues(redis_url):
    dispatcher = QueueDispatcher(redis_url)
    dispatcher.redis.zadd(nodes.nodes_key("local"), {"0" * 16: time.time() - nodes.NODE_FORGET_SECONDS - 1,
                                                      "1" * 16: time.time()})
    dispatcher.redis.rpush(_queue_key("0" * 16), "job")
    await dispatcher.sweep_lost()
    assert [n.decode() for n in dispatcher.redis.zrange(nodes.nodes_key("local"), 0, -1)] == ["1" * 16]
    assert dispatcher.redis.exists(_queue_key("0" * 16)) == 0
    await dispatcher.close()


def test_a_work_root_keeps_one_node_id_however_many_workers_ask_at_once(tmp_path: Path):
    found: list[str] = []
    threads = [threading.Thread(target=lambda: found.append(nodes.node_id(tmp_path))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(found)) == 1 and nodes.NODE_ID.fullmatch(found[0])
    assert nodes.node_id(tmp_path) == found[0] and nodes.node_id(tmp_path / "other") != found[0]
    (tmp_path / ".skillrun" / nodes.NODE_FILE).write_text("not an id")
    with pytest.raises(RuntimeError, match="holds no node id"):
        nodes.node_id(tmp_path)
