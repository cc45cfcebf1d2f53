"""Run records in Redis, shared by API processes and queue workers.

Keys (``RunKeys``): ``<prefix>:<id>`` (the record as JSON), ``<prefix>:<id>:events`` (a stream),
``<prefix>:<id>:heartbeat`` (expires when the worker stops beating), ``<prefix>:<id>:attempt`` (the fencing token
of the started attempt), the indexes ``<prefix>:index`` (and one per owner), ``<prefix>:running`` (the started
runs: what the lost-run sweep reads), ``<prefix>:waiting`` (the queued runs, by when they last entered the queue: what
the stranded-job sweep reads), the same two per team (``<prefix>:running:<team>``, ``<prefix>:waiting:<team>``: what
its quotas count), ``<prefix>:artifacts:<team>`` (a hash of the bytes of artifacts its runs stored, by the hour they
ended) and ``<prefix>:reserved:<team>`` (a hash of run id → the bytes each of its runs going holds: with the tally,
what its quota of stored artifacts counts) and the counts ``<prefix>:stats`` (by status and duration bucket: a
bounded set of fields). Every change is published on ``<prefix>:changes`` (``"<id> <event type>"``) for the API's
waiters (``worker.run_store.watch``).

Retention: everything a run writes has an end. Its record and events expire ``result_ttl`` seconds after it ended;
its attempt, heartbeat and places among the started or queued runs go when it leaves that status. Its entries in the
indexes go when its record does: ``<prefix>:expiring`` holds the ended runs by that time (``"<id> <owner>"``), every
run that ends takes up to ``TRIM_BATCH`` runs whose time has passed out of the indexes, and ``trim_expired`` (the
queue dispatcher's sweep, every few seconds) takes the rest, so the indexes hold what is kept and no more, and are
gone once nothing is (``TRIM_EXPIRED``) — also when no later run ends. A team's artifact tally and its runs' holds on its quota end as ``worker.run_store.artifact_room`` says.

Kept workspaces are registered next to the records (``worker.run_store.workspaces``): a run claims its workspace
when it is reserved (refused: its record goes again) and releases it in the transaction that ends it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from worker import defaults
from worker.contract import RunRequest
from worker.config import get_worker_settings
from worker.run_store.artifact_room import RedisArtifactRoom
from worker.run_store.base import TRIM_BATCH, BaseRunStore
from worker.run_store.fencing import RENEW_IF_HELD, Attempt
from worker.run_store.records import Mutation, RunEvent, RunRecord, RunStatus, duration_bucket
from worker.run_store.workspaces import RedisWorkspaces, WorkspaceRefusedError, joining


@dataclass(frozen=True)
class RunKeys:
    """Where a run store keeps things in Redis."""

    prefix: str = "skillrun:run"

    def record(self, run_id: str) -> str:
        return f"{self.prefix}:{run_id}"

    def part(self, run_id: str, part: str) -> str:
        return f"{self.prefix}:{run_id}:{part}"

    @property
    def running(self) -> str:
        return f"{self.prefix}:running"

    @property
    def waiting(self) -> str:
        return f"{self.prefix}:waiting"

    def team_running(self, team: str) -> str:
        """A team's started runs (by when they started): what its cap on runs at once counts."""
        return f"{self.prefix}:running:{team}"

    def team_waiting(self, team: str) -> str:
        """A team's queued runs (by when they entered the queue): what its quota of queued runs counts."""
        return f"{self.prefix}:waiting:{team}"

    def team_artifacts(self, team: str) -> str:
        """A team's artifact bytes by the hour their runs ended: what its quota of stored artifacts counts."""
        return f"{self.prefix}:artifacts:{team}"

    def team_reserved(self, team: str) -> str:
        """What a team's runs going hold of its quota of stored artifacts (run id → bytes)."""
        return f"{self.prefix}:reserved:{team}"

    @property
    def changes(self) -> str:
        return f"{self.prefix}:changes"

    @property
    def stats(self) -> str:
        return f"{self.prefix}:stats"

    @property
    def expiring(self) -> str:
        return f"{self.prefix}:expiring"

    def index(self, owner: str | None = None) -> str:
        return f"{self.prefix}:index" if owner is None else f"{self.prefix}:index:{owner}"


TRIM_EXPIRED = """
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, member in ipairs(members) do
    local space = string.find(member, ' ', 1, true)
    local run_id, owner = string.sub(member, 1, space - 1), string.sub(member, space + 1)
    redis.call('ZREM', KEYS[2], run_id)
    if owner ~= '' then
        redis.call('ZREM', ARGV[3] .. owner, run_id)
    end
end
if #members > 0 then
    redis.call('ZREM', KEYS[1], unpack(members))
end
return #members
"""
"""``KEYS = [expiring, index]``, ``ARGV = [now, at most, owner index prefix]``: removes up to that many runs whose
record expired by ``now`` from the index, their owner's index and ``expiring``; returns how many."""

class RedisRunStore(BaseRunStore):
    """Records in Redis (see the module's key layout)."""

    def __init__(
        self,
        connection: redis.Redis,
        *,
        prefix: str = "skillrun:run",
        result_ttl: int = defaults.RESULT_TTL_SECONDS,
        heartbeat_ttl: int = defaults.HEARTBEAT_TTL_SECONDS,
        clock: Callable[[], float] = time.time,
        workspace_limit: int | None = None,
        artifact_ttl: int | None = None,
    ) -> None:
        """``workspace_limit``: kept workspaces an owner may have at once; ``artifact_ttl``: how long artifacts are
        kept (default: the worker's ``artifacts_kept_seconds``)."""
        self.redis = connection
        self.clock = clock
        self.keys = RunKeys(prefix)
        self.result_ttl = result_ttl
        self.artifact_ttl = get_worker_settings().artifacts_kept_seconds if artifact_ttl is None else artifact_ttl
        self.heartbeat_ttl = heartbeat_ttl
        self._renew = connection.register_script(RENEW_IF_HELD)
        self._trim = connection.register_script(TRIM_EXPIRED)
        self.workspaces = RedisWorkspaces(connection, self.keys.record(""), limit=workspace_limit, clock=clock)
        self.artifacts = RedisArtifactRoom(connection, self.keys, clock, self.artifact_ttl)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> "RedisRunStore":
        return cls(redis.Redis.from_url(url), **kwargs)

    def create(self, request: RunRequest, owner: str | None = None, workspace_limit: int | None = None,
               artifact_limit: int | None = None) -> RunRecord:
        record = self.reserve(request, owner, workspace_limit=workspace_limit)
        asked = record.request.limits.artifact_total_bytes
        try:
            with self.redis.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        self.hold_room(pipe, record, artifact_limit, asked)
                        pipe.multi()
                        self.announce(pipe, record)
                        pipe.execute()
                        return record
                    except redis.WatchError:
                        continue
        except BaseException:
            self.unreserve(record)
            raise

    def reserve(self, request: RunRequest, owner: str | None = None, node: str | None = None, *,
                joined: bool = False, workspace_limit: int | None = None) -> RunRecord:
        """Store a new run's record (refused if the id was ever used) and claim its kept workspace, placed on
        ``node`` if it has no node yet (refused: ``WorkspaceRefusedError``, the record is gone again; past
        ``workspace_limit`` workspaces of its owner, when given); ``announce`` then makes it known, or ``unreserve``
        takes it back. ``joined``: the caller has already made ``request`` a run of the kept workspace it names
        (``joining``), so the registry is not asked again."""
        if not joined:
            request = joining(self.workspaces, request)
        record = RunRecord(id=request.run_id, request=request, owner=owner)
        with self.redis.pipeline(transaction=False) as pipe:  # one round trip; SET NX alone decides who has the id
            pipe.set(self.keys.record(record.id), record.model_dump_json(), nx=True)
            pipe.exists(self.keys.part(record.id, "events"))
            created, had_events = pipe.execute()
        if not created or had_events:
            if created:  # the id's events outlived its record: the id stays used, nothing of this run is kept
                self.redis.delete(self.keys.record(record.id))
            raise ValueError(f"run {record.id!r} already exists")
        if request.keep_workspace:
            try:
                self.workspaces.claim(request, owner, node, workspace_limit)
            except (WorkspaceRefusedError, redis.RedisError):
                self.redis.delete(self.keys.record(record.id))
                raise
        return record

    def unreserve(self, record: RunRecord) -> None:
        """Take back a run reserved and never announced: its record, and its claim on its kept workspace."""
        with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(self.keys.record(record.id))
            if record.request.keep_workspace:
                self.workspaces.unclaim(pipe, record.request.workspace_id, record.id)
            pipe.execute()

    def announce(self, pipe: redis.client.Pipeline, record: RunRecord) -> None:
        """Add a reserved run to the indexes, the counts and its event stream, in ``pipe`` (which may also carry
        its enqueueing); a run given room for its artifacts (``hold_room``) is stored as given it, and holds it."""
        if record.artifact_bytes_reserved and record.owner is not None:
            pipe.set(self.keys.record(record.id), record.model_dump_json())
            self.artifacts.hold(pipe, record)
        pipe.zadd(self.keys.index(), {record.id: record.created_at})
        if record.owner is not None:
            pipe.zadd(self.keys.index(record.owner), {record.id: record.created_at})
        pipe.zadd(self.keys.waiting, {record.id: record.created_at})
        if record.owner is not None:
            pipe.zadd(self.keys.team_waiting(record.owner), {record.id: record.created_at})
        pipe.xadd(self.keys.part(record.id, "events"), {"event": RunEvent(type="queued").model_dump_json()})

    def get(self, run_id: str) -> RunRecord | None:
        raw = self.redis.get(self.keys.record(run_id))
        return RunRecord.model_validate_json(raw) if raw else None

    def update(self, run_id: str, mutate: Mutation) -> RunRecord | None:
        key = self.keys.record(run_id)
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
        started = record.status == RunStatus.STARTED
        if started and previous != RunStatus.STARTED:  # the attempt, its first heartbeat and the index, at once
            token = Attempt.of(record).token
            pipe.set(self.keys.part(record.id, "attempt"), token)
            pipe.set(self.keys.part(record.id, "heartbeat"), token, ex=self.heartbeat_ttl)
            pipe.zadd(self.keys.running, {record.id: record.started_at or 0})
            if record.owner is not None:
                pipe.zadd(self.keys.team_running(record.owner), {record.id: record.started_at or 0})
        elif previous == RunStatus.STARTED and not started:  # retried or ended: no attempt holds it any more
            pipe.delete(self.keys.part(record.id, "attempt"), self.keys.part(record.id, "heartbeat"))
            pipe.zrem(self.keys.running, record.id)
            if record.owner is not None:
                pipe.zrem(self.keys.team_running(record.owner), record.id)
        if record.status == RunStatus.QUEUED:  # (back) in the queue: from now on
            pipe.zadd(self.keys.waiting, {record.id: self.clock()})
            if record.owner is not None:
                pipe.zadd(self.keys.team_waiting(record.owner), {record.id: self.clock()})
        elif previous == RunStatus.QUEUED:
            pipe.zrem(self.keys.waiting, record.id)
            if record.owner is not None:
                pipe.zrem(self.keys.team_waiting(record.owner), record.id)
        pipe.set(self.keys.record(record.id), record.model_dump_json(), ex=ttl)
        pipe.xadd(self.keys.part(record.id, "events"), {"event": event.model_dump_json()})
        pipe.publish(self.keys.changes, f"{record.id} {event.type}")
        if record.status.done and not previous.done:  # queued and started runs are counted by their indexes
            pipe.hincrby(self.keys.stats, f"status:{record.status.value}", 1)
        if record.status.done and record.started_at and record.finished_at:
            seconds = record.finished_at - record.started_at
            pipe.hincrby(self.keys.stats, f"duration:{duration_bucket(seconds)}", 1)
            pipe.hincrbyfloat(self.keys.stats, "duration_sum", seconds)
        if ttl:
            pipe.expire(self.keys.part(record.id, "events"), ttl)
            self._expire_from_indexes(pipe, record, ttl)
        if record.status.done and not previous.done and record.request.keep_workspace:
            self.workspaces.release(pipe, record.request.workspace_id, record.id)
        if record.status.done and not previous.done and record.owner is not None:  # its hold becomes what it stored
            self.artifacts.end(pipe, record)

    def _expire_from_indexes(self, pipe: redis.client.Pipeline, record: RunRecord, ttl: int) -> None:
        """Note when the ended ``record`` expires, and take up to ``TRIM_BATCH`` runs expired by now out of the
        indexes."""
        now = self.clock()
        pipe.zadd(self.keys.expiring, {f"{record.id} {record.owner or ''}": now + ttl})
        # The script's text, not its digest: in a transaction redis-py asks SCRIPT EXISTS first, a round trip more
        pipe.eval(TRIM_EXPIRED, 2, self.keys.expiring, self.keys.index(), now, TRIM_BATCH, self.keys.index(""))

    def trim_expired(self, limit: int) -> int:
        """Take up to ``limit`` runs whose records expired by now out of the indexes (``TRIM_BATCH`` a script call,
        as many calls as it takes); how many. The runs that end trim as they go; this takes what no later run's end
        took (the last runs before a quiet spell), so the indexes end with their records whatever comes after."""
        trimmed = 0
        while trimmed < limit:
            batch = min(TRIM_BATCH, limit - trimmed)
            done = int(self._trim(keys=[self.keys.expiring, self.keys.index()],
                                  args=[self.clock(), batch, self.keys.index("")]))
            trimmed += done
            if done < batch:
                break
        return trimmed

    def waiting_since(self, before: float, limit: int) -> list[RunRecord]:
        """Up to ``limit`` queued runs that entered the queue before ``before`` (oldest first)."""
        ids = [i.decode() for i in self.redis.zrangebyscore(self.keys.waiting, "-inf", before, start=0, num=limit)]
        raws = self.redis.mget([self.keys.record(i) for i in ids]) if ids else []
        gone = [run_id for run_id, raw in zip(ids, raws) if not raw]
        if gone:  # a record removed by hand (or a flushed Redis): nothing waits any more
            self.redis.zrem(self.keys.waiting, *gone)
        records = [RunRecord.model_validate_json(raw) for raw in raws if raw]
        return [record for record in records if record.status == RunStatus.QUEUED]

    def hold_room(self, pipe: redis.client.Pipeline, record: RunRecord, limit: int | None, asked: int) -> None:
        """``RedisArtifactRoom.hold_room``."""
        self.artifacts.hold_room(pipe, record, limit, asked)

    def team_artifact_bytes(self, team: str) -> int:
        return self.artifacts.kept(team)

    def team_artifact_reserved(self, team: str) -> int:
        return self.artifacts.reserved(team)

    def team_usage(self, team: str) -> tuple[int, int]:
        """How many runs of ``team`` are queued and started. Runs whose record is gone (removed by hand, a flushed
        Redis) are taken out of its sets first, so they count no more."""
        for key in (self.keys.team_waiting(team), self.keys.team_running(team)):
            ids = [i.decode() for i in self.redis.zrange(key, 0, -1)]
            found = self.redis.mget([self.keys.record(i) for i in ids]) if ids else []
            gone = [run_id for run_id, raw in zip(ids, found) if not raw]
            if gone:
                self.redis.zrem(key, *gone)
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.zcard(self.keys.team_waiting(team))
            pipe.zcard(self.keys.team_running(team))
            queued, started = pipe.execute()
        return queued, started

    def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        entries = self.redis.xrange(self.keys.part(run_id, "events"))
        return [RunEvent.model_validate_json(fields[b"event"]) for _, fields in entries[after:]]

    def list(self, status: RunStatus | None = None, limit: int = 100, owner: str | None = None) -> list[RunRecord]:
        ids = self.redis.zrevrange(self.keys.index(owner), 0, max(limit * 5, 500))
        records = []
        for raw in self.redis.mget([self.keys.record(i.decode()) for i in ids]) if ids else []:
            if raw:
                record = RunRecord.model_validate_json(raw)
                if status is None or record.status == status:
                    records.append(record)
        return records[:limit]

    def stats(self) -> dict[str, Any]:
        """The counts: ended runs' by status and durations from the stats hash (each run's end adds to it), queued
        and started runs' from the indexes that hold them (so a run's start and end need no count of their own)."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(self.keys.stats)
            pipe.zcard(self.keys.waiting)
            pipe.zcard(self.keys.running)
            counted, queued, started = pipe.execute()
        raw = {k.decode(): float(v) for k, v in counted.items()}
        ended = {status.value for status in RunStatus if status.done}
        by_status = {k.split(":", 1)[1]: int(v) for k, v in raw.items()
                     if k.startswith("status:") and k.split(":", 1)[1] in ended}
        by_status.update({name: count for name, count in ((RunStatus.QUEUED.value, queued),
                                                           (RunStatus.STARTED.value, started)) if count})
        return {
            "status": by_status,
            "duration_buckets": {k.split(":", 1)[1]: int(v) for k, v in raw.items() if k.startswith("duration:")},
            "duration_sum": raw.get("duration_sum", 0.0),
        }

    def heartbeat(self, run_id: str, attempt: Attempt) -> bool:
        keys = [self.keys.part(run_id, "attempt"), self.keys.part(run_id, "heartbeat")]
        return bool(self._renew(keys=keys, args=[attempt.token, self.heartbeat_ttl]))

    def alive_id(self, run_id: str) -> bool:
        return bool(self.redis.exists(self.keys.part(run_id, "heartbeat")))

    def close(self) -> None:
        self.redis.close()
