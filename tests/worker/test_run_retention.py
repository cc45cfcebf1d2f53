"""Retention of run records: the stores forget ended runs after the result TTL, and the Redis indexes shrink with
them, a bounded number of runs per write. Time is a clock the test moves, not a wait."""

from __future__ import annotations

import pytest
import redis

from worker.contract import RunRequest, RunResult, SkillRef
from worker.run_store import Attempt, MemoryRunStore, RedisRunStore, RunKeys
from worker.run_store.base import TRIM_BATCH

TTL = 3600
SKILL = SkillRef(name="demo", root="/nowhere")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def _end(store, owner: str | None = "team-a") -> str:
    """A run created, started and finished in ``store``; its id."""
    record = store.create(RunRequest(skill=SKILL, command="true"), owner)
    started = store.start(record.id, "w1")
    store.finish(record.id, RunResult(exit_code=0, run_id=record.id, workspace_id="w", runtime="local"),
                 Attempt.of(started))
    return record.id


def _ids(client: redis.Redis, key: str) -> set[str]:
    return {member.decode() for member in client.zrange(key, 0, -1)}


def test_ended_runs_leave_the_redis_indexes_once_their_records_expired(redis_url):
    clock = Clock()
    client = redis.Redis.from_url(redis_url)
    store = RedisRunStore(client, result_ttl=TTL, clock=clock)
    keys = RunKeys()
    old = {_end(store), _end(store, owner=None)}
    clock.now += TTL / 2
    recent = _end(store)
    assert _ids(client, keys.index()) == old | {recent}  # nothing expired yet: nothing trimmed
    clock.now += TTL / 2 + 1
    newest = _end(store)
    assert _ids(client, keys.index()) == {recent, newest}
    assert _ids(client, keys.index("team-a")) == {recent, newest}
    assert {m.split(" ")[0] for m in _ids(client, keys.expiring)} == {recent, newest}


def test_a_run_still_going_stays_in_the_index(redis_url):
    clock = Clock()
    client = redis.Redis.from_url(redis_url)
    store = RedisRunStore(client, result_ttl=TTL, clock=clock)
    queued = store.create(RunRequest(skill=SKILL, command="true"), "team-a")
    clock.now += 10 * TTL
    ended = _end(store)
    assert _ids(client, RunKeys().index("team-a")) == {queued.id, ended}


def test_one_write_trims_a_bounded_number_of_runs(redis_url):
    clock = Clock()
    client = redis.Redis.from_url(redis_url)
    store = RedisRunStore(client, result_ttl=TTL, clock=clock)
    for _ in range(TRIM_BATCH + 5):
        _end(store)
    clock.now += TTL + 1
    _end(store)
    assert client.zcard(RunKeys().index()) == 5 + 1
    _end(store)
    assert client.zcard(RunKeys().index()) == 2


def test_the_memory_store_forgets_ended_runs_after_the_ttl():
    clock = Clock()
    store = MemoryRunStore(result_ttl=TTL, clock=clock)
    old = _end(store)
    clock.now += TTL / 2
    recent = _end(store)
    queued = store.create(RunRequest(skill=SKILL, command="true"), "team-a")
    clock.now += TTL / 2 + 1
    newest = _end(store)
    assert store.get(old) is None and store.events(old) == []
    assert {r.id for r in store.list()} == {recent, queued.id, newest}


def test_an_id_whose_events_outlived_its_record_is_not_used_again_and_nothing_of_the_new_run_is_kept(redis_url):
    client = redis.Redis.from_url(redis_url)
    store = RedisRunStore(client, result_ttl=TTL)
    keys = RunKeys()
    ended = _end(store)
    client.delete(keys.record(ended))  # the record went first (removed by hand); its events are still there
    with pytest.raises(ValueError, match="already exists"):
        store.create(RunRequest(skill=SKILL, command="true", run_id=ended), "team-a")
    assert not client.exists(keys.record(ended))
    assert [e.type for e in store.events(ended)] == ["queued", "started", "finished"]
