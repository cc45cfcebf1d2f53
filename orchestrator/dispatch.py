"""Dispatch: handing run requests to runtimes, and following them.

Every caller (the CLI, the ``skill_run`` tool, the HTTP API) goes through a dispatcher, so moving runs onto a
queue changes one object, not its callers.

* ``InlineDispatcher`` — the embedded default: runs execute in this process, records live in memory.
* ``QueueDispatcher`` — runs go onto Redis with RQ, one queue per runtime (``skillrun:<runtime>``, jobs as JSON), and any
  number of ``skillrun worker`` processes execute them; records live in Redis. Waiting blocks on the run's event
  stream (no polling). A run whose worker died (heartbeat expired) is retried up to ``max_attempts`` and then
  failed with the reason; the events say which.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from typing import Any

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from orchestrator.errors import DispatchError
from worker import defaults
from worker.contract import RunRequest, RunResult, RuntimeName
from worker.consumer import queue_name
from worker.jobs import execute_run
from worker.run_store import BaseRunStore, MemoryRunStore, RedisRunStore, RunEvent, RunRecord, RunStatus
from worker.runtimes import RUNTIME_CLASSES, BaseWorkspaceRuntime, resolve_runtime
from worker.runtimes.base import worker_id

class BaseDispatcher(ABC):
    """Submits runs, follows them, returns their results."""

    store: BaseRunStore

    @abstractmethod
    async def submit(
        self, request: RunRequest, *, trusted: bool = False, priority: bool = False, owner: str | None = None
    ) -> RunRecord:
        """Accept ``request`` for execution. ``trusted`` callers (not a model) may use host paths for inputs;
        ``owner`` (a team) is recorded so that only it sees the run."""

    async def get(self, run_id: str) -> RunRecord | None:
        return await asyncio.to_thread(self.store.get, run_id)

    async def list(self, status: RunStatus | None = None, limit: int = 100, owner: str | None = None) -> list[RunRecord]:
        return await asyncio.to_thread(self.store.list, status, limit, owner)

    async def events(self, run_id: str, after: int = 0, timeout: float = 0.0) -> list[RunEvent]:
        return await asyncio.to_thread(self.store.events, run_id, after, timeout)

    async def wait(self, run_id: str, timeout: float, owner: str | None = None) -> RunRecord | None:
        """The record once done, or as it stands after ``timeout`` seconds; with ``owner``, ``None`` for a run of
        another owner (without waiting)."""
        return await asyncio.to_thread(self.store.wait, run_id, timeout, owner)

    async def cancel(self, run_id: str) -> RunRecord | None:
        return await asyncio.to_thread(self.store.request_cancel, run_id)

    async def queue_depths(self) -> dict[str, int]:
        """Runs waiting to start, per runtime."""
        queued = await self.list(RunStatus.QUEUED, limit=100_000)
        depths: dict[str, int] = {}
        for record in queued:
            depths[record.request.runtime.value] = depths.get(record.request.runtime.value, 0) + 1
        return depths

    async def run(self, request: RunRequest, *, trusted: bool = False) -> RunResult:
        """Submit ``request`` and return its result once done."""
        record = await self.submit(request, trusted=trusted)
        while not record.status.done:
            record = await self.wait(record.id, request.timeout + defaults.JOB_TIMEOUT_MARGIN_SECONDS)
            if record is None:
                raise DispatchError(f"run {request.run_id} disappeared from the run store")
        if record.result is None:
            raise DispatchError(f"run {record.id} {record.status.value}: {record.error or 'no result'}")
        return record.result

    async def close(self) -> None:
        """Release runtimes and connections."""

    async def __aenter__(self) -> "BaseDispatcher":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class InlineDispatcher(BaseDispatcher):
    """Executes runs in this process with runtimes built on first use."""

    def __init__(
        self,
        runtimes: dict[str, BaseWorkspaceRuntime] | None = None,
        runtime_options: dict[str, dict[str, Any]] | None = None,
    ) -> None:
        self._runtimes: dict[str, BaseWorkspaceRuntime] = dict(runtimes or {})
        self._options = runtime_options or {}
        self.store = MemoryRunStore()
        self._tasks: dict[str, asyncio.Task] = {}
        self._who = worker_id()

    def runtime(self, name: str) -> BaseWorkspaceRuntime:
        if name not in self._runtimes:
            self._runtimes[name] = resolve_runtime(name, **self._options.get(name, {}))
        return self._runtimes[name]

    async def submit(
        self, request: RunRequest, *, trusted: bool = False, priority: bool = False, owner: str | None = None
    ) -> RunRecord:
        runtime = self.runtime(request.runtime.value)
        record = self.store.create(request, owner)
        task = asyncio.create_task(self._execute(runtime, request, trusted))
        self._tasks[request.run_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request.run_id, None))
        return record

    async def _execute(
        self, runtime: BaseWorkspaceRuntime, request: RunRequest, trusted: bool, *, reraise: bool = False
    ) -> RunResult | None:
        record = self.store.start(request.run_id, self._who)
        if record is None:
            return None
        try:
            result = await runtime.run(request, allow_host_paths=trusted)
        except Exception as exc:  # bad input or an unusable runtime: the run fails with the reason
            self.store.fail(request.run_id, f"{type(exc).__name__}: {exc}")
            if reraise:
                raise
            return None
        result.worker_id = self._who
        result.timings.queue_ms = round(((record.started_at or 0) - record.created_at) * 1000, 3)
        self.store.finish(request.run_id, result)
        return result

    async def run(self, request: RunRequest, *, trusted: bool = False) -> RunResult:
        """In process there is nothing to wait for: run at once; bad input raises as it is."""
        runtime = self.runtime(request.runtime.value)
        self.store.create(request)
        result = await self._execute(runtime, request, trusted, reraise=True)
        assert result is not None  # a new record is always queued, so it starts
        return result

    async def cancel(self, run_id: str) -> RunRecord | None:
        record = await super().cancel(run_id)
        if record is not None and record.status == RunStatus.STARTED:
            self.runtime(record.request.runtime.value).cancel(run_id)
        return record

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        for runtime in self._runtimes.values():
            await runtime.close()


class QueueDispatcher(BaseDispatcher):
    """Runs through Redis and RQ: ``skillrun worker`` processes execute them."""

    def __init__(
        self, redis_url: str, *, max_attempts: int = defaults.MAX_ATTEMPTS, result_ttl: int = defaults.RESULT_TTL_SECONDS
    ) -> None:
        self.redis = redis.Redis.from_url(redis_url)
        self.store = RedisRunStore(self.redis, result_ttl=result_ttl)
        self.max_attempts = max_attempts
        self.result_ttl = result_ttl

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
            job_id=f"{record.id}-{record.attempts + 1}",
            timeout=int(record.request.timeout + defaults.JOB_TIMEOUT_MARGIN_SECONDS),
            result_ttl=defaults.JOB_RESULT_TTL_SECONDS, failure_ttl=self.result_ttl, at_front=priority,
            pipeline=pipe,
        )

    async def get(self, run_id: str) -> RunRecord | None:
        return await asyncio.to_thread(self._checked, run_id)

    async def wait(self, run_id: str, timeout: float, owner: str | None = None) -> RunRecord | None:
        deadline = time.monotonic() + timeout
        while True:
            record = await asyncio.to_thread(self.store.wait, run_id, max(deadline - time.monotonic(), 0), owner)
            if record is not None and not record.status.done:
                record = await asyncio.to_thread(self._checked, run_id)
            if record is None or record.status.done or time.monotonic() >= deadline:
                return record

    def _checked(self, run_id: str) -> RunRecord | None:
        """The record, after recovering it if its worker was lost (retried, or failed once out of attempts)."""
        record = self.store.get(run_id)
        if record is None or record.status != RunStatus.STARTED or self.store.alive(record):
            return record
        record, requeue = self.store.requeue_lost(run_id, self.max_attempts)
        if requeue and record is not None:
            self._enqueue(record, priority=True)
        return record

    async def sweep_lost(self) -> int:
        """Recover every started run whose worker stopped beating (retried or failed); return how many."""

        def sweep() -> int:
            recovered = 0
            for record in self.store.list(RunStatus.STARTED, limit=10_000):
                if not self.store.alive(record):
                    self._checked(record.id)
                    recovered += 1
            return recovered

        return await asyncio.to_thread(sweep)

    async def queue_depths(self) -> dict[str, int]:
        def count() -> dict[str, int]:
            return {runtime.value: self.queue(runtime.value).count for runtime in RuntimeName}

        return await asyncio.to_thread(count)

    async def close(self) -> None:
        self.redis.close()
