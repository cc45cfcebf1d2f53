"""A worker killed between taking a run's job off the queue and starting the run: the sweep puts the job back.

Each test strands a job the way a dying worker does (RQ pops it off the queue, and a worker that got as far as RQ's
bookkeeping leaves a started-job registry entry that then expires) and drives the sweep's step directly."""

from __future__ import annotations

import asyncio
import time

import pytest
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from orchestrator.dispatch import QueueDispatcher, stranded
from orchestrator.dispatch.stranded import job_id_of
from tests.integration.test_queue import burst, repo  # noqa: F401 (fixtures)
from worker.contract import RunRequest
from worker.jobs.nodes import worker_beat_key
from worker.run_store import RunStatus


@pytest.fixture
def no_grace(monkeypatch):
    monkeypatch.setattr(stranded, "STRANDED_SECONDS", 0.0)


async def _queued(dispatcher: QueueDispatcher, repo) -> str:  # noqa: F811
    record = await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command="echo ran"))
    return record.id


def _waiting(dispatcher: QueueDispatcher) -> set[str]:
    return {i.decode() for i in dispatcher.redis.zrange(dispatcher.store.keys.waiting, 0, -1)}


def _queue_ids(dispatcher: QueueDispatcher) -> list[str]:
    return [i.decode() for i in dispatcher.redis.lrange(dispatcher.queue("local").key, 0, -1)]


async def test_a_job_popped_by_a_worker_that_died_is_put_back_after_two_sightings_and_runs_once(
        redis_url, worker_env, repo, no_grace):  # noqa: F811
    dispatcher = QueueDispatcher(redis_url)
    run_id = await _queued(dispatcher, repo)
    job_id = job_id_of(dispatcher.store.get(run_id))
    assert _waiting(dispatcher) == {run_id}
    assert dispatcher.redis.lpop(dispatcher.queue("local").key).decode() == job_id  # the worker took it and died
    assert dispatcher.requeue_stranded() == []  # first seen missing: a worker may be about to start it
    assert dispatcher.store.get(run_id).status == RunStatus.QUEUED and _queue_ids(dispatcher) == []
    assert dispatcher.requeue_stranded() == [run_id]
    assert _queue_ids(dispatcher) == [job_id]
    assert dispatcher.requeue_stranded() == []  # waiting in its queue again: left alone
    events = await dispatcher.events(run_id)
    assert [e.type for e in events] == ["queued", "requeued"]
    assert "stopped before starting it" in events[1].data["reason"]
    await asyncio.to_thread(burst, redis_url, worker_env)
    record = await dispatcher.get(run_id)
    assert record.status == RunStatus.FINISHED and record.result.stdout == "ran\n" and record.attempts == 1
    assert [e.type for e in await dispatcher.events(run_id)] == ["queued", "requeued", "started", "finished"]
    assert _waiting(dispatcher) == set()
    assert dispatcher.redis.exists(stranded.STRANDED_MARK.format(run_id)) == 0
    await dispatcher.close()


async def test_runs_waiting_in_their_queue_or_held_by_a_live_worker_are_left_alone(redis_url, repo, no_grace):  # noqa: F811
    dispatcher = QueueDispatcher(redis_url)
    waiting = await _queued(dispatcher, repo)
    held = await _queued(dispatcher, repo)
    held_job = job_id_of(dispatcher.store.get(held))
    queue = dispatcher.queue("local")
    dispatcher.redis.lrem(queue.key, 1, held_job)
    dispatcher.redis.zadd(StartedJobRegistry(queue=queue).key, {f"{held_job}:execution-1": time.time() + 600})  # its worker beats
    for _ in range(3):
        assert dispatcher.requeue_stranded() == []
    assert _queue_ids(dispatcher) == [job_id_of(dispatcher.store.get(waiting))]
    assert {e.type for run_id in (waiting, held) for e in await dispatcher.events(run_id)} == {"queued"}
    await dispatcher.close()


@pytest.mark.parametrize("horse_started", [False, True], ids=["before-the-work-horse", "in-the-work-horse"])
async def test_a_job_of_a_worker_that_died_after_rqs_bookkeeping_is_put_back_once_its_entry_expires(
        redis_url, worker_env, repo, no_grace, horse_started):  # noqa: F811
    """RQ registers the job as started before forking the work horse, which then marks the job started and starts
    the run: a worker killed in between leaves an entry no one renews (RQ's cleanup fails the job only when it had
    been marked started; otherwise the entry stays, expired)."""
    dispatcher = QueueDispatcher(redis_url)
    run_id = await _queued(dispatcher, repo)
    job_id = job_id_of(dispatcher.store.get(run_id))
    queue = dispatcher.queue("local")
    started = StartedJobRegistry(queue=queue)
    dispatcher.redis.lrem(queue.key, 1, job_id)
    if horse_started:
        Job.fetch(job_id, connection=dispatcher.redis, serializer=JSONSerializer).set_status(JobStatus.STARTED)
    dispatcher.redis.zadd(started.key, {f"{job_id}:execution-1": time.time() - 1})  # no worker renews it
    assert dispatcher.requeue_stranded() == []  # first sighting
    assert (job_id in FailedJobRegistry(queue=queue).get_job_ids()) == horse_started
    assert dispatcher.requeue_stranded() == [run_id]
    assert job_id not in FailedJobRegistry(queue=queue).get_job_ids() and _queue_ids(dispatcher) == [job_id]
    assert dispatcher.redis.zcard(started.key) == 0
    await asyncio.to_thread(burst, redis_url, worker_env)
    assert (await dispatcher.get(run_id)).status == RunStatus.FINISHED
    await dispatcher.close()


async def test_the_waiting_index_holds_the_queued_runs_only(redis_url, repo):  # noqa: F811
    dispatcher = QueueDispatcher(redis_url, max_attempts=2)
    store = dispatcher.store
    cancelled, started = await _queued(dispatcher, repo), await _queued(dispatcher, repo)
    await dispatcher.cancel(cancelled)
    store.start(started, "w")
    assert _waiting(dispatcher) == set()
    store.redis.delete(store.keys.part(started, "heartbeat"))  # its worker died: retried, so queued again
    store.requeue_lost(started, 2)
    assert _waiting(dispatcher) == {started}
    store.redis.delete(store.keys.record(started))  # a record gone by hand: the index forgets it
    assert store.waiting_since(time.time() + 1, 10) == [] and _waiting(dispatcher) == set()
    await dispatcher.close()


@pytest.mark.parametrize("beating", [True, False], ids=["its-worker-beats", "its-worker-is-gone"])
async def test_a_registry_entry_counts_while_its_worker_beats(redis_url, repo, no_grace, beating):  # noqa: F811
    """RQ's entry for a job outlives a killed worker by minutes; the worker's own beat says at once whether it is
    there."""
    dispatcher = QueueDispatcher(redis_url)
    run_id = await _queued(dispatcher, repo)
    job_id = job_id_of(dispatcher.store.get(run_id))
    queue = dispatcher.queue("local")
    dispatcher.redis.lrem(queue.key, 1, job_id)
    entry = f"{job_id}:execution-1"
    dispatcher.redis.zadd(StartedJobRegistry(queue=queue).key, {entry: time.time() + 400})
    dispatcher.redis.hset(f"rq:execution:{entry}", mapping={"worker_name": "host-1234"})
    if beating:
        dispatcher.redis.set(worker_beat_key("host-1234"), "node", ex=60)
    assert dispatcher.requeue_stranded() == []
    assert dispatcher.requeue_stranded() == ([] if beating else [run_id])
    assert dispatcher.redis.zcard(StartedJobRegistry(queue=queue).key) == (1 if beating else 0)
    await dispatcher.close()
