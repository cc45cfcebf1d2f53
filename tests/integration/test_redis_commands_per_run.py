"""What one run costs Redis, counted (not timed): the commands a one-off run of ``true`` takes from submission to its
end, its caller's wait and its worker's RQ bookkeeping included, stay at or under the figure measured when they
were cut (``benchmarks/redis_cost.py`` measures the same through the HTTP API). A Redis of the test's own, so that
nothing else lands in its counters; a ``skillrun worker`` process (``worker.jobs.queue_worker.RunWorker``) in burst mode.

Counted twice, for ``RUNS`` and for twice as many runs: the difference is what the extra runs cost, without what a
worker's start and end cost once (and the first run's scripts, loaded before)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from orchestrator.dispatch import QueueDispatcher
from orchestrator.dispatch import queue as dispatch_queue
from orchestrator.skills import create_default_skill_repository
from tests.services import RedisServer
from worker.contract import RunRequest
from worker.run_store import RunStatus

REPO = Path(__file__).resolve().parents[2]
RUNS = 10
TEAM = "team-a"
COMMANDS_PER_RUN = 95
"""At most, every command counted once (a script's own commands too, as ``INFO commandstats`` counts them): 93
measured here (97 before queued and started runs were counted by their indexes), ten runs of one team queued at once (so through its line, ``worker.jobs.fair_queue``)."""
RQ_COMMANDS_PER_RUN = 25
"""At most, of the commands on RQ's keys (``rq:*``): 24 measured (no job summary kept); 57 before ``worker.jobs.queue_worker.RunWorker``."""
OWN = {"config|resetstat": 1, "info": 1}


@pytest.fixture
def counted_redis():
    server = RedisServer()
    yield server.url()
    server.stop()


def commands(client: redis.Redis) -> dict[str, int]:
    """Calls by command since the last ``CONFIG RESETSTAT``, the counting's own taken out."""
    stats = client.info("commandstats")
    table = {name.removeprefix("cmdstat_"): int(stat["calls"]) for name, stat in stats.items()}
    return {name: calls - OWN.get(name, 0) for name, calls in table.items() if calls - OWN.get(name, 0) > 0}


def rq_commands(client: redis.Redis) -> int:
    """Commands on RQ's keys since the last reset, read from the slow log of every command (``slowlog`` at 0 us)."""
    return sum(1 for entry in client.slowlog_get(100_000)
               if len(entry["command"].split()) > 1 and entry["command"].split()[1].startswith(b"rq:"))


async def through_the_queue(dispatcher: QueueDispatcher, url: str, env: dict[str, str], runs: int) -> None:
    """``runs`` one-off runs of one team, each awaited by its caller while a burst worker takes them."""
    skill = create_default_skill_repository(str(REPO / "skills")).skill_ref("python-math")
    records = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner=TEAM) for _ in range(runs)]
    waits = [asyncio.create_task(dispatcher.wait(record.id, 60)) for record in records]
    await asyncio.sleep(0)
    await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "worker", "--redis-url", url, "--burst"],
                            env={**os.environ, **env}, cwd=REPO, check=True, timeout=120)
    ended = await asyncio.gather(*waits)
    assert [record.status for record in ended] == [RunStatus.FINISHED] * runs
    assert all(record.attempts == 1 for record in ended)


async def counted_runs(dispatcher: QueueDispatcher, url: str, env: dict[str, str], runs: int) -> tuple[dict[str, int], int]:
    with redis.Redis.from_url(url) as client:
        client.config_set("slowlog-log-slower-than", 0)
        client.config_set("slowlog-max-len", 100_000)
        client.slowlog_reset()
        client.config_resetstat()
        await through_the_queue(dispatcher, url, env, runs)
        return commands(client), rq_commands(client)


async def test_a_one_off_run_costs_redis_no_more_commands_than_measured(counted_redis, worker_env, monkeypatch):
    monkeypatch.setattr(dispatch_queue, "SWEEP_SECONDS", 3600.0)  # no sweep lands in what is counted
    dispatcher = QueueDispatcher(counted_redis)
    try:
        await through_the_queue(dispatcher, counted_redis, worker_env, 1)  # scripts loaded, the queue and the team known
        once, rq_once = await counted_runs(dispatcher, counted_redis, worker_env, RUNS)
        twice, rq_twice = await counted_runs(dispatcher, counted_redis, worker_env, 2 * RUNS)
    finally:
        await dispatcher.close()
    per_run = {name: (twice.get(name, 0) - once.get(name, 0)) / RUNS for name in twice}
    total = sum(per_run.values())
    print(f"\nRedis commands per run: {total:.1f} (RQ's keys {(rq_twice - rq_once) / RUNS:.1f})")
    for name, calls in sorted(per_run.items(), key=lambda item: -item[1]):
        print(f"  {name:<20}{calls:>6.1f}")
    assert total <= COMMANDS_PER_RUN, per_run
    assert (rq_twice - rq_once) / RUNS <= RQ_COMMANDS_PER_RUN
