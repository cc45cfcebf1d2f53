"""Redis SIGKILLed under queued and running runs: restarted from its append-only file, and restarted empty.

Redis runs in a container (``images/redis``) that the engine SIGKILLs and starts again; workers and the API are
processes of this checkout.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from rq import Queue
from rq.serializers import JSONSerializer

from orchestrator.dispatch import QueueDispatcher
from orchestrator.documents import RedisDocuments
from tests.chaos import ledger
from tests.chaos.conftest import until
from tests.orchestrator.api_helpers import api_in_a_thread, make_services, new_team
from worker.jobs import nodes
from worker.artifacts import FileArtifactStore
from worker.run_store import RunStatus

pytestmark = [pytest.mark.slow, pytest.mark.docker, pytest.mark.timeout(300)]

QUEUED = 100


async def test_redis_sigkilled_with_100_runs_queued_comes_back_from_its_append_only_file_and_each_runs_once(
        redis_containers, workers, work_root):
    server = redis_containers(persistent=True)
    dispatcher = QueueDispatcher(server.url(), max_attempts=3)
    dispatcher.start()
    for _ in range(2):
        workers.start(server.url())
    holds = [await dispatcher.submit(ledger.gated(f"hold-{i}")) for i in range(2)]  # both workers busy, mid-run
    await until(lambda: all(ledger.lines(work_root, f"hold-{i}") for i in range(2)), 120, "both holding runs beginning")
    tags = [f"aof-{i}" for i in range(QUEUED)]
    ids = [(await dispatcher.submit(ledger.counted(tag))).id for tag in tags]
    node = nodes.live_nodes(dispatcher.redis, "local")[0]  # the workers share one work root: one node
    queue = Queue(nodes.node_queue_name("local", node), connection=dispatcher.redis, serializer=JSONSerializer)
    waiting = lambda: queue.count + dispatcher.gate.depth(queue.name)  # noqa: E731 - the queue and its teams' lines
    assert waiting() == QUEUED  # each run's own (kept) workspace was placed on that node

    server.kill()  # SIGKILL: no shutdown, no final write
    server.restart()
    assert waiting() == QUEUED  # the jobs came back from the append-only file...
    assert {r.id for r in await dispatcher.list(RunStatus.QUEUED, limit=1000)} == set(ids)  # ...and the records
    for i in range(2):
        ledger.release(work_root, f"hold-{i}", "held")  # the workers, busy across the outage, go on

    records = await asyncio.gather(*(dispatcher.wait(run_id, 240) for run_id in ids))
    for tag, record in zip(tags, records):
        ran = ledger.lines(work_root, tag)
        events = [e.type for e in await dispatcher.events(record.id)]
        told = f"{tag}: {record.status.value}, attempts {record.attempts}, ran {ran}, events {events}"
        assert (record.status, record.attempts, record.result.stdout) == (RunStatus.FINISHED, 1, f"{tag}\n"), told
        assert ran == [tag] and events == ["queued", "started", "finished"], told  # exactly once
    for hold in holds:
        done = await dispatcher.wait(hold.id, 60)
        assert done.status == RunStatus.FINISHED and done.result.stdout == "held\n", done
    assert all(w.poll() is None for w in workers.procs)
    await dispatcher.close()


async def test_a_worker_whose_run_ends_while_redis_is_away_serves_on_once_it_is_back(redis_containers, workers, work_root):
    server = redis_containers(persistent=True)
    dispatcher = QueueDispatcher(server.url(), max_attempts=3)
    dispatcher.start()
    worker = workers.start(server.url())
    held = await dispatcher.submit(ledger.gated("away"))
    await until(lambda: ledger.lines(work_root, "away"), 120, "the run beginning")
    server.kill()
    ledger.release(work_root, "away", "done")
    await until(lambda: "ended" in ledger.lines(work_root, "away"), 60, "the command ending")
    await asyncio.sleep(2)  # the fault, not a figure: Redis stays away while the worker stores the result
    server.restart()
    assert worker.poll() is None, f"the worker exited with {worker.returncode} while Redis was away"
    after = await dispatcher.submit(ledger.counted("after"))
    assert (await dispatcher.wait(after.id, 120)).status == RunStatus.FINISHED
    done = await dispatcher.wait(held.id, 120)  # its result stored late, or retried and told
    assert done.status == RunStatus.FINISHED and done.result.stdout == "done\n", done
    await dispatcher.close()


async def test_redis_restarted_empty_tells_waiting_callers_their_runs_were_lost_not_unknown(
        redis_containers, workers, work_root, shared_dir):
    # The API as deployed (runs, teams and keys in Redis), under uvicorn on loopback in a thread of this process, so
    # the test can see that every wait is open before Redis goes.
    server = redis_containers(persistent=False)
    dispatcher = QueueDispatcher(server.url())
    services = make_services(dispatcher, FileArtifactStore(shared_dir / "artifacts"), shared_dir / "data",
                             documents=RedisDocuments(server.url()))
    worker = workers.start(server.url())
    callers = 20
    limits = httpx.Limits(max_connections=callers + 10)
    with api_in_a_thread(services) as url:
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {new_team(services, 'chaos')}"},
                                     limits=limits, timeout=120) as c:
            async def submit(body: dict) -> str:
                answer = await c.post("/v1/runs", json={"skill": "python-math", **body})
                assert answer.status_code == 202, answer.text
                return answer.json()["id"]

            finished = await submit({"command": "echo done"})
            assert (await c.get(f"/v1/runs/{finished}", params={"wait": 120})).json()["status"] == "finished"
            started = await submit({"command": ledger.gated("lost").command, "workspace_id": "lost"})  # chaos.lost
            await until(lambda: ledger.lines(work_root, "chaos.lost"), 120, "the started run beginning")
            queued = await submit({"command": "echo never"})  # behind the started one on the only worker
            waits = [asyncio.create_task(c.get(f"/v1/runs/{run_id}", params={"wait": 300}))
                     for run_id in (started, queued) for _ in range(callers // 2)]
            await until(lambda: len(dispatcher.waiters) == callers, 60, "every caller waiting")

            server.kill()
            server.restart()  # empty: no append-only file
            for answer in await asyncio.gather(*waits):
                assert answer.status_code == 410 and "was lost" in answer.json()["detail"], answer.text

        key = new_team(services, "chaos")  # the team and its keys were in Redis too: made again, the same team
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as c:
            ledger.release(work_root, "chaos.lost", "too late")  # its worker's attempt ends: it must not come back
            again = (await c.post("/v1/runs", json={"skill": "python-math", "command": "echo back"})).json()["id"]
            back = (await c.get(f"/v1/runs/{again}", params={"wait": 120})).json()  # the same worker, after that
            assert (back["status"], back["result"]["stdout"]) == ("finished", "back\n"), back
            for run_id in (finished, started, queued):
                for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
                    answer = await c.get(path)
                    assert answer.status_code == 410 and "was lost" in answer.json()["detail"], (path, answer.text)
            unknown = await c.get(f"/v1/runs/{started[:-8]}00000000")  # a wrong id is still no such run
            assert unknown.status_code == 404 and "no run" in unknown.json()["detail"], unknown.text
    assert worker.poll() is None
    assert list(dispatcher.redis.scan_iter(f"skillrun:*{started}*")) == []  # the late attempt wrote no record back
    await services.close()
