"""``QueueDispatcher``: runs go onto Redis with RQ, one queue per runtime (``skillrun:<runtime>``, jobs as JSON), and
any number of ``skillrun worker`` processes execute them; records live in Redis.

A run whose worker died (heartbeat expired) is retried up to ``max_attempts`` and then failed with the reason; the
events say which. The sweep finds such runs every ``SWEEP_SECONDS`` — the started runs only, in one bounded query,
in one process at a time (a lease) — and its change wakes the run's waiters (the same process trims RQ's registries of
finished jobs, and takes the runs whose records expired out of the run indexes: they end with their records even when
no later run ends); when the change subscription drops (Redis went away) every waiter looks again.

The same sweep puts back the jobs of queued runs that a dying worker took and never started
(``orchestrator.dispatch.stranded``). Runs of a kept workspace go to the queue of the node it lives on
(``orchestrator.dispatch.placement``). On every queue the teams take turns (``worker.jobs.fair_queue``): a team's runs
past its turn wait in its own line, which the same sweep keeps moving; a submission is held to its team's quota
(``orchestrator.quotas``) in the transaction that enqueues it.

A kept workspace lives on the workers of its node: its removal (asked for, or idle — looked for after each sweep,
in one process at a time) is a job on that node's queue (on the runtime's workspaces queue,
``skillrun:<runtime>:workspaces``, while it was never placed; ``worker.jobs.execute.remove_kept_workspace``), and the
workspace is listed ``removing`` until a worker has removed it. Gone nodes are forgotten after a week.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import uuid

import redis
import redis.asyncio as aioredis
from rq import Queue, Worker
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry
from rq.serializers import JSONSerializer

from orchestrator.dispatch.base import (
    BaseDispatcher,
    Removal,
    WorkerStatus,
    artifact_refusals,
    redis_errors,
    workspace_refusals,
)
from orchestrator.dispatch.placement import Placement
from orchestrator.dispatch.stranded import StrandedRuns, job_id_of
from orchestrator.errors import DispatchError
from orchestrator.quotas import TeamQuota, queued_refusal
from worker import defaults
from worker.contract import RunRequest, RuntimeName
from worker.jobs import (
    FairQueue,
    TeamGate,
    execute_run,
    node_queue_name,
    queue_name,
    remove_kept_workspace,
    remove_lost_runs_workspace,
    team_of,
    worker_beat_key,
    workspaces_queue_name,
)
from worker.run_store import (
    AsyncRunReader,
    RedisRunStore,
    RunEvent,
    RunRecord,
    RunStatus,
    RunWaiters,
    WorkspaceEntry,
    joining,
)
from worker.runtimes import RUNTIME_CLASSES, worker_id

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
TRIM_PER_SWEEP = 1000
"""Runs whose records expired one sweep takes out of the run indexes at most (the runs that end take them too)."""
REMOVAL_JOB_SECONDS = 300
"""Longest a worker may take to remove one workspace."""


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
        self.gate = TeamGate(self.redis, self.store.keys.team_running)
        self.placement = Placement(self.redis, self.store.workspaces, self.gate)
        self.stranded = StrandedRuns(self.redis, self.store, self.placement, lambda record: self._enqueue(record, True))

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
        quota = await self._checked(request, owner)
        with redis_errors(), workspace_refusals(), artifact_refusals(self.store.artifact_ttl):
            return await asyncio.to_thread(self._submit, request, priority, owner, quota)

    def _submit(self, request: RunRequest, priority: bool, owner: str | None, quota: TeamQuota | None) -> RunRecord:
        request = joining(self.store.workspaces, request)  # a run naming a kept workspace is one of its runs
        node = self.placement.propose(request) if request.keep_workspace else None
        limit = quota.max_queued if quota is not None and owner is not None else 0
        if limit and self.redis.zcard(self.store.keys.team_waiting(owner)) >= limit:  # nothing stored at its quota
            raise queued_refusal(owner, limit, self._run_seconds())
        record = self.store.reserve(request, owner, node, joined=True,
                                    workspace_limit=quota.max_workspaces if quota is not None else None)
        try:
            self._admit(record, priority, limit, quota.max_running if quota is not None else 0,
                        quota.max_artifact_bytes if quota is not None else None)
        except BaseException:
            self.store.unreserve(record)
            raise
        return record

    def _admit(self, record: RunRecord, priority: bool, limit: int, cap: int, artifact_limit: int | None) -> None:
        """Enqueue and announce a reserved run in one transaction; with a quota of ``limit`` queued runs, only while
        its team has fewer queued (``QuotaExceededError``), and with a quota of ``artifact_limit`` bytes of stored
        artifacts, holding the room it is given in the same transaction (``RedisRunStore.hold_room``:
        ``ArtifactRoomRefusedError`` when none is left). What those count is watched, and the transaction is tried
        again when another submission, or a run that ended, changed it meanwhile."""
        waiting = self.store.keys.team_waiting(record.owner or "")
        asked = record.request.limits.artifact_total_bytes
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    if limit:
                        pipe.watch(waiting)
                        if pipe.zcard(waiting) >= limit:
                            raise queued_refusal(record.owner or "", limit, self._run_seconds())
                    self.store.hold_room(pipe, record, artifact_limit, asked)
                    pipe.multi()
                    self._enqueue(record, priority, pipe, cap=cap, fresh=True)
                    self.store.announce(pipe, record)
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    def _run_seconds(self) -> float:
        """How long runs take, on average (what a refused team is told to wait)."""
        stats = self.store.stats()
        ended = sum(stats["duration_buckets"].values())
        return stats["duration_sum"] / ended if ended else 5.0

    def _enqueue(self, record: RunRecord, priority: bool = False, pipe: redis.client.Pipeline | None = None, *,
                 cap: int = 0, fresh: bool = False) -> bool:
        """Put the run's next attempt on its queue; ``False`` (and the run failed) when it can never start there.
        A ``fresh`` run (just submitted) takes its team's turn (``worker.jobs.fair_queue``, under a ``cap`` on its team's
        runs at once); any other (a retry, a job put back) goes to the queue's front when ``priority``."""
        name, lost = self.placement.queue_of(record)
        if lost is not None and pipe is None:
            self.store.fail_waiting(record.id, lost)
            return False
        team = team_of(record.owner)
        queue = FairQueue(name, self.gate, team, cap=cap) if fresh else \
            Queue(name, connection=self.redis, serializer=JSONSerializer)
        queue.enqueue_call(
            execute_run, args=(record.id, record.request.workspace_id if record.request.keep_workspace else None, team),
            job_id=job_id_of(record),
            timeout=int(record.request.timeout + defaults.JOB_TIMEOUT_MARGIN_SECONDS),
            result_ttl=defaults.JOB_RESULT_TTL_SECONDS, failure_ttl=self.result_ttl, at_front=priority,
            pipeline=pipe,
        )
        return True

    def start(self) -> None:
        for name, work in (("listen", self.reader.listen), ("sweep", self._sweep_forever)):
            if name not in self._background or self._background[name].done():
                self._background[name] = asyncio.create_task(work(), name=f"skillrun-{name}")

    def watch(self, run_id: str, ends_only: bool = False) -> contextlib.AbstractContextManager[asyncio.Event]:
        self.start()
        return super().watch(run_id, ends_only)

    async def cancel(self, run_id: str) -> RunRecord | None:
        """As every dispatcher does; a run cancelled before it started leaves its queue or its team's line at once,
        its job with it."""
        record = await super().cancel(run_id)
        if record is not None and record.status == RunStatus.CANCELLED and record.started_at is None:
            with redis_errors():
                await asyncio.to_thread(self._withdraw, record)
        return record

    def _withdraw(self, record: RunRecord) -> None:
        name, _ = self.placement.queue_of(record)
        job_id = job_id_of(record)
        if self.gate.withdraw(name, team_of(record.owner), job_id):
            with contextlib.suppress(NoSuchJobError):
                Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer).delete(remove_from_queue=False)

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
            if requeue and record is not None and not self._enqueue(record, priority=True):
                return self.store.get(run_id)  # its workspace's node is gone: failed, with why
            if record is not None and record.status == RunStatus.FAILED and not record.request.keep_workspace:
                # No attempt ended it on a worker: one of its node's workers removes its own workspace
                runtime = record.request.runtime.value
                Queue(node_queue_name(runtime, record.node) if record.node else workspaces_queue_name(runtime),
                      connection=self.redis, serializer=JSONSerializer).enqueue_call(
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
            await asyncio.to_thread(self.store.trim_expired, TRIM_PER_SWEEP)
            await asyncio.to_thread(self.requeue_stranded)
            await asyncio.to_thread(self.gate.sweep)
        recovered = 0
        for run_id in silent:
            record = await self._recover(run_id)
            recovered += record is not None and record.status != RunStatus.STARTED
        return recovered

    def _trim_finished_jobs(self) -> None:
        """Take the jobs whose summary expired out of RQ's finished-job registries, the shared queues' and the nodes'
        (RQ's workers do it only every 10 minutes, so the registries grew with every run meanwhile); forget the nodes
        gone for a week."""
        for runtime in RuntimeName:
            self.placement.forget_gone(runtime.value)
            alive, gone = self.placement.nodes(runtime.value)
            for name in (queue_name(runtime.value), *(node_queue_name(runtime.value, n) for n in alive + gone)):
                FinishedJobRegistry(queue=Queue(name, connection=self.redis, serializer=JSONSerializer)).cleanup()

    def requeue_stranded(self) -> list[str]:
        """Put back the jobs of queued runs that nothing holds, fail those of gone nodes (``stranded``); return the
        runs put back."""
        return self.stranded.sweep()

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
            return await asyncio.to_thread(self._enqueue_removal, entry)

    def _enqueue_removal(self, entry: WorkspaceEntry) -> Removal:
        """One removal job per workspace at a time (its id is the workspace's), on its node; one that ended is
        replaced. A workspace whose node is gone went with it: its entry is forgotten."""
        name = self.placement.removal_queue_of(entry, workspaces_queue_name(entry.runtime.value))
        if name is None:
            self.store.workspaces.forget(entry.id)
            return "removed"
        queue = Queue(name, connection=self.redis, serializer=JSONSerializer)
        job_id = f"workspace-{hashlib.sha256(entry.id.encode()).hexdigest()[:32]}"
        for _ in range(2):
            try:
                queue.enqueue_call(remove_kept_workspace, args=(entry.id,), job_id=job_id, timeout=REMOVAL_JOB_SECONDS,
                                   result_ttl=0, failure_ttl=REMOVAL_JOB_SECONDS, unique=True)
                return "removing"
            except DuplicateJobError:
                with contextlib.suppress(NoSuchJobError):
                    job = Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer)
                    if job.get_status(refresh=False) in (JobStatus.QUEUED, JobStatus.STARTED):
                        return "removing"
                    job.delete()
        return "removing"

    async def queue_depths(self) -> dict[str, int]:
        def count() -> dict[str, int]:
            return {runtime.value: self.queue(runtime.value).count + self.gate.depth(queue_name(runtime.value))
                    for runtime in RuntimeName}

        with redis_errors():
            return await asyncio.to_thread(count)

    async def workers(self) -> list[WorkerStatus]:
        """The queue's workers as RQ registers them, each alive while its own beat lasts."""
        def read() -> list[WorkerStatus]:
            found = Worker.all(connection=self.redis, serializer=JSONSerializer)
            with self.redis.pipeline(transaction=False) as pipe:
                for worker in found:
                    pipe.exists(worker_beat_key(worker.name))
                beating = pipe.execute()
            return [WorkerStatus(name=w.name, queues=w.queue_names(), state=str(w.get_state()),
                                 last_heartbeat=w.last_heartbeat.timestamp() if w.last_heartbeat else None,
                                 alive=bool(beat), current_run=w.get_current_job_id())
                    for w, beat in zip(found, beating, strict=True)]

        with redis_errors():
            return sorted(await asyncio.to_thread(read), key=lambda w: w.name)

    async def close(self) -> None:
        self.reader.stop()
        for task in self._background.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.reader.close()
        self.redis.close()
