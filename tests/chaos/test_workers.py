"""Workers SIGKILLed while they run, and a worker cut off from Redis mid-run and back after its run went on elsewhere.

"Doubled" here means what a caller could not tell: a run whose command executed more often than its record says it
was attempted, a run that ended twice, or a run that was never disturbed and still ran twice. A run whose worker was
killed mid-command is executed again on purpose — and its record says so (``attempts`` 2, a ``retried`` event with
the reason).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter

import docker.errors
import pytest
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from orchestrator.dispatch import QueueDispatcher
from orchestrator.dispatch.stranded import job_id_of
from tests.chaos import ledger
from tests.chaos.conftest import until, worker_container
from worker.artifacts import FileArtifactStore
from worker.run_store import RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

RUNS = 50
VICTIMS = (7, 23, 41)
"""Runs whose first attempt hangs once its command has begun: the test SIGKILLs the worker holding each."""


def _whereabouts(dispatcher: QueueDispatcher, record) -> str:
    """Where a queued run's job is (for a failure's message): its queue, RQ's registries, the sweep's mark."""
    if record.status != RunStatus.QUEUED:
        return ""
    r, job_id = dispatcher.redis, job_id_of(record)
    registry = [(e.decode(), round(score - time.time(), 1)) for e, score in r.zrange(
        "rq:wip:skillrun:local", 0, -1, withscores=True) if e.decode().startswith(job_id)]
    return (f"; job {job_id}: queue position {r.lpos('rq:queue:skillrun:local', job_id)}, status "
            f"{r.hget(f'rq:job:{job_id}', 'status')}, started registry {registry}, failed "
            f"{r.zscore('rq:failed:skillrun:local', job_id)}, waiting since "
            f"{r.zscore(dispatcher.store.keys.waiting, record.id)}, mark {r.get(f'skillrun:stranded:{record.id}')}, "
            f"now {time.time():.1f}")


def _pid(worker_id: str | None) -> int:
    return int((worker_id or ":0").rsplit(":", 1)[1])


async def test_workers_sigkilled_during_50_runs_lose_none_and_double_none(redis_url, workers, work_root):
    dispatcher = QueueDispatcher(redis_url, max_attempts=3)
    dispatcher.start()  # its lost-run sweep
    tags = [f"kill-{i}" for i in range(RUNS)]
    requests = [ledger.counted(tag, then='[ "$(wc -l < $WORK_DIR/ledger)" -gt 1 ] || sleep 240') if i in VICTIMS
                else ledger.counted(tag) for i, tag in enumerate(tags)]
    ids = [(await dispatcher.submit(request)).id for request in requests]
    for _ in range(2):
        workers.start(redis_url)
    holders: dict[int, int] = {}

    async def state() -> str:
        records = [await dispatcher.get(run_id) for run_id in ids]
        return f"{Counter(r.status.value for r in records)}; {workers.describe()}"

    for index in VICTIMS:  # kill each victim's worker once its command has begun (it then hangs: no race)
        await until(lambda: ledger.lines(work_root, tags[index]), 120, f"run {index}'s command beginning", state)
        holder = _pid((await dispatcher.get(ids[index])).worker_id)
        victim = next(p for p in workers.running() if p.pid == holder)
        workers.kill(victim)
        holders[index] = holder
        workers.start(redis_url)
        if index == VICTIMS[1]:  # and once a worker picked blindly, wherever it is (idle, taking a job, mid-run)
            workers.kill(random.choice(workers.running()))
            workers.start(redis_url)

    records = await asyncio.gather(*(dispatcher.wait(run_id, 240) for run_id in ids))
    for i, (tag, record) in enumerate(zip(tags, records)):
        events = [e.type for e in await dispatcher.events(record.id)]
        ran = ledger.lines(work_root, tag)
        told = (f"run {i}: {record.status.value}, attempts {record.attempts}, ran {len(ran)}x, events {events}"
                + _whereabouts(dispatcher, record))
        assert record.status == RunStatus.FINISHED, told  # none lost, none failed
        assert record.result.stdout == f"{tag}\n" and set(ran) == {tag}, told
        assert Counter(e for e in events if e != "requeued") == Counter(
            queued=1, started=record.attempts, retried=record.attempts - 1, finished=1,
        ), told  # ended once; every extra attempt told, with why (and a job lost before its run started, put back)
        assert 1 <= len(ran) <= record.attempts, told  # never ran more often than it was attempted
        if i in VICTIMS:
            assert record.attempts >= 2 and len(ran) >= 2, told  # the killed attempt had run: retried, and says so
            assert _pid(record.result.worker_id) != holders[i], told  # the result is a later attempt's
    explained = [e for r in records for e in await dispatcher.events(r.id) if e.type in ("retried", "requeued")]
    assert all("stopped beating" in e.data["reason"] or "stopped before starting" in e.data["reason"] for e in explained)
    assert dispatcher.store.redis.zcard(dispatcher.store.keys.running) == 0  # nothing left "running"
    await dispatcher.close()


# --- a worker partitioned from Redis --------------------------------------------------------------------------------

@pytest.mark.docker
async def test_a_worker_partitioned_mid_run_and_healed_after_its_run_was_retried_elsewhere_overwrites_nothing(
        docker_engine, chaos_network, redis_containers, workers, work_root, shared_dir, request, worker_image):
    server = redis_containers(persistent=False, network=chaos_network)
    far_root, artifacts = shared_dir / "container-work", shared_dir / "artifacts"
    far_root.mkdir(mode=0o755)
    artifacts.mkdir(mode=0o755)
    far = worker_container(worker_image, chaos_network, server.address_on(chaos_network), far_root, artifacts,
                           request.node.name)
    dispatcher = QueueDispatcher(server.url(), max_attempts=2)
    dispatcher.start()  # its lost-run sweep
    far.start()
    network = docker_engine.client.networks.get(chaos_network.id)
    try:
        # A one-off run: the retry may go to any worker (a kept workspace's runs stay on its node's workers)
        record = await dispatcher.submit(ledger.gated("partition", keep_workspace=False, output_files=["out/who.txt"],
                                                      save_as_artifacts=True))
        await until(lambda: ledger.lines(far_root, "partition"), 120, "the container's attempt beginning",
                    lambda: far.get_wrapped_container().logs(tail=20).decode(errors="replace"))
        first = await dispatcher.get(record.id)
        assert (first.status, first.attempts) == (RunStatus.STARTED, 1)

        network.disconnect(far.get_wrapped_container())  # cut off from Redis, its command still running
        near = workers.start(server.url())
        await until(lambda: ledger.lines(work_root, "partition"), 120, "the run retried on the other worker",
                    lambda: f"{dispatcher.store.get(record.id)}; {workers.describe()}")
        ledger.release(work_root, "partition", "fresh")
        done = await dispatcher.wait(record.id, 120)
        assert (done.status, done.attempts, done.result.stdout) == (RunStatus.FINISHED, 2, "fresh\n"), done
        assert _pid(done.result.worker_id) == near.pid
        events = [e.type for e in await dispatcher.events(record.id)]
        assert events == ["queued", "started", "retried", "started", "finished"]

        network.connect(far.get_wrapped_container())  # healed: it beats, finishes and saves its artifact again
        ledger.release(far_root, "partition", "stale")
        stale_job = Job.fetch(f"{record.id}-1", connection=dispatcher.redis, serializer=JSONSerializer)
        # A job that returned leaves no summary (its hash goes as it ends); one that raised is kept, failed
        await until(lambda: dispatcher.redis.hget(stale_job.key, "status") in (None, JobStatus.FAILED.value.encode()),
                    180, "the healed worker ending its attempt")
        assert not dispatcher.redis.exists(stale_job.key), "the healed worker's job raised"  # its result was refused
        final = await dispatcher.get(record.id)
        assert final.model_dump() == done.model_dump()  # nothing overwritten: status, result, attempts, worker
        assert [e.type for e in await dispatcher.events(record.id)] == events
        assert final.result.output_files[0].content == "fresh\n"
        saved = final.result.artifact_files[0]
        assert FileArtifactStore(artifacts).load("partition", saved.name, saved.version) == b"fresh\n"

        workers.kill(near)  # and the healed worker serves on
        again = await dispatcher.submit(ledger.counted("after-heal").model_copy(update={"keep_workspace": False}))
        after = await dispatcher.wait(again.id, 120)
        assert after.status == RunStatus.FINISHED and after.result.stdout == "after-heal\n", after
    finally:
        if far._container is not None:
            print(far.get_wrapped_container().logs(tail=40).decode(errors="replace"))
        with contextlib.suppress(docker.errors.APIError):
            far.stop()
        await dispatcher.close()
