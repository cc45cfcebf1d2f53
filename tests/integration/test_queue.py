"""Runs over a real Redis with RQ and real worker processes: results, cancel, a killed worker, a restarted Redis."""

from __future__ import annotations

import asyncio
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry

from orchestrator.dispatch import QueueDispatcher
from orchestrator.dispatch import queue as dispatch_queue
from orchestrator.skills import create_default_skill_repository
from tests.conftest import workspace_dirs
from tests.integration.conftest import cube_remote_root
from tests.processes import WorkerProcesses, running_with, sleeper, wait_none_with
from tests.services import RedisServer
from worker import defaults
from worker.config import get_worker_settings
from worker.contract import InputFile, RunRequest, RunResult
from worker.run_store import Attempt, RunStatus

LIBRARY = Path(__file__).resolve().parents[2] / "skills"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def repo():
    return create_default_skill_repository(str(LIBRARY))


def burst(url: str, env: dict[str, str], runtime: str = "local") -> None:
    """Drain a runtime's queue with a worker process that exits once the queue is empty."""
    subprocess.run([sys.executable, "-m", "worker", "--redis-url", url, "--burst", "--runtime", runtime],
                   env={**os.environ, **env}, cwd=REPO, check=True, timeout=120)


async def _wait_status(dispatcher: QueueDispatcher, run_id: str, status: RunStatus, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        record = await dispatcher.get(run_id)
        if record is not None and record.status == status:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"run {run_id} never reached {status.value}")


async def test_a_queued_run_is_executed_by_a_worker_with_timings_and_worker_id(redis_url, worker_env, repo):
    dispatcher = QueueDispatcher(redis_url)
    request = RunRequest(
        skill=repo.skill_ref("python-math"), command="python3 scripts/fib.py 6 > out/fib.txt; cat inputs/n.txt",
        output_files=["out/fib.txt"], inputs=[InputFile(name="n.txt", content=b"note")], save_as_artifacts=True,
    )
    record = await dispatcher.submit(request)
    assert record.status == RunStatus.QUEUED
    await asyncio.to_thread(burst, redis_url, worker_env)
    done = await dispatcher.wait(record.id, 5)
    assert done.status == RunStatus.FINISHED
    result = done.result
    assert result.stdout == "note"
    assert result.output_files[0].content.split() == ["0", "1", "1", "2", "3", "5"]
    assert result.worker_id and result.timings.queue_ms > 0 and result.timings.exec_ms > 0
    assert [e.type for e in await dispatcher.events(record.id)] == ["queued", "started", "finished"]
    assert result.artifact_files[0].name == "out/fib.txt"
    await dispatcher.close()


async def test_a_worker_removes_one_off_workspaces_and_keeps_named_ones(redis_url, worker_env, repo, work_root):
    dispatcher = QueueDispatcher(redis_url)
    ref = repo.skill_ref("python-math")
    one_off = [await dispatcher.submit(RunRequest(skill=ref, command="echo x > out/x.txt", output_files=["out/x.txt"]))
               for _ in range(3)]
    failing = await dispatcher.submit(RunRequest(skill=ref, command="true", cwd="/nowhere"))
    named = await dispatcher.submit(RunRequest(skill=ref, command="true", workspace_id="named"))
    await asyncio.to_thread(burst, redis_url, worker_env)
    for record in one_off:
        done = await dispatcher.wait(record.id, 5)
        assert done.status == RunStatus.FINISHED and done.result.output_files[0].content == "x\n"
    assert (await dispatcher.wait(failing.id, 5)).status == RunStatus.FAILED
    assert (await dispatcher.wait(named.id, 5)).status == RunStatus.FINISHED
    assert [p.name.split("_")[1] for p in workspace_dirs(work_root)] == ["named"]
    registry = get_worker_settings().uid_registry
    if os.geteuid() == 0:
        held = [e for e in registry.iterdir() if e.is_symlink() and os.readlink(e).startswith(f"{work_root}/")]
        assert len(held) == 1
    elif os.access(registry, os.R_OK | os.X_OK):  # a normal account's workspaces take no user ids; root's registry
        assert not [e for e in registry.iterdir() if e.is_symlink() and os.readlink(e).startswith(f"{work_root}/")]
    await dispatcher.close()


async def test_a_cube_worker_runs_queued_runs_in_a_sandbox(redis_url, worker_env, repo, cube_standin, shared_dir):
    remote = cube_remote_root(shared_dir, "cube-remote", cube_standin)
    env = {**worker_env, "E2B_API_URL": cube_standin.url, "E2B_SANDBOX_URL": cube_standin.url,
           "E2B_API_KEY": cube_standin.api_key, "CUBE_ROOT": str(remote)}
    dispatcher = QueueDispatcher(redis_url)
    record = await dispatcher.submit(RunRequest(runtime="cube", skill=repo.skill_ref("python-math"), workspace_id="q",
                                                command="python3 scripts/fib.py 4 > out/fib.txt", output_files=["out/*"]))
    await asyncio.to_thread(burst, redis_url, env, "cube")
    result = (await dispatcher.wait(record.id, 5)).result
    assert (result.runtime.value, result.exit_code, result.output_files[0].content.split()) == ("cube", 0, ["0", "1", "1", "2"])
    assert result.stderr == ""
    assert (remote / f"ws_q_{hashlib.sha256(b'q').hexdigest()[:8]}" / "out" / "fib.txt").exists()
    await dispatcher.close()


async def test_host_path_inputs_cannot_travel_over_the_queue(redis_url, repo, tmp_path):
    dispatcher = QueueDispatcher(redis_url)
    request = RunRequest(skill=repo.skill_ref("python-math"), command="true",
                         inputs=[InputFile(name="x", host_path=str(tmp_path))])
    with pytest.raises(Exception, match="host paths cannot travel"):
        await dispatcher.submit(request, trusted=True)
    assert await dispatcher.list() == []
    await dispatcher.close()


async def test_waiting_for_a_result_blocks_until_a_worker_process_finishes_it(redis_url, workers, repo):
    workers.start()
    dispatcher = QueueDispatcher(redis_url)
    result = await dispatcher.run(RunRequest(skill=repo.skill_ref("python-math"), command="echo from a worker process"))
    assert result.stdout == "from a worker process\n"
    await dispatcher.close()


async def test_cancelling_a_started_run_kills_its_processes(redis_url, workers, repo, work_root):
    workers.start()
    dispatcher = QueueDispatcher(redis_url)
    sleep, marker = sleeper()
    request = RunRequest(skill=repo.skill_ref("python-math"), command=sleep, timeout=120, workspace_id="cancel-me")
    record = await dispatcher.submit(request)
    await _wait_status(dispatcher, record.id, RunStatus.STARTED)
    for _ in range(200):
        if running_with(marker):
            break
        await asyncio.sleep(0.05)
    assert running_with(marker)
    await dispatcher.cancel(record.id)
    done = await dispatcher.wait(record.id, 30)
    assert done.status == RunStatus.CANCELLED
    assert "cancelled" in done.result.stderr
    assert wait_none_with(marker), "the cancelled command is still running"
    await dispatcher.close()


async def test_cancelling_a_queued_run_means_it_never_starts(redis_url, worker_env, repo):
    dispatcher = QueueDispatcher(redis_url)
    record = await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command="touch /tmp/should-not-run"))
    cancelled = await dispatcher.cancel(record.id)
    assert cancelled.status == RunStatus.CANCELLED
    await asyncio.to_thread(burst, redis_url, worker_env)
    assert (await dispatcher.get(record.id)).status == RunStatus.CANCELLED
    assert [e.type for e in await dispatcher.events(record.id)] == ["queued", "cancelled"]
    await dispatcher.close()


async def _lose_a_started_run(
    workers: WorkerProcesses, dispatcher: QueueDispatcher, request: RunRequest, command_began: Callable[[], bool] | None = None
) -> str:
    """Submit ``request``, let a worker start it (and its command get as far as ``command_began`` says), then
    SIGKILL that worker; return the run id."""
    victim = workers.start()
    record = await dispatcher.submit(request)
    await _wait_status(dispatcher, record.id, RunStatus.STARTED)
    deadline = time.monotonic() + 30
    while command_began is not None and not command_began():
        assert time.monotonic() < deadline, "the command never began"
        await asyncio.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    return record.id


FIRST_ATTEMPT_HANGS = (
    "if [ -e $WORK_DIR/attempted ]; then echo second attempt; else touch $WORK_DIR/attempted; sleep 60; fi"
)


async def test_a_worker_killed_mid_run_gets_the_run_retried_and_the_caller_can_tell(redis_url, workers, repo, work_root):
    dispatcher = QueueDispatcher(redis_url, max_attempts=2)
    run_id = await _lose_a_started_run(workers, dispatcher, RunRequest(
        skill=repo.skill_ref("python-math"), command=FIRST_ATTEMPT_HANGS, timeout=120, workspace_id="retry-ws"),
        command_began=lambda: any(work_root.glob("ws_retry-ws_*/work/attempted")))
    workers.start()
    done = await dispatcher.wait(run_id, 60)
    assert done.status == RunStatus.FINISHED, done
    assert done.result.stdout == "second attempt\n"
    assert done.attempts == 2
    events = await dispatcher.events(run_id)
    retried = [e for e in events if e.type == "retried"]
    assert len(retried) == 1 and "stopped beating" in retried[0].data["reason"]
    await dispatcher.close()


async def test_a_run_out_of_attempts_fails_with_the_reason_and_a_worker_removes_its_workspace(
    redis_url, workers, repo, work_root
):
    dispatcher = QueueDispatcher(redis_url, max_attempts=1)
    # Killed once its command began: its folder appears before the workspace is laid out and indexed, and a worker
    # killed in between leaves a half-made folder no removal finds by the workspace's id
    run_id = await _lose_a_started_run(
        workers, dispatcher, RunRequest(skill=repo.skill_ref("python-math"), command="touch $WORK_DIR/began; sleep 60",
                                        timeout=120),
        command_began=lambda: any(work_root.glob("ws_*/work/began")))
    done = await dispatcher.wait(run_id, 60)
    assert done.status == RunStatus.FAILED
    assert "stopped beating" in done.error
    assert len(workspace_dirs(work_root)) == 1  # the one-off workspace no attempt ended
    workers.start()
    deadline = time.monotonic() + 60  # a hang guard
    while workspace_dirs(work_root):
        assert time.monotonic() < deadline, "no worker removed the failed run's own workspace"
        await asyncio.sleep(0.1)
    await dispatcher.close()


async def test_queued_runs_survive_a_redis_restart(worker_env, repo):
    server = RedisServer(persistent=True)
    try:
        url = server.url(0)
        dispatcher = QueueDispatcher(url)
        ids = [(await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command=f"echo {i}"))).id
               for i in range(3)]
        await dispatcher.close()
        server.halt()
        server.start()
        dispatcher = QueueDispatcher(url)
        assert {r.id for r in await dispatcher.list(RunStatus.QUEUED)} == set(ids)
        await asyncio.to_thread(burst, url, worker_env)
        results = [await dispatcher.wait(i, 5) for i in ids]
        assert [r.result.stdout for r in results] == ["0\n", "1\n", "2\n"]
        await dispatcher.close()
    finally:
        server.stop()


async def test_a_run_whose_request_cannot_execute_fails_with_the_reason(redis_url, worker_env, repo):
    dispatcher = QueueDispatcher(redis_url)
    ref = repo.skill_ref("python-math").model_copy(update={"path": "no-such-skill"})
    record = await dispatcher.submit(RunRequest(skill=ref, command="true"))
    await asyncio.to_thread(burst, redis_url, worker_env)
    done = await dispatcher.wait(record.id, 5)
    assert done.status == RunStatus.FAILED
    assert "StagingError" in done.error and "no SKILL.md" in done.error
    await dispatcher.close()


async def test_a_priority_run_starts_before_the_runs_queued_ahead_of_it(redis_url, worker_env, repo):
    dispatcher = QueueDispatcher(redis_url)
    normal = [await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command="true")) for _ in range(3)]
    urgent = await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command="true"), priority=True)
    await asyncio.to_thread(burst, redis_url, worker_env)
    started = {r.id: (await dispatcher.get(r.id)).started_at for r in [*normal, urgent]}
    assert min(started, key=started.get) == urgent.id
    await dispatcher.close()


async def test_finished_runs_are_kept_for_the_result_ttl_only(redis_url, worker_env, repo, monkeypatch):
    # Every key of a finished run carries an expiry: at most the result TTL for the run's record and events, RQ's
    # own job summary TTL for the queue's; the run is gone once its TTL passed. (No timed assertion on when the
    # worker finished: under load a short TTL can pass before the test looks.)
    ttl = 5
    monkeypatch.setenv("SKILLRUN_RESULT_TTL_SECONDS", str(ttl))
    dispatcher = QueueDispatcher(redis_url, result_ttl=ttl)
    record = await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command="echo bye"))
    await asyncio.to_thread(burst, redis_url, {**worker_env, "SKILLRUN_RESULT_TTL_SECONDS": str(ttl)})
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(f"*{record.id}*"))
    assert keys, "the finished run left nothing in Redis to read"
    lives = {key.decode(): client.ttl(key) for key in keys}
    for key, life in lives.items():
        bound = ttl if key.startswith("skillrun:") else defaults.JOB_RESULT_TTL_SECONDS
        assert life == -2 or 0 < life <= bound, f"{key} is kept past its TTL ({bound} s): {lives}"
    deadline = time.monotonic() + 30
    while await dispatcher.get(record.id) is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert await dispatcher.get(record.id) is None
    assert await dispatcher.events(record.id) == []
    await dispatcher.close()


async def test_the_sweep_trims_rqs_registry_of_finished_jobs(redis_url):
    dispatcher = QueueDispatcher(redis_url)
    registry = FinishedJobRegistry(queue=dispatcher.queue("local"))
    dispatcher.redis.zadd(registry.key, {"expired-1": time.time() - 1, "kept-1": time.time() + 3600})
    await dispatcher.sweep_lost()
    assert [j.decode() for j in dispatcher.redis.zrange(registry.key, 0, -1)] == ["kept-1"]
    await dispatcher.close()


async def test_closing_ends_the_change_subscription_even_when_redis_swallows_the_cancel(redis_url, monkeypatch):
    # redis-py takes a cancel that lands as a pub/sub read's own timeout expires for that timeout and returns None
    # (seen hanging close() in CI): every read here behaves so, and close() must still end the listener.
    swallowed = []

    async def get_message(self, ignore_subscribe_messages=False, timeout=0.0):
        try:
            return await original(self, ignore_subscribe_messages=ignore_subscribe_messages, timeout=timeout)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()
            swallowed.append(True)
            return None

    original = aioredis.client.PubSub.get_message
    monkeypatch.setattr(aioredis.client.PubSub, "get_message", get_message)
    dispatcher = QueueDispatcher(redis_url)
    with dispatcher.watch("some-run") as changed:
        await asyncio.wait_for(changed.wait(), 10)  # set once subscribed
    await asyncio.wait_for(dispatcher.close(), 10)
    assert swallowed == [True] and dispatcher._background["listen"].done()


async def test_a_cancel_racing_the_finish_loses_neither(redis_url, repo):
    """Both sides update the record at once; the optimistic transaction keeps both changes."""
    dispatcher = QueueDispatcher(redis_url)
    store = dispatcher.store
    for _ in range(20):
        record = await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command="true"))
        held = Attempt.of(store.start(record.id, "w"))
        result = RunResult(exit_code=0, run_id=record.id, workspace_id="w", runtime="local")
        await asyncio.gather(asyncio.to_thread(store.finish, record.id, result, held), dispatcher.cancel(record.id))
        final = await dispatcher.get(record.id)
        assert final.status in {RunStatus.FINISHED, RunStatus.CANCELLED}
        assert final.result is not None
        assert final.status == RunStatus.CANCELLED or not final.cancel_requested
    await dispatcher.close()


async def test_a_lost_run_nobody_reads_is_recovered_by_the_sweep(redis_url, workers, repo):
    dispatcher = QueueDispatcher(redis_url, max_attempts=1)
    run_id = await _lose_a_started_run(
        workers, dispatcher, RunRequest(skill=repo.skill_ref("python-math"), command="sleep 60", timeout=120))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and await dispatcher.sweep_lost() == 0:
        await asyncio.sleep(0.5)
    stored = dispatcher.store.get(run_id)  # read straight from the store: no recovery on the way
    assert stored.status == RunStatus.FAILED and "stopped beating" in stored.error
    await dispatcher.close()


async def test_a_superseded_attempt_can_neither_beat_nor_fail_nor_finish_the_run(redis_url, repo):
    dispatcher = QueueDispatcher(redis_url, max_attempts=2)
    store = dispatcher.store
    record = await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command="true"))
    first = Attempt.of(store.start(record.id, "w"))
    assert store.heartbeat(record.id, first)
    store.redis.delete(store.keys.part(record.id, "heartbeat"))  # the worker is cut off: its heartbeat lapses
    retried = await dispatcher.get(record.id)  # whoever looks next retries the run
    assert (retried.status, retried.attempts) == (RunStatus.QUEUED, 1)
    second = Attempt.of(store.start(record.id, "w"))  # the same worker id, yet a newer attempt
    stale = RunResult(exit_code=1, stdout="stale", run_id=record.id, workspace_id="w", runtime="local")
    assert not store.heartbeat(record.id, first)
    assert store.fail(record.id, "stale", first).status == RunStatus.STARTED
    assert store.finish(record.id, stale, first).status == RunStatus.STARTED
    assert store.heartbeat(record.id, second)
    fresh = RunResult(exit_code=0, stdout="fresh", run_id=record.id, workspace_id="w", runtime="local")
    store.finish(record.id, fresh, second)
    assert store.finish(record.id, stale, first).result.stdout == "fresh"
    done = await dispatcher.get(record.id)
    assert (done.status, done.attempts, done.result.stdout) == (RunStatus.FINISHED, 2, "fresh")
    assert [e.type for e in await dispatcher.events(record.id)] == ["queued", "started", "retried", "started", "finished"]
    await dispatcher.close()


async def test_a_worker_cut_off_mid_run_and_back_after_its_run_was_retried_changes_nothing(redis_url, workers, repo):
    dispatcher = QueueDispatcher(redis_url, max_attempts=2)
    cut_off = workers.start()
    record = await dispatcher.submit(RunRequest(skill=repo.skill_ref("python-math"), command="sleep 2; echo done",
                                                timeout=120))
    await _wait_status(dispatcher, record.id, RunStatus.STARTED)
    cut_off.send_signal(signal.SIGSTOP)  # frozen: no heartbeat, no result, until it is let go
    try:
        workers.start()
        deadline = time.monotonic() + 60
        while (await dispatcher.get(record.id)).attempts < 2:  # retried once its heartbeat lapsed, taken by the other
            assert time.monotonic() < deadline, "the run was never retried"
            await asyncio.sleep(0.05)
    finally:  # back while the newer attempt runs (frozen, it may hold a host-wide lock the other needs)
        cut_off.send_signal(signal.SIGCONT)
    done = await dispatcher.wait(record.id, 60)
    assert (done.status, done.attempts) == (RunStatus.FINISHED, 2), done
    first_job = Job.key_for(f"{record.id}-1")  # a job that returned leaves no summary; one that raised is kept
    deadline = time.monotonic() + 60
    while dispatcher.redis.hget(first_job, "status") not in (None, JobStatus.FAILED.value.encode()):  # it came back, ended
        assert time.monotonic() < deadline, "the cut-off worker never ended its job"
        await asyncio.sleep(0.1)
    final = await dispatcher.get(record.id)
    assert final.model_dump() == done.model_dump()
    events = await dispatcher.events(record.id)
    assert [e.type for e in events] == ["queued", "started", "retried", "started", "finished"]
    assert events[1].data["worker_id"].endswith(f":{cut_off.pid}")
    assert not final.result.worker_id.endswith(f":{cut_off.pid}")
    await dispatcher.close()


async def test_one_api_process_at_a_time_sweeps_and_the_sweep_reads_only_the_started_runs(redis_url, repo, monkeypatch):
    monkeypatch.setattr(dispatch_queue, "SWEEP_LEASE_SECONDS", 600.0)  # held for the whole test by whoever takes it
    first, second = QueueDispatcher(redis_url, max_attempts=1), QueueDispatcher(redis_url, max_attempts=1)
    store = first.store

    async def started(worker: str, beating: bool) -> str:
        record = await first.submit(RunRequest(skill=repo.skill_ref("python-math"), command="true"))
        store.start(record.id, worker)
        if not beating:
            store.redis.delete(store.keys.part(record.id, "heartbeat"))  # its worker died
        return record.id

    ended = await started("w", beating=True)
    store.finish(ended, RunResult(exit_code=0, run_id=ended, workspace_id="w", runtime="local"),
                 Attempt.of(store.get(ended)))
    await first.submit(RunRequest(skill=repo.skill_ref("python-math"), command="true"))  # queued: not looked at
    alive, lost = await started("alive", beating=True), await started("gone", beating=False)
    assert {i.decode() for i in store.redis.zrange(store.keys.running, 0, -1)} == {alive, lost}
    assert await first.reader.silent_runs(dispatch_queue.SWEEP_LIMIT) == [lost]
    assert await second.sweep_lost() == 1  # takes the lease
    assert store.get(lost).status == RunStatus.FAILED and "stopped beating" in store.get(lost).error
    also_lost = await started("gone-too", beating=False)
    assert await first.sweep_lost() == 0  # the other holds the lease
    assert store.get(also_lost).status == RunStatus.STARTED
    assert await second.sweep_lost() == 1
    assert [i.decode() for i in store.redis.zrange(store.keys.running, 0, -1)] == [alive]
    await first.close()
    await second.close()
