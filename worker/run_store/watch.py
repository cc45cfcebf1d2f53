"""Waiting for runs without a thread per waiter: the API's async side of the run stores.

``RunWaiters`` holds the coroutines of this process waiting for a run to change (an ``asyncio.Event`` each) and
wakes them by run id. ``AsyncRunReader`` reads a Redis run store with ``redis.asyncio`` and feeds the waiters from
one pub/sub subscription per process (the store publishes every change), so 1,000 waits cost 1,000 events, not
1,000 threads or connections. It also answers the lost-run sweep's one bounded query: which started runs have no
heartbeat, and whether this process holds the sweep's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from worker.run_store.records import ENDING_EVENTS, RunEvent, RunRecord, RunStatus
from worker.run_store.redis_store import RunKeys

logger = logging.getLogger(__name__)

LISTEN_POLL_SECONDS = 5.0
"""Longest read on the change subscription (a wake-up to notice a dropped connection)."""
RECONNECT_SECONDS = 1.0
"""Pause before subscribing again after Redis went away."""


class _Change(asyncio.Event):
    """Set when a run may have changed; ``ends_only``: only when it may have ended."""

    def __init__(self, ends_only: bool) -> None:
        super().__init__()
        self.ends_only = ends_only


class RunWaiters:
    """This process's waiters, by run id."""

    def __init__(self) -> None:
        self._waiting: dict[str, set[_Change]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def watch(self, run_id: str, ends_only: bool = False) -> Iterator[asyncio.Event]:
        """An event set whenever run ``run_id`` may have changed (clear it before each look); with ``ends_only``,
        whenever it may have ended (a change said to be another event, a start say, leaves it alone)."""
        self._loop = asyncio.get_running_loop()
        changed = _Change(ends_only)
        self._waiting.setdefault(run_id, set()).add(changed)
        try:
            yield changed
        finally:
            waiting = self._waiting.get(run_id, set())
            waiting.discard(changed)
            if not waiting:
                self._waiting.pop(run_id, None)

    def __len__(self) -> int:
        return sum(len(waiting) for waiting in self._waiting.values())

    def notify(self, run_id: str, event: str | None = None) -> None:
        """Wake the waiters of ``run_id``: every one for a change of unknown kind (``event`` ``None``), those waiting
        for its end only if ``event`` ends it."""
        for changed in self._waiting.get(run_id, ()):
            if event is None or not changed.ends_only or event in ENDING_EVENTS:
                changed.set()

    def notify_all(self) -> None:
        for waiting in self._waiting.values():
            for changed in waiting:
                changed.set()

    def notify_threadsafe(self, run_id: str) -> None:
        """``notify`` from any thread (the loop's own included)."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.notify, run_id)


class AsyncRunReader:
    """Reads of a ``RedisRunStore`` on ``redis.asyncio``, and the change subscription that feeds ``waiters``."""

    def __init__(self, connection: aioredis.Redis, waiters: RunWaiters, keys: RunKeys | None = None) -> None:
        self.redis = connection
        self.waiters = waiters
        self.keys = keys or RunKeys()
        self.stopping = False
        """Set by ``stop``: ``listen`` returns at its next turn."""

    async def get_beating(self, run_id: str) -> tuple[RunRecord | None, bool]:
        """The record and, for a started run, whether its worker's heartbeat is there (a second round trip, for
        started runs only: a run's start and end set and take away its heartbeat with its status, so a run seen
        started whose heartbeat is then gone ended meanwhile or lost its worker; the lost-run recovery tells)."""
        raw = await self.redis.get(self.keys.record(run_id))
        record = RunRecord.model_validate_json(raw) if raw else None
        if record is None or record.status != RunStatus.STARTED:
            return record, False
        return record, bool(await self.redis.exists(self.keys.part(run_id, "heartbeat")))

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        entries = await self.redis.xrange(self.keys.part(run_id, "events"))
        return [RunEvent.model_validate_json(fields[b"event"]) for _, fields in entries[after:]]

    async def silent_runs(self, limit: int) -> list[str]:
        """Up to ``limit`` started runs (oldest first) whose heartbeat is gone: two round trips, whatever the number
        of records kept."""
        ids = [i.decode() for i in await self.redis.zrange(self.keys.running, 0, limit - 1)]
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in ids:
                pipe.exists(self.keys.part(run_id, "heartbeat"))
            beating = await pipe.execute()
        return [run_id for run_id, beats in zip(ids, beating) if not beats]

    async def take_lease(self, name: str, holder: str, seconds: float) -> bool:
        """Whether ``holder`` holds the lease ``name``: taken now for ``seconds`` (it lapses by itself), or still
        its own from before."""
        key = f"{self.keys.prefix}:lease:{name}"
        if await self.redis.set(key, holder, nx=True, px=int(seconds * 1000)):
            return True
        return await self.redis.get(key) == holder.encode()

    async def listen(self) -> None:
        """Wake the waiters of each run the store announces a change of; runs until ``stop`` (or cancelled). While
        Redis is away it subscribes again every ``RECONNECT_SECONDS`` and, each time, wakes every waiter (changes may
        have been missed)."""
        while not self.stopping:
            try:
                async with self.redis.pubsub() as pubsub:
                    await pubsub.subscribe(self.keys.changes)
                    self.waiters.notify_all()
                    while not self.stopping:
                        message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=LISTEN_POLL_SECONDS)
                        if message is not None and message["type"] == "message":  # "<run id> <event type>"
                            run_id, _, event = message["data"].decode(errors="replace").partition(" ")
                            self.waiters.notify(run_id, event or None)
            except (RedisError, OSError) as exc:
                logger.warning("run changes subscription lost (%s); subscribing again", exc)
                self.waiters.notify_all()
                await asyncio.sleep(RECONNECT_SECONDS)

    def stop(self) -> None:
        """End ``listen``. Cancelling it alone is not enough: a cancel that lands as its read's own timeout expires
        is taken by redis-py for that timeout (the read returns ``None``), and the loop would read on forever."""
        self.stopping = True

    async def ping(self) -> None:
        await self.redis.ping()

    async def close(self) -> None:
        await self.redis.aclose()
