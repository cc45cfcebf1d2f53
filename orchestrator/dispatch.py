"""Dispatch: handing run requests to runtimes, and following them.

Every caller (the CLI, the ``skill_run`` tool, the HTTP API) goes through a dispatcher, so moving runs onto a
queue changes one object, not its callers.

* ``InlineDispatcher`` — the embedded default: runs execute in this process, records live in memory.
* ``QueueDispatcher`` — runs go onto Redis with RQ, one queue per runtime (``skillrun:<runtime>``, jobs as JSON), and any
  number of ``skillrun worker`` processes execute them; records live in Redis. A run whose worker died (heartbeat
  expired) is retried up to ``max_attempts`` and then failed with the reason; the events say which.

Waiting for a run and following its events are async I/O (``redis.asyncio``; the waiters of a process are woken from
one pub/sub subscription): no thread is held per waiter. A run whose worker stopped beating is found by the sweep
(every ``SWEEP_SECONDS``, one process at a time) whose change wakes its waiters; when the subscription drops (Redis
went away) every waiter looks again, and finds a record that vanished (``RunLostError``: lost, not unknown). A
waiter also looks now and then (``LOOK_SECONDS``, spread out) in case a change was missed. Redis unreachable is
``UnavailableError`` (with a ``retry_after``); a wait rides out an outage of up to ``OUTAGE_GRACE_SECONDS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Iterator
from typing import Any

import redis
import redis.asyncio as aioredis
from rq import Queue
from rq.serializers import JSONSerializer

from orchestrator.errors import DispatchError, RunLostError, UnavailableError
from worker import defaults
from worker.consumer import queue_name
from worker.contract import RunRequest, RunResult, RuntimeName
from worker.jobs import execute_run
from worker.run_store import (
    ENDING_EVENTS,
    AsyncRunReader,
    Attempt,
    BaseRunStore,
    MemoryRunStore,
    RedisRunStore,
    RunEvent,
    RunRecord,
    RunStatus,
    RunWaiters,
)
from worker.runtimes import RUNTIME_CLASSES, BaseWorkspaceRuntime, resolve_runtime
from worker.runtimes.base import worker_id

logger = logging.getLogger(__name__)

LOOK_SECONDS = 30.0
"""Longest a waiter sleeps without looking at its run, whatever it was told (spread between half and all of it, so
that a thousand waits opened at once do not look at once)."""
OUTAGE_GRACE_SECONDS = 10.0
"""How long a wait rides out Redis being away before it answers ``UnavailableError``."""
OUTAGE_RETRY_SECONDS = 1.0
RETRY_AFTER_SECONDS = 5
"""What callers are told to wait before trying again while Redis is away."""
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


def _look_after() -> float:
    return random.uniform(LOOK_SECONDS / 2, LOOK_SECONDS)


@contextlib.contextmanager
def redis_errors() -> Iterator[None]:
    """Redis unreachable (refused, timed out, still loading its data) as ``UnavailableError``."""
    try:
        yield
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise UnavailableError(f"Redis (run records and the queue) cannot be reached: {exc}", RETRY_AFTER_SECONDS) from exc


class BaseDispatcher(ABC):
    """Submits runs, follows them, returns their results."""

    store: BaseRunStore
    waiters: RunWaiters
    result_ttl: int | None = None
    """How long ended runs' records are kept (``None``: as long as the store lives)."""
    stopping = False
    """Set by ``stop_waiting``: waits answer at once, followers end."""

    @abstractmethod
    async def submit(
        self, request: RunRequest, *, trusted: bool = False, priority: bool = False, owner: str | None = None
    ) -> RunRecord:
        """Accept ``request`` for execution. ``trusted`` callers (not a model) may use host paths for inputs;
        ``owner`` (a team) is recorded so that only it sees the run."""

    @abstractmethod
    async def look(self, run_id: str) -> RunRecord | None:
        """The record, after recovering it if its worker was lost (retried, or failed once out of attempts)."""

    @abstractmethod
    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        """The run's events after the first ``after`` ones."""

    async def get(self, run_id: str) -> RunRecord | None:
        return await self.look(run_id)

    async def list(self, status: RunStatus | None = None, limit: int = 100, owner: str | None = None) -> list[RunRecord]:
        with redis_errors():
            return await asyncio.to_thread(self.store.list, status, limit, owner)

    async def cancel(self, run_id: str) -> RunRecord | None:
        with redis_errors():
            return await asyncio.to_thread(self.store.request_cancel, run_id)

    async def ping(self) -> None:
        """Raise ``UnavailableError`` when the run store cannot be reached."""

    def start(self) -> None:
        """Begin the background work (a queue dispatcher's change subscription and lost-run sweep), in the running
        loop; the first wait begins it too."""

    def watch(self, run_id: str) -> contextlib.AbstractContextManager[asyncio.Event]:
        return self.waiters.watch(run_id)

    def stop_waiting(self) -> None:
        """The process is going: every wait answers with the record as it stands, every follower ends."""
        self.stopping = True
        self.waiters.notify_all()

    async def wait(self, run_id: str, timeout: float, owner: str | None = None) -> RunRecord | None:
        """The record once done, or as it stands after ``timeout`` seconds; ``None`` for no such run (and, with
        ``owner``, for another owner's run, without waiting). ``RunLostError`` when the record vanishes meanwhile."""
        deadline = time.monotonic() + timeout
        seen = False
        with self.watch(run_id) as changed:
            while True:
                changed.clear()
                record = await self._look_through_outage(run_id)
                if record is None:
                    if seen:
                        raise RunLostError(run_id)
                    return None
                if owner is not None and record.owner != owner:
                    return None
                seen = True
                remaining = deadline - time.monotonic()
                if record.status.done or remaining <= 0 or self.stopping:
                    return record
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), min(remaining, _look_after()))

    async def follow(self, run_id: str) -> AsyncIterator[RunEvent]:
        """The run's events as they happen, until the one that ends it; ``RunLostError`` when the run vanishes."""
        seen = 0
        with self.watch(run_id) as changed:
            while True:
                changed.clear()
                events = await self.events(run_id, seen)
                for event in events:
                    yield event
                seen += len(events)
                if self.stopping or any(event.type in ENDING_EVENTS for event in events):
                    return
                try:
                    await asyncio.wait_for(changed.wait(), _look_after())
                except asyncio.TimeoutError:
                    if await self._look_through_outage(run_id) is None:
                        raise RunLostError(run_id) from None

    async def _look_through_outage(self, run_id: str) -> RunRecord | None:
        give_up = time.monotonic() + OUTAGE_GRACE_SECONDS
        while True:
            try:
                return await self.look(run_id)
            except UnavailableError:
                if time.monotonic() >= give_up:
                    raise
                await asyncio.sleep(OUTAGE_RETRY_SECONDS)

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
        self.waiters = RunWaiters()
        self.store = MemoryRunStore(on_change=self.waiters.notify_threadsafe)
        self._tasks: dict[str, asyncio.Task] = {}
        self._who = worker_id()

    def runtime(self, name: str) -> BaseWorkspaceRuntime:
        if name not in self._runtimes:
            self._runtimes[name] = resolve_runtime(name, **self._options.get(name, {}))
        return self._runtimes[name]

    async def look(self, run_id: str) -> RunRecord | None:
        return self.store.get(run_id)

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        return self.store.events(run_id, after)

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
        held = Attempt.of(record)
        try:
            result = await runtime.run(request, allow_host_paths=trusted)
        except Exception as exc:  # bad input or an unusable runtime: the run fails with the reason
            self.store.fail(request.run_id, f"{type(exc).__name__}: {exc}", held)
            if reraise:
                raise
            return None
        result.worker_id = self._who
        result.timings.queue_ms = round(((record.started_at or 0) - record.created_at) * 1000, 3)
        self.store.finish(request.run_id, result, held)
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
        timeouts = {"socket_connect_timeout": CONNECT_TIMEOUT_SECONDS, "socket_timeout": SOCKET_TIMEOUT_SECONDS}
        self.redis = redis.Redis.from_url(redis_url, **timeouts)
        self.store = RedisRunStore(self.redis, result_ttl=result_ttl)
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
        with redis_errors():
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
        recovered = 0
        for run_id in silent:
            record = await self._recover(run_id)
            recovered += record is not None and record.status != RunStatus.STARTED
        return recovered

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self.sweep_lost()
            except Exception:  # Redis away for a moment: try again at the next sweep
                logger.warning("sweeping lost runs failed", exc_info=True)

    async def queue_depths(self) -> dict[str, int]:
        def count() -> dict[str, int]:
            return {runtime.value: self.queue(runtime.value).count for runtime in RuntimeName}

        with redis_errors():
            return await asyncio.to_thread(count)

    async def close(self) -> None:
        for task in self._background.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.reader.close()
        self.redis.close()
