"""``QueueDispatcher``: runs go onto Redis with RQ, one queue per runtime (``skillrun:<runtime>``, jobs as JSON), and
any number of ``skillrun worker`` processes execute them; records live in Redis.

A run whose worker died (heartbeat expired) is retried up to ``max_attempts`` and then failed with the reason; the
events say which. The sweep finds such runs every ``SWEEP_SECONDS`` — the started runs only, in one bounded query,
in one process at a time (a lease) — and its change wakes the run's waiters (the same process trims RQ's registries of
finished jobs); when the change subscription drops
(Redis went away) every waiter looks again.

A worker killed after taking a run's job off the queue and before starting the run leaves the run queued with its job
in no list (RQ pops it; a started-job registry entry of a dead worker expires into RQ's failed jobs). The same sweep
looks at the runs queued for ``STRANDED_SECONDS`` or more: one whose job is neither waiting in its queue nor held by a
worker, seen so in two sweeps at least ``STRANDED_SECONDS`` apart, gets its job back at the front of the queue (event
``requeued``). A job that only looked lost is harmless twice: a run starts once (``store.start``).

A kept workspace lives on the workers of its runtime: its removal (asked for, or idle — looked for after each sweep,
in one process at a time) is a job on that runtime's workspaces queue (``skillrun:<runtime>:workspaces``,
``worker.jobs.remove_kept_workspace``), and the workspace is listed ``removing`` until a worker has removed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
import uuid

import redis
import redis.asyncio as aioredis
from rq import Queue
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from orchestrator.dispatch.base import BaseDispatcher, Removal, redis_errors, workspace_refusals
from orchestrator.errors import DispatchError
from worker import defaults
from worker.consumer import queue_name, workspaces_queue_name
from worker.contract import RunRequest, RuntimeName
from worker.jobs import execute_run, remove_kept_workspace, remove_lost_runs_workspace
from worker.run_store import (
    AsyncRunReader,
    RedisRunStore,
    RunEvent,
    RunRecord,
    RunStatus,
    RunWaiters,
    WorkspaceEntry,
)
from worker.runtimes import RUNTIME_CLASSES
from worker.runtimes.base import worker_id

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 5.0
SOCKET_TIMEOUT_SECONDS = 30.0
ASYNC_CONNECTIONS = 64
"""Connections to Redis the async side of an API process uses at most (the change subscription holds one)."""
SWEEP_SECONDS = 5.0
"""How often the lost-run sweep runs (in whichever process holds its lease)."""
SWEEP_LIMIT = 1000
"""Started runs the lost-run sweep looks at in one go (oldest first)."""
SWEEP_LEASE_SECONDS = 5.0
"""How long one API process holds the sweep: the others skip it meanwhile."""
REMOVAL_JOB_SECONDS = 300
"""Longest a worker may take to remove one workspace."""
STRANDED_SECONDS = 30.0
"""How long a queued run's job must be missing (and the run queued before) until the sweep puts it back."""
STRANDED_MARK = "skillrun:stranded:{}"
"""When the sweep first saw a job missing (by job id; expires after ``STRANDED_MARK_SECONDS``)."""
STRANDED_MARK_SECONDS = 3600
WAITING_PAGE = 5000
"""Job ids read from a queue per round trip when the sweep looks which are waiting."""


def job_id_of(record: RunRecord) -> str:
    """The RQ job id of a queued run's next attempt."""
    return f"{record.id}-{record.attempts + 1}"


class QueueDispatcher(BaseDispatcher):
    """Runs through Redis and RQ: ``skillrun worker`` processes execute them."""

    def __init__(
        self, redis_url: str, *, max_attempts: int = defaults.MAX_ATTEMPTS, result_ttl: int = defaults.RESULT_TTL_SECONDS,
        workspace_limit: int | None = None, workspace_idle_seconds: float | None = None,
    ) -> None:
        """An owner keeps ``workspace_limit`` workspaces at most, each removed once unused for
        ``workspace_idle_seconds``."""
        timeouts = {"socket_connect_timeout": CONNECT_TIMEOUT_SECONDS, "socket_timeout": SOCKET_TIMEOUT_SECONDS}
        self.redis = redis.Redis.from_url(redis_url, **timeouts)
        self.store = RedisRunStore(self.redis, result_ttl=result_ttl, workspace_limit=workspace_limit)
        self.workspace_idle_seconds = workspace_idle_seconds
        self.waiters = RunWaiters()
        pool = aioredis.BlockingConnectionPool.from_url(  # a burst of looks waits for a connection, opens no more
            redis_url, max_connections=ASYNC_CONNECTIONS, timeout=SOCKET_TIMEOUT_SECONDS, **timeouts)
        self.reader = AsyncRunReader(aioredis.Redis.from_pool(pool), self.waiters, self.store.keys)
        self.max_attempts = max_attempts
        self.result_ttl = result_ttl
        self._background: dict[str, asyncio.Task] = {}
        self._holder = f"{worker_id()}:{uuid.uuid4().hex[:8]}"

    def queue(self, runtime: str) -> Queue:
        return Queue(queue_name(runtime), connection=self.redis, serializer=JSONSerializer)

    async def submit(
        self, request: RunRequest, *, trusted: bool = False, priority: bool = False, owner: str | None = None
    ) -> RunRecord:
        if any(item.host_path is not None for item in request.inputs):
            raise DispatchError("inputs with host paths cannot travel over the queue; send their content")
        if request.runtime.value not in RUNTIME_CLASSES:
            raise DispatchError(f"runtime {request.runtime.value!r} is not available in this installation "
                                f"(available: {', '.join(sorted(RUNTIME_CLASSES))})")
        with redis_errors(), workspace_refusals():
            return await asyncio.to_thread(self._submit, request, priority, owner)

    def _submit(self, request: RunRequest, priority: bool, owner: str | None) -> RunRecord:
        record = self.store.reserve(request, owner)
        with self.redis.pipeline(transaction=True) as pipe:  # enqueued and announced in one round trip
            self._enqueue(record, priority, pipe)  # first: RQ starts the transaction (MULTI) itself
            self.store.announce(pipe, record)
            pipe.execute()
        return record

    def _enqueue(self, record: RunRecord, priority: bool = False, pipe: redis.client.Pipeline | None = None) -> None:
        self.queue(record.request.runtime.value).enqueue_call(
            execute_run, args=(record.id,),
            job_id=job_id_of(record),
            timeout=int(record.request.timeout + defaults.JOB_TIMEOUT_MARGIN_SECONDS),
            result_ttl=defaults.JOB_RESULT_TTL_SECONDS, failure_ttl=self.result_ttl, at_front=priority,
            pipeline=pipe,
        )

    def start(self) -> None:
        for name, work in (("listen", self.reader.listen), ("sweep", self._sweep_forever)):
            if name not in self._background or self._background[name].done():
                self._background[name] = asyncio.create_task(work(), name=f"skillrun-{name}")

    def watch(self, run_id: str) -> contextlib.AbstractContextManager[asyncio.Event]:
        self.start()
        return super().watch(run_id)

    async def look(self, run_id: str) -> RunRecord | None:
        with redis_errors():
            record, beating = await self.reader.get_beating(run_id)
        if record is None or record.status != RunStatus.STARTED or beating:
            return record
        return await self._recover(run_id)

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        with redis_errors():
            return await self.reader.events(run_id, after)

    async def ping(self) -> None:
        with redis_errors():
            await self.reader.ping()

    async def _recover(self, run_id: str) -> RunRecord | None:
        """A started run whose heartbeat is gone: retried (enqueued again) or failed, in a short thread (RQ is sync)."""

        def recover() -> RunRecord | None:
            record, requeue = self.store.requeue_lost(run_id, self.max_attempts)
            if requeue and record is not None:
                self._enqueue(record, priority=True)
            elif record is not None and record.status == RunStatus.FAILED and not record.request.keep_workspace:
                # No attempt ended it on a worker: one of its runtime's workers removes its own workspace
                Queue(workspaces_queue_name(record.request.runtime.value), connection=self.redis,
                      serializer=JSONSerializer).enqueue_call(
                    remove_lost_runs_workspace, args=(record.id,), job_id=f"lost-{record.id}",
                    timeout=REMOVAL_JOB_SECONDS, result_ttl=0, failure_ttl=REMOVAL_JOB_SECONDS)
            return record

        with redis_errors():
            return await asyncio.to_thread(recover)

    async def sweep_lost(self) -> int:
        """Recover the started runs whose worker stopped beating (retried or failed); return how many. One bounded
        query over the started runs only, and in one API process at a time (a lease in Redis)."""
        with redis_errors():
            if not await self.reader.take_lease("sweep", self._holder, SWEEP_LEASE_SECONDS):
                return 0
            silent = await self.reader.silent_runs(SWEEP_LIMIT)
            await asyncio.to_thread(self._trim_finished_jobs)
            await asyncio.to_thread(self.requeue_stranded)
        recovered = 0
        for run_id in silent:
            record = await self._recover(run_id)
            recovered += record is not None and record.status != RunStatus.STARTED
        return recovered

    def _trim_finished_jobs(self) -> None:
        """Take the jobs whose summary expired out of RQ's finished-job registries (RQ's workers do it only every 10
        minutes, so the registries grew with every run meanwhile)."""
        for runtime in RuntimeName:
            FinishedJobRegistry(queue=self.queue(runtime.value)).cleanup()

    def requeue_stranded(self) -> list[str]:
        """Put back the jobs of queued runs that nothing holds (see the module); return those runs' ids."""
        now = time.time()
        stale = self.store.waiting_since(now - STRANDED_SECONDS, SWEEP_LIMIT)
        requeued = []
        for runtime in {record.request.runtime.value for record in stale}:
            queue = self.queue(runtime)
            held, expired = self._started_job_ids(queue, now)
            waiting = self._waiting_job_ids(queue)
            for record in (r for r in stale if r.request.runtime.value == runtime):
                job_id = job_id_of(record)
                mark = STRANDED_MARK.format(job_id)
                if job_id in held or job_id in waiting or self.redis.set(mark, now, nx=True, ex=STRANDED_MARK_SECONDS):
                    continue  # held, or first seen missing: a worker may be about to start it
                if now - float(self.redis.get(mark) or now) < STRANDED_SECONDS:
                    continue
                back = self.store.requeue_stranded(record.id, "its job was lost: the worker that took it stopped "
                                                               "before starting it")
                if back is not None:  # out of where RQ left the dead worker's job, first
                    FailedJobRegistry(queue=queue).remove(job_id)
                    if expired.get(job_id):
                        self.redis.zrem(StartedJobRegistry(queue=queue).key, *expired[job_id])
                    self._enqueue(back, priority=True)
                    requeued.append(back.id)
                self.redis.delete(mark)
        return requeued

    def _started_job_ids(self, queue: Queue, now: float) -> tuple[set[str], dict[str, list[bytes]]]:
        """The jobs a live worker holds, and the registry entries of the ones whose worker stopped renewing them
        (by job id). RQ's cleanup fails the expired jobs that had started; one whose worker died before its work
        horse started it stays in the registry, expired, for good."""
        registry = StartedJobRegistry(queue=queue)
        registry.cleanup()
        held: set[str] = set()
        expired: dict[str, list[bytes]] = {}
        for entry, expires in self.redis.zrange(registry.key, 0, -1, withscores=True):
            job_id = registry.parse_job_id(entry.decode())
            if expires > now:
                held.add(job_id)
            else:
                expired.setdefault(job_id, []).append(entry)
        return held, expired

    def _waiting_job_ids(self, queue: Queue) -> set[str]:
        ids: set[str] = set()
        start = 0
        while True:
            page = self.redis.lrange(queue.key, start, start + WAITING_PAGE - 1)
            ids.update(job_id.decode() for job_id in page)
            if len(page) < WAITING_PAGE:
                return ids
            start += WAITING_PAGE

    async def _sweep_forever(self) -> None:
        # Ends on close()'s flag, not only its cancel: a cancel can be taken for a Redis call's own timeout and lost
        while not self.reader.stopping:
            await asyncio.sleep(SWEEP_SECONDS)
            if self.reader.stopping:
                return
            try:
                await self.sweep_lost()
                await self.expire_idle_workspaces()
            except Exception:  # Redis away for a moment: try again at the next sweep
                logger.warning("sweeping lost runs or idle workspaces failed", exc_info=True)

    async def expire_idle_workspaces(self) -> int:
        """As every dispatcher does, in one API process at a time (a lease)."""
        with redis_errors():
            if not await self.reader.take_lease("workspaces", self._holder, SWEEP_LEASE_SECONDS):
                return 0
        return await super().expire_idle_workspaces()

    async def _remove_marked(self, entry: WorkspaceEntry) -> Removal:
        with redis_errors():
            await asyncio.to_thread(self._enqueue_removal, entry)
        return "removing"

    def _enqueue_removal(self, entry: WorkspaceEntry) -> None:
        """One removal job per workspace at a time (its id is the workspace's); one that ended is replaced."""
        queue = Queue(workspaces_queue_name(entry.runtime.value), connection=self.redis, serializer=JSONSerializer)
        job_id = f"workspace-{hashlib.sha256(entry.id.encode()).hexdigest()[:32]}"
        for _ in range(2):
            try:
                queue.enqueue_call(remove_kept_workspace, args=(entry.id,), job_id=job_id, timeout=REMOVAL_JOB_SECONDS,
                                   result_ttl=0, failure_ttl=REMOVAL_JOB_SECONDS, unique=True)
                return
            except DuplicateJobError:
                with contextlib.suppress(NoSuchJobError):
                    job = Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer)
                    if job.get_status(refresh=False) in (JobStatus.QUEUED, JobStatus.STARTED):
                        return
                    job.delete()

    async def queue_depths(self) -> dict[str, int]:
        def count() -> dict[str, int]:
            return {runtime.value: self.queue(runtime.value).count for runtime in RuntimeName}

        with redis_errors():
            return await asyncio.to_thread(count)

    async def close(self) -> None:
        self.reader.stop()
        for task in self._background.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.reader.close()
        self.redis.close()
