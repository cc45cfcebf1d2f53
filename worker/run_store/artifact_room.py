"""A team's quota of stored artifacts in Redis, next to its runs' records (``worker.run_store.redis_store``).

``<prefix>:artifacts:<team>``: the bytes of artifacts the team's runs stored, by the hour they ended (the tally);
``<prefix>:reserved:<team>``: run id -> the bytes each of its runs going holds. What the team keeps and holds
together is what its quota counts (``hold_artifact_room``). The tally holds the hours of the artifacts' retention
only (each write drops the hours past it, ``TALLY_ARTIFACTS``) and expires an hour after the artifacts of its last
write do. A run's hold is written in the transaction that announces the run and deleted in the one that ends it
(the hash goes with its last entry); an entry whose record is gone (removed by hand, a flushed database) or ended
(by a writer that left it) counts no more once a run would be short of room for it, and is deleted then, or when
the team's usage is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import redis

from worker.run_store.base import TALLY_SECONDS, artifact_bytes, hold_artifact_room
from worker.run_store.records import RunRecord


class Keys(Protocol):
    """The keys this reads and writes (``worker.run_store.redis_store.RunKeys``)."""

    def record(self, run_id: str) -> str: ...

    def team_artifacts(self, team: str) -> str: ...

    def team_reserved(self, team: str) -> str: ...


TALLY_ARTIFACTS = """
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
local first = tonumber(ARGV[3])
for _, hour in ipairs(redis.call('HKEYS', KEYS[1])) do
    if tonumber(hour) < first then
        redis.call('HDEL', KEYS[1], hour)
    end
end
redis.call('EXPIRE', KEYS[1], ARGV[4])
"""
"""``KEYS = [a team's artifact tally]``, ``ARGV = [hour, bytes, first hour kept, seconds to keep]``: adds the bytes to
the hour, drops the hours the artifacts' retention has passed (at most its hours and one are held, so this is
bounded) and sets when the tally expires."""



class RedisArtifactRoom:
    """The tallies and holds of every team's stored artifacts (see the module's description)."""

    def __init__(self, connection: redis.Redis, keys: Keys, clock: Callable[[], float], artifact_ttl: float) -> None:
        self.redis = connection
        self.keys = keys
        self.clock = clock
        self.artifact_ttl = artifact_ttl
        self._tally = connection.register_script(TALLY_ARTIFACTS)

    def hold_room(self, pipe: redis.client.Pipeline, record: RunRecord, limit: int | None, asked: int) -> None:
        """Give a reserved run saving artifacts, asking to store ``asked`` bytes, its room under its team's quota of
        ``limit`` bytes (``hold_artifact_room``; nothing without a limit or a team), reading what the team keeps and
        holds in ``pipe`` under WATCH, before its ``multi``: ``announce`` then holds the room in the transaction,
        which fails (``redis.WatchError``: try again) when another run took or gave back room meanwhile. When the
        run would be short, the holds of runs whose record is gone or ended are deleted first and count no more
        (their deletion fails the transaction too, so it is tried again without them)."""
        team = record.owner
        if not limit or not record.request.save_as_artifacts or team is None:
            return
        pipe.watch(self.keys.team_artifacts(team), self.keys.team_reserved(team))
        kept = self._tallied(pipe.hgetall(self.keys.team_artifacts(team)))
        holds = self._holds(pipe, team)
        reserved = sum(holds.values())
        if kept + reserved + asked > limit:
            reserved -= self._drop_gone_holds(team, holds)
        hold_artifact_room(record, limit, asked, kept, reserved)

    def _holds(self, client: redis.Redis | redis.client.Pipeline, team: str) -> dict[str, int]:
        """What each of ``team``'s runs going holds of its quota of stored artifacts (run id → bytes)."""
        return {run_id.decode(): int(held) for run_id, held in client.hgetall(self.keys.team_reserved(team)).items()}

    def _drop_gone_holds(self, team: str, holds: dict[str, int]) -> int:
        """Delete the holds of ``team``'s runs whose record is gone, or ended by a write that left its hold (only a
        going run's record never expires: -1); ``holds``: run id → bytes. What they held."""
        with self.redis.pipeline(transaction=False) as pipe:
            for run_id in holds:
                pipe.pttl(self.keys.record(run_id))
            expiries = pipe.execute()
        gone = [run_id for run_id, expiry in zip(holds, expiries, strict=True) if expiry != -1]
        if gone:
            self.redis.hdel(self.keys.team_reserved(team), *gone)
        return sum(holds[run_id] for run_id in gone)

    def hold(self, pipe: redis.client.Pipeline, record: RunRecord) -> None:
        """The room ``hold_room`` gave a run, held in ``pipe`` (the transaction announcing it)."""
        pipe.hset(self.keys.team_reserved(record.owner), record.id, record.artifact_bytes_reserved)

    def end(self, pipe: redis.client.Pipeline, record: RunRecord) -> None:
        """An ended run's hold goes and what it stored is tallied, in ``pipe`` (the transaction ending it)."""
        if record.artifact_bytes_reserved:
            pipe.hdel(self.keys.team_reserved(record.owner), record.id)
        if stored := artifact_bytes(record):
            self._tally(keys=[self.keys.team_artifacts(record.owner)],
                        args=[int(self.clock() // TALLY_SECONDS), stored, self._first_tallied_hour(),
                              int(self.artifact_ttl) + TALLY_SECONDS], client=pipe)

    def _first_tallied_hour(self) -> int:
        """The oldest hour of a team's artifact tally whose artifacts are still kept."""
        return int((self.clock() - self.artifact_ttl) // TALLY_SECONDS)

    def _tallied(self, tally: dict[bytes, bytes]) -> int:
        """What a team's artifact tally (as read: hour → bytes) holds within the artifacts' retention."""
        first = self._first_tallied_hour()
        return sum(int(stored) for hour, stored in tally.items() if int(hour) >= first)

    def kept(self, team: str) -> int:
        """What the team's runs that ended within the artifacts' retention stored (older hours are dropped)."""
        key = self.keys.team_artifacts(team)
        tally = self.redis.hgetall(key)
        first = self._first_tallied_hour()
        gone = [hour for hour in tally if int(hour) < first]
        if gone:
            self.redis.hdel(key, *gone)
        return self._tallied(tally)

    def reserved(self, team: str) -> int:
        """What the team's runs going hold; the holds of runs whose record is gone or ended are deleted first, so they count
        no more."""
        holds = self._holds(self.redis, team)
        return sum(holds.values()) - self._drop_gone_holds(team, holds)


__all__ = ["TALLY_ARTIFACTS", "RedisArtifactRoom"]
