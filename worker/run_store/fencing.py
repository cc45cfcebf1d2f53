"""Fencing: only the worker holding a run's current attempt may change it.

``start`` hands a worker an attempt (its id and the attempt's number). Every later change by that worker —
``finish``, ``fail``, each heartbeat (and, through ``finish``, the artifacts the result names) — carries the attempt
and is refused once the run has moved on: retried after the worker stopped beating, started again elsewhere,
ended. A worker cut off from Redis that comes back after its run was retried therefore changes nothing, and learns
from its refused heartbeat that it should stop.

In Redis the attempt also lives in a small key of its own (``<run>:attempt``, written in the same transaction as
the record), so that a heartbeat checks it with one script instead of reading the whole record.
"""

from __future__ import annotations

from dataclasses import dataclass

from worker.run_store.records import RunRecord, RunStatus


@dataclass(frozen=True)
class Attempt:
    """A worker's claim on one attempt of a run: the fencing token it shows with every change."""

    worker_id: str
    number: int

    @classmethod
    def of(cls, record: RunRecord) -> "Attempt":
        """The attempt a started record names."""
        return cls(record.worker_id or "", record.attempts)

    @property
    def token(self) -> str:
        return f"{self.number}:{self.worker_id}"

    def holds(self, record: RunRecord) -> bool:
        """Whether this is still the run's current attempt."""
        return record.status == RunStatus.STARTED and Attempt.of(record) == self


RENEW_IF_HELD = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[2])
return 1
"""
"""Heartbeat: ``KEYS = [attempt key, heartbeat key]``, ``ARGV = [token, ttl seconds]``; renews the heartbeat only
while the attempt key holds the token (1), else changes nothing (0)."""
