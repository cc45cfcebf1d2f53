"""Kept workspaces over a real Redis with real worker processes: removed by a worker of their runtime (asked through
the API, or idle), never while a run is in it, limited per owner, and their registry keys go with them."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import redis

from orchestrator.dispatch import QueueDispatcher, WorkspaceConflictError
from orchestrator.dispatch import queue as dispatch_queue
from orchestrator.documents import RedisDocuments
from tests.conftest import IS_ROOT, workspace_dirs
from tests.integration.test_queue import repo  # noqa: F401 - fixtures
from tests.orchestrator.api_helpers import client, make_services, new_team
from worker.artifacts import FileArtifactStore
from worker.config import get_worker_settings
from worker.contract import RunRequest
from worker.run_store import RunStatus


def workspace_keys(url: str) -> list[str]:
    connection = redis.Redis.from_url(url)
    try:
        return sorted(key.decode() for key in connection.keys("skillrun:workspace:*"))
    finally:
        connection.close()


def held_user_ids(work_root) -> list[str]:
    registry = get_worker_settings().uid_registry
    if not IS_ROOT and not os.access(registry, os.R_OK | os.X_OK):
        return []  # a normal account's workspaces take no user ids; the registry, root's, is absent or closed to it
    return [e.name for e in registry.iterdir() if e.is_symlink() and os.readlink(e).startswith(f"{work_root}/")]


async def eventually(check, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


@pytest.fixture
async def services(redis_url, shared_dir):
    built = make_services(QueueDispatcher(redis_url), FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data",
                          documents=RedisDocuments(redis_url))
    yield built
    await built.close()


async def submit(api, workspace_id: str, command: str = "true") -> str:
    answer = await api.post("/v1/runs", json={"skill": "python-math", "command": command, "workspace_id": workspace_id,
                                              "timeout": 60})
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


async def test_a_removal_asked_through_the_api_is_done_by_a_worker_and_refused_while_a_run_is_in_it(
    services, workers, redis_url, work_root
):
    workers.start()
    async with client(services, new_team(services, "team-a")) as a, client(services, new_team(services, "team-b")) as b:
        for api, name in ((a, "w1"), (b, "w1")):
            run_id = await submit(api, name)
            assert (await api.get(f"/v1/runs/{run_id}", params={"wait": 60})).json()["status"] == "finished"
        busy = await submit(a, "busy", "sleep 60")
        await eventually(lambda: _status_is(a, busy, "started"), "the busy run never started")
        assert [w["id"] for w in (await a.get("/v1/workspaces")).json()["data"]] == ["team-a.w1", "team-a.busy"]
        assert (await b.delete("/v1/workspaces/team-a.w1")).status_code == 404

        refused = await a.delete("/v1/workspaces/team-a.busy")
        assert refused.status_code == 409 and busy in refused.json()["detail"]
        handed = await a.delete("/v1/workspaces/team-a.w1")
        assert handed.status_code == 202 and handed.json()["state"] == "removing"
        again = await a.post("/v1/runs", json={"skill": "python-math", "command": "true", "workspace_id": "w1"})
        assert again.status_code in (202, 409)  # refused while being removed; accepted once it is gone
        if again.status_code == 409:
            assert "being removed" in again.json()["detail"]
        else:
            await a.get(f"/v1/runs/{again.json()['id']}", params={"wait": 60})
        await a.post(f"/v1/runs/{busy}/cancel")
        assert (await a.get(f"/v1/runs/{busy}", params={"wait": 30})).json()["status"] == "cancelled"
        assert (await a.delete("/v1/workspaces/team-a.busy")).status_code == 202
        await eventually(lambda: _gone(a, "team-a.busy"), "a worker never removed the workspace")
        if again.status_code == 409:
            await eventually(lambda: _gone(a, "team-a.w1"), "a worker never removed the workspace")
            assert not any("team-a" in key for key in workspace_keys(redis_url))
        names = sorted(p.name.split("_")[1] for p in workspace_dirs(work_root))
        assert names == (["team-b.w1"] if again.status_code == 409 else ["team-a.w1", "team-b.w1"])
        assert len(held_user_ids(work_root)) == (len(names) if IS_ROOT else 0)
        assert "skillrun:workspace:id:team-b.w1" in workspace_keys(redis_url)


async def _status_is(api, run_id: str, status: str) -> bool:
    return (await api.get(f"/v1/runs/{run_id}")).json()["status"] == status


async def _gone(api, workspace_id: str) -> bool:
    return (await api.get(f"/v1/workspaces/{workspace_id}")).status_code == 404


async def test_idle_workspaces_are_removed_by_a_worker_and_leave_no_key(redis_url, workers, repo, work_root,  # noqa: F811
                                                                       monkeypatch):
    monkeypatch.setattr(dispatch_queue, "SWEEP_SECONDS", 0.1)
    workers.start()
    workers.start()  # one for the run that keeps its workspace busy
    dispatcher = QueueDispatcher(redis_url, workspace_idle_seconds=0.5)
    dispatcher.start()
    ref = repo.skill_ref("python-math")
    busy = await dispatcher.submit(RunRequest(skill=ref, command="sleep 60", workspace_id="team-a.busy"))
    await eventually(lambda: _started(dispatcher, busy.id), "the busy run never started")
    idle = await dispatcher.submit(RunRequest(skill=ref, command="true", workspace_id="team-a.idle"))
    assert (await dispatcher.wait(idle.id, 60)).status == RunStatus.FINISHED
    assert (await dispatcher.list_workspaces("team-a"))[1] == 2  # owned by the scope their ids name

    async def idle_gone() -> bool:
        return await dispatcher.get_workspace("team-a.idle") is None

    await eventually(idle_gone, "the idle workspace was never removed")
    assert [p.name.split("_")[1] for p in workspace_dirs(work_root)] == ["team-a.busy"]  # a run is in it
    await dispatcher.cancel(busy.id)
    assert (await dispatcher.wait(busy.id, 30)).status == RunStatus.CANCELLED

    async def all_gone() -> bool:
        return not workspace_keys(redis_url)

    await eventually(all_gone, "the workspace whose run ended was never removed")
    assert workspace_dirs(work_root) == [] and held_user_ids(work_root) == []
    await dispatcher.close()


async def _started(dispatcher: QueueDispatcher, run_id: str) -> bool:
    record = await dispatcher.get(run_id)
    return record is not None and record.status == RunStatus.STARTED


async def test_an_owner_keeps_at_most_its_limit_and_a_workspace_stays_on_its_runtime(redis_url, repo):  # noqa: F811
    dispatcher = QueueDispatcher(redis_url, workspace_limit=2)
    ref = repo.skill_ref("python-math")
    for name in ("w1", "w2", "w1"):
        await dispatcher.submit(RunRequest(skill=ref, command="true", workspace_id=f"team-a.{name}"), owner="team-a")
    with pytest.raises(WorkspaceConflictError, match="keeps 2 workspaces, its limit"):
        await dispatcher.submit(RunRequest(skill=ref, command="true", workspace_id="team-a.w3"), owner="team-a")
    await dispatcher.submit(RunRequest(skill=ref, command="true", workspace_id="team-b.w3"), owner="team-b")
    await dispatcher.submit(RunRequest(skill=ref, command="true"), owner="team-a")  # one-off: not kept
    other = RunRequest(skill=ref, command="true", workspace_id="team-a.w1", runtime="docker")
    with pytest.raises(WorkspaceConflictError, match="lives on the local runtime"):
        await dispatcher.submit(other, owner="team-a")
    assert await dispatcher.get(other.run_id) is None  # the refused run's record went again
    entries, total = await dispatcher.list_workspaces("team-a")
    assert total == 2 and [(e.id, len(e.runs)) for e in entries] == [("team-a.w1", 2), ("team-a.w2", 1)]
    with pytest.raises(WorkspaceConflictError, match="queued or running"):
        await dispatcher.remove_workspace("team-a.w1")
    await dispatcher.close()
