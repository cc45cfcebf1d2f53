"""Run records: what happened to each submitted run, shared by whoever submits, executes and watches it.

A record holds the request, its status (``queued → started → finished | failed | cancelled``), the result,
the failure reason, the attempts and the worker; each change is also an event (``queued``, ``started``,
``finished``, ``failed``, ``cancelled``, ``retried``) that watchers can wait for without polling. Two stores:
``MemoryRunStore`` (the embedded default, one process) and ``RedisRunStore`` (API processes and queue workers).

A started run carries a heartbeat its worker renews; a run whose heartbeat expired is *lost*: the dispatcher
retries it (event ``retried`` with the reason) until ``max_attempts``, then fails it with the reason. A run is
never left "started" forever.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import Enum
from typing import Any

import redis
from pydantic import BaseModel, Field

from worker import defaults
from worker.contract import RunRequest, RunResult


MAX_BLOCK_SECONDS = 2.0
"""Longest single blocking read on Redis (under any client socket timeout); waits loop over such reads."""

DURATION_BUCKETS_SECONDS = (0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)


def duration_bucket(seconds: float) -> str:
    """The histogram bucket (upper bound, as Prometheus' ``le``) a run duration falls in."""
    return next((f"{b:g}" for b in DURATION_BUCKETS_SECONDS if seconds <= b), "+Inf")


class RunStatus(str, Enum):
    QUEUED = "queued"
    STARTED = "started"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def done(self) -> bool:
        return self in {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED}


class RunEvent(BaseModel):
    type: str
    at: float = Field(default_factory=time.time)
    data: dict[str, Any] = Field(default_factory=dict)


class RunRecord(BaseModel):
    id: str
    request: RunRequest
    status: RunStatus = RunStatus.QUEUED
    result: RunResult | None = None
    error: str | None = None
    worker_id: str | None = None
    attempts: int = 0
    created_at: float = Field(default_factory=time.time)
    started_at: float | None = None
    finished_at: float | None = None
    cancel_requested: bool = False
    owner: str | None = None
    """Who submitted the run (a team); only they see it."""


Mutation = Callable[["RunRecord"], "RunEvent | None"]


class BaseRunStore(ABC):
    """Blocking by design (Redis calls, waits); async callers go through ``asyncio.to_thread``."""

    @abstractmethod
    def create(self, request: RunRequest, owner: str | None = None) -> RunRecord: ...

    @abstractmethod
    def get(self, run_id: str) -> RunRecord | None: ...

    @abstractmethod
    def update(self, run_id: str, mutate: Mutation) -> RunRecord | None:
        """Change the stored record atomically: ``mutate`` edits a copy in place and returns the event to record, or
        ``None`` to leave the record as it is. A concurrent change makes the update start again, so no update is
        ever lost. Returns the record as stored afterwards, or ``None`` when there is no such run."""

    @abstractmethod
    def events(self, run_id: str, after: int = 0, timeout: float = 0.0) -> list[RunEvent]:
        """Events after the first ``after`` ones; waits up to ``timeout`` seconds for one when there are none."""

    @abstractmethod
    def list(self, status: RunStatus | None = None, limit: int = 100, owner: str | None = None) -> list[RunRecord]:
        """Newest first; only ``owner``'s runs when given."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counts of runs by status, and a histogram of finished runs' durations (for ``/metrics``)."""

    def event_count(self, run_id: str) -> int:
        return len(self.events(run_id))

    def heartbeat(self, run_id: str) -> None:
        """The worker executing ``run_id`` is alive."""

    def alive(self, record: RunRecord) -> bool:
        """Whether a started run's worker is still beating."""
        return self.alive_id(record.id)

    def start(self, run_id: str, worker_id: str) -> RunRecord | None:
        """Mark a queued run started by ``worker_id``; ``None`` when it is not queued (cancelled, or taken). A store
        whose runs can be lost records the first heartbeat with the change, so a started run always has one."""

        def mutate(record: RunRecord) -> RunEvent | None:
            if record.status != RunStatus.QUEUED:
                return None
            record.status = RunStatus.STARTED
            record.worker_id = worker_id
            record.attempts += 1
            record.started_at = time.time()
            return RunEvent(type="started", data={"worker_id": worker_id, "attempt": record.attempts,
                                                  "queue_ms": round((record.started_at - record.created_at) * 1000, 3)})

        record = self.update(run_id, mutate)
        return record if record is not None and record.status == RunStatus.STARTED and record.worker_id == worker_id else None

    def finish(self, run_id: str, result: RunResult, worker_id: str | None = None) -> RunRecord | None:
        """Store a started run's result: ``cancelled`` when a cancel was asked for meanwhile, else ``finished``.
        With ``worker_id``, only that worker's attempt may finish it (a late, superseded attempt changes nothing)."""

        def mutate(record: RunRecord) -> RunEvent | None:
            if record.status.done or (worker_id is not None and record.worker_id != worker_id):
                return None
            record.result = result
            record.status = RunStatus.CANCELLED if record.cancel_requested else RunStatus.FINISHED
            record.finished_at = time.time()
            return RunEvent(type=record.status.value, data={
                "exit_code": result.exit_code, "timed_out": result.timed_out, "timings": result.timings.model_dump()})

        return self.update(run_id, mutate)

    def fail(self, run_id: str, reason: str) -> RunRecord | None:
        def mutate(record: RunRecord) -> RunEvent | None:
            if record.status.done:
                return None
            record.status = RunStatus.FAILED
            record.error = reason
            record.finished_at = time.time()
            return RunEvent(type="failed", data={"reason": reason})

        return self.update(run_id, mutate)

    def request_cancel(self, run_id: str) -> RunRecord | None:
        """Cancel a queued run at once; ask the worker of a started one to stop it."""

        def mutate(record: RunRecord) -> RunEvent | None:
            if record.status.done or record.cancel_requested:
                return None
            record.cancel_requested = True
            if record.status == RunStatus.QUEUED:
                record.status = RunStatus.CANCELLED
                record.finished_at = time.time()
                return RunEvent(type="cancelled", data={"reason": "cancelled before it started"})
            return RunEvent(type="cancelling")

        return self.update(run_id, mutate)

    def requeue_lost(self, run_id: str, max_attempts: int) -> tuple[RunRecord | None, bool]:
        """A started run whose worker stopped beating: back to the queue while attempts remain, else failed.
        Returns the record and whether it must be enqueued again."""
        if self.alive_id(run_id):
            return self.get(run_id), False
        requeued = False

        def mutate(record: RunRecord) -> RunEvent | None:
            nonlocal requeued
            if record.status != RunStatus.STARTED:
                return None
            reason = f"worker {record.worker_id} stopped beating (lost during attempt {record.attempts})"
            if record.attempts < max_attempts and not record.cancel_requested:
                record.status = RunStatus.QUEUED
                record.worker_id = None
                requeued = True
                return RunEvent(type="retried", data={"reason": reason, "attempt": record.attempts + 1})
            record.status = RunStatus.FAILED
            record.error = reason
            record.finished_at = time.time()
            return RunEvent(type="failed", data={"reason": reason})

        return self.update(run_id, mutate), requeued

    def alive_id(self, run_id: str) -> bool:
        """Whether the worker of run ``run_id`` is beating."""
        return True

    def wait(self, run_id: str, timeout: float, owner: str | None = None) -> RunRecord | None:
        """The record once it is done, or as it is after ``timeout`` seconds. No polling: waits on its events.
        With ``owner``, another owner's run is ``None`` at once."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            record = self.get(run_id)
            if record is not None and owner is not None and record.owner != owner:
                return None
            if record is None or record.status.done:
                return record
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return record
            seen = max(seen, self.event_count(run_id))
            self.events(run_id, after=seen, timeout=min(remaining, defaults.HEARTBEAT_TTL_SECONDS / 2))
            record = self.get(run_id)
            if record is not None and record.status == RunStatus.STARTED and not self.alive(record):
                return record

    def close(self) -> None:
        """Release connections."""


class MemoryRunStore(BaseRunStore):
    """Records in this process (the embedded default)."""

    def __init__(self) -> None:
        self._records: dict[str, RunRecord] = {}
        self._events: dict[str, list[RunEvent]] = {}
        self._changed = threading.Condition()

    def create(self, request: RunRequest, owner: str | None = None) -> RunRecord:
        record = RunRecord(id=request.run_id, request=request, owner=owner)
        with self._changed:
            if record.id in self._records:
                raise ValueError(f"run {record.id!r} already exists")
            self._records[record.id] = record.model_copy(deep=True)
            self._events[record.id] = [RunEvent(type="queued")]
            self._changed.notify_all()
        return record

    def get(self, run_id: str) -> RunRecord | None:
        with self._changed:
            record = self._records.get(run_id)
            return record.model_copy(deep=True) if record else None

    def update(self, run_id: str, mutate: Mutation) -> RunRecord | None:
        with self._changed:
            stored = self._records.get(run_id)
            if stored is None:
                return None
            record = stored.model_copy(deep=True)
            event = mutate(record)
            if event is None:
                return stored.model_copy(deep=True)
            self._records[run_id] = record.model_copy(deep=True)
            self._events.setdefault(run_id, []).append(event)
            self._changed.notify_all()
            return record

    def events(self, run_id: str, after: int = 0, timeout: float = 0.0) -> list[RunEvent]:
        with self._changed:
            self._changed.wait_for(lambda: len(self._events.get(run_id, [])) > after, timeout)
            return list(self._events.get(run_id, [])[after:])

    def list(self, status: RunStatus | None = None, limit: int = 100, owner: str | None = None) -> list[RunRecord]:
        with self._changed:
            records = sorted(self._records.values(), key=lambda r: r.created_at, reverse=True)
            return [r.model_copy(deep=True) for r in records
                    if (status is None or r.status == status) and (owner is None or r.owner == owner)][:limit]

    def stats(self) -> dict[str, Any]:
        with self._changed:
            by_status: dict[str, int] = {}
            durations: dict[str, int] = {}
            total = 0.0
            for record in self._records.values():
                by_status[record.status.value] = by_status.get(record.status.value, 0) + 1
                if record.status.done and record.started_at and record.finished_at:
                    seconds = record.finished_at - record.started_at
                    durations[duration_bucket(seconds)] = durations.get(duration_bucket(seconds), 0) + 1
                    total += seconds
            return {"status": by_status, "duration_buckets": durations, "duration_sum": total}


class RedisRunStore(BaseRunStore):
    """Records in Redis: ``<prefix>:<id>`` (the record as JSON), ``<prefix>:<id>:events`` (a stream),
    ``<prefix>:<id>:heartbeat`` (expires when the worker stops beating), and the index ``<prefix>:index``."""

    def __init__(
        self,
        connection: redis.Redis,
        *,
        prefix: str = "skillrun:run",
        result_ttl: int = defaults.RESULT_TTL_SECONDS,
        heartbeat_ttl: int = defaults.HEARTBEAT_TTL_SECONDS,
    ) -> None:
        self.redis = connection
        self.prefix = prefix
        self.result_ttl = result_ttl
        self.heartbeat_ttl = heartbeat_ttl

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "RedisRunStore":
        return cls(redis.Redis.from_url(url), **kwargs)

    def _key(self, run_id: str, part: str = "") -> str:
        return f"{self.prefix}:{run_id}{':' + part if part else ''}"

    def create(self, request: RunRequest, owner: str | None = None) -> RunRecord:
        record = self.reserve(request, owner)
        with self.redis.pipeline(transaction=True) as pipe:
            self.announce(pipe, record)
            pipe.execute()
        return record

    def reserve(self, request: RunRequest, owner: str | None = None) -> RunRecord:
        """Store a new run's record (refused if the id was ever used); ``announce`` then makes it known."""
        record = RunRecord(id=request.run_id, request=request, owner=owner)
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(self._key(record.id), record.model_dump_json(), nx=True)
            pipe.exists(self._key(record.id, "events"))
            created, had_events = pipe.execute()
        if not created or had_events:
            raise ValueError(f"run {record.id!r} already exists")
        return record

    def announce(self, pipe: redis.client.Pipeline, record: RunRecord) -> None:
        """Add a reserved run to the indexes, the counts and its event stream, in ``pipe`` (which may also carry
        its enqueueing)."""
        pipe.zadd(f"{self.prefix}:index", {record.id: record.created_at})
        if record.owner is not None:
            pipe.zadd(f"{self.prefix}:index:{record.owner}", {record.id: record.created_at})
        pipe.hincrby(f"{self.prefix}:stats", f"status:{RunStatus.QUEUED.value}", 1)
        pipe.xadd(self._key(record.id, "events"), {"event": RunEvent(type="queued").model_dump_json()})

    def get(self, run_id: str) -> RunRecord | None:
        raw = self.redis.get(self._key(run_id))
        return RunRecord.model_validate_json(raw) if raw else None

    def update(self, run_id: str, mutate: Mutation) -> RunRecord | None:
        key = self._key(run_id)
        while True:
            with self.redis.pipeline(transaction=True) as pipe:
                try:
                    pipe.watch(key)
                    raw = pipe.get(key)
                    if not raw:
                        return None
                    record = RunRecord.model_validate_json(raw)
                    previous = record.status
                    event = mutate(record)
                    if event is None:
                        pipe.unwatch()
                        return RunRecord.model_validate_json(raw)
                    pipe.multi()
                    self._write(pipe, record, event, previous)
                    pipe.execute()
                    return record
                except redis.WatchError:
                    continue  # changed meanwhile: read it again and re-apply

    def _write(self, pipe: redis.client.Pipeline, record: RunRecord, event: RunEvent, previous: RunStatus) -> None:
        ttl = self.result_ttl if record.status.done else None
        if record.status == RunStatus.STARTED and previous != RunStatus.STARTED:
            pipe.set(self._key(record.id, "heartbeat"), "1", ex=self.heartbeat_ttl)  # in the same transaction
        pipe.set(self._key(record.id), record.model_dump_json(), ex=ttl)
        pipe.xadd(self._key(record.id, "events"), {"event": event.model_dump_json()})
        if previous != record.status:
            pipe.hincrby(f"{self.prefix}:stats", f"status:{previous.value}", -1)
            pipe.hincrby(f"{self.prefix}:stats", f"status:{record.status.value}", 1)
        if record.status.done and record.started_at and record.finished_at:
            seconds = record.finished_at - record.started_at
            pipe.hincrby(f"{self.prefix}:stats", f"duration:{duration_bucket(seconds)}", 1)
            pipe.hincrbyfloat(f"{self.prefix}:stats", "duration_sum", seconds)
        if ttl:
            pipe.expire(self._key(record.id, "events"), ttl)
            pipe.delete(self._key(record.id, "heartbeat"))

    def event_count(self, run_id: str) -> int:
        return int(self.redis.xlen(self._key(run_id, "events")))

    def events(self, run_id: str, after: int = 0, timeout: float = 0.0) -> list[RunEvent]:
        key = self._key(run_id, "events")
        entries = self.redis.xrange(key)
        if len(entries) <= after and timeout > 0:
            last = entries[-1][0] if entries else b"0-0"
            self.redis.xread({key: last}, block=max(int(min(timeout, MAX_BLOCK_SECONDS) * 1000), 1))
            entries = self.redis.xrange(key)
        return [RunEvent.model_validate_json(fields[b"event"]) for _, fields in entries[after:]]

    def wait(self, run_id: str, timeout: float, owner: str | None = None) -> RunRecord | None:
        """The record once it is done, or as it is after ``timeout`` seconds: blocks on the run's event stream and
        reads the record again only when the run ends (or, when nothing happens, checks the worker still beats).
        With ``owner``, another owner's run is ``None`` at once."""
        deadline = time.monotonic() + timeout
        key = self._key(run_id, "events")
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.get(self._key(run_id))
            pipe.xrevrange(key, count=1)
            raw, newest = pipe.execute()
        record = RunRecord.model_validate_json(raw) if raw else None
        if record is not None and owner is not None and record.owner != owner:
            return None
        last = newest[0][0] if newest else b"0-0"
        while record is not None and not record.status.done:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            block = min(remaining, MAX_BLOCK_SECONDS, defaults.HEARTBEAT_TTL_SECONDS / 2)
            arrived = self.redis.xread({key: last}, block=max(int(block * 1000), 1))
            if not arrived:
                if record.status == RunStatus.STARTED and not self.alive(record):
                    break
                continue
            last = arrived[0][1][-1][0]
            kinds = {json.loads(fields[b"event"])["type"] for _, fields in arrived[0][1]}
            if kinds & {status.value for status in RunStatus if status.done}:
                record = self.get(run_id)
            elif "retried" in kinds:
                record.status = RunStatus.QUEUED
            elif "started" in kinds:
                record.status = RunStatus.STARTED  # what the wait needs to know of it; nothing else is read
        return record

    def list(self, status: RunStatus | None = None, limit: int = 100, owner: str | None = None) -> list[RunRecord]:
        index = f"{self.prefix}:index" if owner is None else f"{self.prefix}:index:{owner}"
        ids = self.redis.zrevrange(index, 0, max(limit * 5, 500))
        records = []
        for raw in self.redis.mget([self._key(i.decode()) for i in ids]) if ids else []:
            if raw:
                record = RunRecord.model_validate_json(raw)
                if status is None or record.status == status:
                    records.append(record)
        return records[:limit]

    def stats(self) -> dict[str, Any]:
        raw = {k.decode(): float(v) for k, v in self.redis.hgetall(f"{self.prefix}:stats").items()}
        return {
            "status": {k.split(":", 1)[1]: int(v) for k, v in raw.items() if k.startswith("status:")},
            "duration_buckets": {k.split(":", 1)[1]: int(v) for k, v in raw.items() if k.startswith("duration:")},
            "duration_sum": raw.get("duration_sum", 0.0),
        }

    def heartbeat(self, run_id: str) -> None:
        self.redis.set(self._key(run_id, "heartbeat"), "1", ex=self.heartbeat_ttl)

    def alive_id(self, run_id: str) -> bool:
        return bool(self.redis.exists(self._key(run_id, "heartbeat")))

    def close(self) -> None:
        self.redis.close()
