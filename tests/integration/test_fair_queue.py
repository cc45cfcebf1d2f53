"""Teams take turns on a shared queue (worker/jobs/fair_queue.py): one team's flood does not hold back another team's next
run, every run still starts once, and runs waiting in a team's line are neither lost nor taken for stranded ones.
Real Redis, real worker processes (burst workers: they drain the queues and exit)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from orchestrator.dispatch import QueueDispatcher
from orchestrator.dispatch import stranded as stranded_module
from orchestrator.skills import create_default_skill_repository
from worker.contract import RunRequest
from worker.jobs.fair_queue import QUEUES, line_key, teams_key
from worker.run_store import RunStatus

REPO = Path(__file__).resolve().parents[2]
QUEUE = "skillrun:local"


@pytest.fixture
def skill():
    return create_default_skill_repository(str(REPO / "skills")).skill_ref("python-math")


def burst(url: str, env: dict[str, str]) -> None:
    """One worker process that takes runs until every queue (and line) is empty, then exits."""
    subprocess.run([sys.executable, "-m", "worker", "--redis-url", url, "--burst"], env={**os.environ, **env},
                   cwd=REPO, check=True, timeout=300)


def rq_jobs(connection: redis.Redis) -> list[str]:
    return [job.decode() for job in connection.lrange(f"rq:queue:{QUEUE}", 0, -1)]


def line(connection: redis.Redis, team: str) -> list[str]:
    return [job.decode() for job in connection.lrange(line_key(QUEUE, team), 0, -1)]


async def start_order(dispatcher: QueueDispatcher, records: list) -> list[str]:
    """The runs by when they started, after checking each finished, on its first attempt."""
    done = [await dispatcher.wait(record.id, 60) for record in records]
    for record in done:
        assert record.status == RunStatus.FINISHED and record.attempts == 1, record
    return [record.id for record in sorted(done, key=lambda r: r.started_at)]


async def test_a_team_flooding_the_queue_does_not_hold_back_another_teams_next_run(redis_url, worker_env, skill):
    dispatcher = QueueDispatcher(redis_url)
    flood = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(20)]
    connection = redis.Redis.from_url(redis_url)
    assert len(rq_jobs(connection)) == 1 and len(line(connection, "team-a")) == 19  # one turn, the rest in line
    b = await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-b")
    assert (await dispatcher.queue_depths())["local"] == 21
    await asyncio.to_thread(burst, redis_url, worker_env)
    order = await start_order(dispatcher, [*flood, b])
    assert order.index(b.id) <= 1, "team B's run waited behind team A's flood"  # first come, first served: 20th
    assert [run for run in order if run != b.id] == [record.id for record in flood]  # A's runs in their own order
    assert not connection.exists(line_key(QUEUE, "team-a"), teams_key(QUEUE))  # lines gone once empty
    await dispatcher.close()


async def test_teams_are_served_in_turn(redis_url, worker_env, skill):
    dispatcher = QueueDispatcher(redis_url)
    runs = {team: [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner=team) for _ in range(3)]
            for team in ("team-a", "team-b", "team-c")}
    await asyncio.to_thread(burst, redis_url, worker_env)
    owners = {record.id: team for team, records in runs.items() for record in records}
    order = await start_order(dispatcher, [record for records in runs.values() for record in records])
    assert [owners[run] for run in order] == ["team-a", "team-b", "team-c"] * 3
    await dispatcher.close()


async def test_a_priority_run_takes_its_own_teams_turn_not_another_teams(redis_url, worker_env, skill):
    dispatcher = QueueDispatcher(redis_url)
    a = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(3)]
    b = await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-b")
    urgent = await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a", priority=True)
    await asyncio.to_thread(burst, redis_url, worker_env)
    order = await start_order(dispatcher, [*a, b, urgent])
    assert order == [urgent.id, b.id, a[0].id, a[1].id, a[2].id]
    await dispatcher.close()


async def test_runs_waiting_in_a_line_are_not_taken_for_stranded_ones(redis_url, skill, monkeypatch):
    monkeypatch.setattr(stranded_module, "STRANDED_SECONDS", 0.0)  # every queued run is old enough to look at
    dispatcher = QueueDispatcher(redis_url)
    queued = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(4)]
    connection = redis.Redis.from_url(redis_url)
    before = (rq_jobs(connection), line(connection, "team-a"))
    for _ in range(2):  # a run is put back only when seen missing twice
        assert await asyncio.to_thread(dispatcher.requeue_stranded) == []
    assert (rq_jobs(connection), line(connection, "team-a")) == before
    for record in queued:
        assert [e.type for e in await dispatcher.events(record.id)] == ["queued"]
    await dispatcher.close()


async def test_the_sweep_moves_a_line_on_when_a_worker_died_holding_its_teams_turn(redis_url, worker_env, skill):
    dispatcher = QueueDispatcher(redis_url)
    runs = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(3)]
    connection = redis.Redis.from_url(redis_url)
    taken = connection.lpop(f"rq:queue:{QUEUE}").decode()  # a worker took the team's turn and died before starting it
    assert rq_jobs(connection) == [] and len(line(connection, "team-a")) == 2
    assert await asyncio.to_thread(dispatcher.gate.sweep) == 1
    assert len(rq_jobs(connection)) == 1 and len(line(connection, "team-a")) == 1
    connection.rpush(f"rq:queue:{QUEUE}", taken)  # and the stranded-job sweep put the lost one back
    await asyncio.to_thread(burst, redis_url, worker_env)
    await start_order(dispatcher, runs)  # all three ran, once each
    assert not connection.exists(line_key(QUEUE, "team-a"))
    assert connection.smembers(QUEUES) in (set(), {QUEUE.encode()})
    await dispatcher.close()


async def test_a_cancelled_run_in_a_line_lets_the_next_one_through(redis_url, worker_env, skill):
    dispatcher = QueueDispatcher(redis_url)
    runs = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(3)]
    cancelled = await dispatcher.cancel(runs[1].id)
    assert cancelled.status == RunStatus.CANCELLED
    await asyncio.to_thread(burst, redis_url, worker_env)
    assert [(await dispatcher.get(r.id)).status for r in runs] == [
        RunStatus.FINISHED, RunStatus.CANCELLED, RunStatus.FINISHED]
    await dispatcher.close()
