"""Everything a run writes to Redis has an owner and an end: once the retention of many runs has passed, Redis holds
what it held before them — the same keys, and every hash, sorted set, set, list and stream as long as it was.

Runs go through the queue dispatcher, RQ and a real worker process (the team's turns, its line, RQ's registries and
results, the run store's records, events and indexes), with a short result TTL; the test waits until every key of
its runs has expired, lets the sweep run once, and compares what is left by counting entries, not by timing. The
artifact tally is checked with a clock the test moves: it holds the hours of the artifacts' retention, however long
a team keeps storing artifacts without asking what its tally holds.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import redis

from orchestrator.dispatch import QueueDispatcher
from orchestrator.skills import create_default_skill_repository
from tests.processes import WorkerProcesses
from worker import defaults
from worker.contract import RunRequest, RunResult, SkillRef
from worker.run_store import Attempt, RedisRunStore, RunStatus
from worker.run_store.base import TALLY_SECONDS
from worker.run_store.records import DURATION_BUCKETS_SECONDS

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TTL_SECONDS = 2
"""The result TTL of the test's runs, and of RQ's summaries of their jobs."""
RUNS = 40
CANCELLED = 5
"""Of ``RUNS``, cancelled while they wait (in their team's line, most of them: a team has one run at a time in the
queue)."""
END_WAIT_SECONDS = 120
STATS_FIELDS = len(RunStatus) + len(DURATION_BUCKETS_SECONDS) + 2
"""What the run store's counts hold at most: one per status, one per duration bucket and ``+Inf``, the sum."""


def structures(client: redis.Redis) -> dict[str, tuple[str, int]]:
    """Every key of the database: its type and how many entries it holds (a string: 1)."""
    sizes = {"hash": client.hlen, "zset": client.zcard, "set": client.scard, "list": client.llen,
             "stream": client.xlen, "string": lambda _key: 1}
    found = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind != "none":  # expired between the scan and the look
            found[key.decode()] = (kind, sizes[kind](key))
    return found


async def through_the_queue(dispatcher: QueueDispatcher, runs: int, cancelled: int = 0) -> None:
    """``runs`` runs of one team (the last ``cancelled`` of them cancelled as soon as all are queued), then the
    wait until every key of them has expired (a queued or started run's record has no end yet: so all ended), and
    one sweep."""
    skill = create_default_skill_repository(str(REPO / "skills")).skill_ref("python-math")
    records = [await dispatcher.submit(RunRequest(skill=skill, command="true"), owner="team-a") for _ in range(runs)]
    for record in records[runs - cancelled:]:
        await dispatcher.cancel(record.id)
    deadline = time.monotonic() + END_WAIT_SECONDS
    while any(record.id in key for key in structures(dispatcher.redis) for record in records):
        assert time.monotonic() < deadline, "the runs did not end, or their own keys outlived their TTL"
        await asyncio.sleep(0.2)
    await asyncio.sleep(0.1)  # past the expiry the store noted for the last of them (its clock, not Redis's)
    await dispatcher.sweep_lost()


async def test_redis_holds_what_it_held_before_once_the_retention_of_many_runs_passed(
        redis_url, worker_env, monkeypatch):
    monkeypatch.setattr(defaults, "JOB_RESULT_TTL_SECONDS", TTL_SECONDS)  # RQ's job summaries, as the enqueuer sets
    worker = WorkerProcesses({**worker_env, "SKILLRUN_RESULT_TTL_SECONDS": str(TTL_SECONDS)}, redis_url)
    worker.start()
    dispatcher = QueueDispatcher(redis_url, result_ttl=TTL_SECONDS)
    try:
        await through_the_queue(dispatcher, 1)  # the queue, the worker's registration, the counts exist from now on
        before = structures(dispatcher.redis)
        await through_the_queue(dispatcher, RUNS, CANCELLED)
        after = structures(dispatcher.redis)
    finally:
        await dispatcher.close()
        worker.stop()
    stats = dispatcher.store.keys.stats
    assert after.pop(stats)[1] <= STATS_FIELDS  # counts of every run ever, in a bounded set of fields
    before.pop(stats)
    assert after == before


def test_a_teams_artifact_tally_holds_the_retentions_hours_only_however_long_it_keeps_storing(redis_url):
    now = [1_000_000.0]
    client = redis.Redis.from_url(redis_url)
    kept_hours = 3
    store = RedisRunStore(client, clock=lambda: now[0], artifact_ttl=kept_hours * TALLY_SECONDS)
    artifact = {"name": "out/a", "version": 1, "mime_type": "text/plain", "size": 10, "sha256": "0" * 64}
    for _ in range(10 * kept_hours):  # an artifact every hour; nobody asks what the team's tally holds
        record = store.create(RunRequest(skill=SkillRef(name="demo", root="/r"), command="true"), owner="team-a")
        started = store.start(record.id, "w")
        store.finish(record.id, RunResult(run_id=record.id, workspace_id=record.request.workspace_id,
                                          runtime="local", exit_code=0, artifact_files=[artifact]),
                     Attempt.of(started))
        now[0] += TALLY_SECONDS
    assert client.hlen(store.keys.team_artifacts("team-a")) <= kept_hours + 1
    client.close()
