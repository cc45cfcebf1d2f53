"""Queued runs whose job nothing holds, put back; queued runs of a gone node, failed (the queue dispatcher's sweep).

A worker killed after taking a run's job off a queue and before starting the run leaves the run queued with its job
in no list (RQ pops it; RQ's started-job registry entry of the dead worker stays for minutes, then expires — into
RQ's failed jobs when the job had been marked started, else it stays, expired, for good). An entry whose worker no
longer beats (``worker.jobs.nodes``) counts as expired at once. The sweep looks at the runs queued for
``STRANDED_SECONDS`` or more: one whose job (or a job forwarded for it, ``<id>-<attempt>-f``) is neither waiting in
one of its runtime's queues — the shared one and its live nodes', or their teams' lines (``worker.jobs.fair_queue``) — nor held by a live registry entry, seen so in two
sweeps at least ``STRANDED_SECONDS`` apart, is put back (event ``requeued``). A job that only looked lost is
harmless twice: a run starts once (``store.start``). A run waiting in the queue of a gone node fails with
``workspace_lost`` (``orchestrator.dispatch.placement``).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer

from orchestrator.dispatch.placement import Placement, lost_reason
from worker.jobs import node_queue_name, queue_name, worker_beat_key
from worker.run_store import RedisRunStore, RunRecord

STRANDED_SECONDS = 30.0
"""How long a queued run's job must be missing (and the run queued before) until the sweep puts it back."""
STRANDED_MARK = "skillrun:stranded:{}"
"""When the sweep first saw a run's job missing (by run id; expires after ``STRANDED_MARK_SECONDS``)."""
STRANDED_MARK_SECONDS = 3600
WAITING_PAGE = 5000
"""Job ids read from a queue per round trip when the sweep looks which are waiting."""
LOOKED_AT = 1000
"""Queued runs the sweep looks at in one go (oldest first)."""
JOB_ID = re.compile(r"(.+)-\d+(?:-f)?")
REASON = "its job was lost: the worker that took it stopped before starting it"


def job_id_of(record: RunRecord) -> str:
    """The RQ job id of a queued run's next attempt."""
    return f"{record.id}-{record.attempts + 1}"


def run_of(job_id: str) -> str:
    match = JOB_ID.fullmatch(job_id)
    return match.group(1) if match else job_id


@dataclass
class _Seen:
    """What a runtime's queues hold, by run id."""

    waiting: set[str] = field(default_factory=set)
    held: set[str] = field(default_factory=set)
    expired: dict[str, list[tuple[str, bytes, str]]] = field(default_factory=dict)
    """Run id → the expired registry entries of its jobs: (registry key, entry, job id)."""
    lost: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    """Run id → the gone node whose queue it waits in, and its jobs there."""
    queues: list[str] = field(default_factory=list)
    """The queues looked in."""


class StrandedRuns:
    def __init__(self, connection: redis.Redis, store: RedisRunStore, placement: Placement,
                 enqueue: Callable[[RunRecord], bool]) -> None:
        """``enqueue`` puts a run's next attempt on its queue at the front (``False``: it failed instead)."""
        self.redis, self.store, self.placement, self.enqueue = connection, store, placement, enqueue

    def sweep(self) -> list[str]:
        """Put back the jobs of queued runs that nothing holds, fail those of gone nodes; return the runs put back."""
        now = time.time()
        stale = self.store.waiting_since(now - STRANDED_SECONDS, LOOKED_AT)
        requeued = []
        for runtime in {record.request.runtime.value for record in stale}:
            seen = self._look(runtime, now)
            for record in (r for r in stale if r.request.runtime.value == runtime):
                if record.id in seen.lost:
                    node, jobs = seen.lost[record.id]
                    self.store.fail_waiting(record.id, lost_reason(record.request.workspace_id, node))
                    self._drop(node_queue_name(runtime, node), jobs)
                    continue
                mark = STRANDED_MARK.format(record.id)
                if record.id in seen.held or record.id in seen.waiting or \
                        self.redis.set(mark, now, nx=True, ex=STRANDED_MARK_SECONDS):
                    continue  # held, or first seen missing: a worker may be about to start it
                if now - float(self.redis.get(mark) or now) < STRANDED_SECONDS:
                    continue
                back = self.store.requeue_stranded(record.id, REASON)
                if back is not None:
                    self._clear(seen, job_id_of(back), seen.expired.get(record.id, []))
                    if self.enqueue(back):
                        requeued.append(back.id)
                self.redis.delete(mark)
        return requeued

    def _look(self, runtime: str, now: float) -> _Seen:
        alive, gone = self.placement.nodes(runtime)
        seen = _Seen()
        seen.queues = [queue_name(runtime), *(node_queue_name(runtime, node) for node in alive)]
        for name in seen.queues:
            seen.waiting |= set(self._waiting(name))
            self._started(Queue(name, connection=self.redis, serializer=JSONSerializer), now, seen)
        for node in gone:
            seen.lost |= {run: (node, jobs) for run, jobs in self._waiting(node_queue_name(runtime, node)).items()}
        return seen

    def _started(self, queue: Queue, now: float, seen: _Seen) -> None:
        """The runs a live worker holds, and the registry entries of the ones whose worker is gone: the entry
        expired, or its worker (the execution's ``worker_name``) stopped beating (``worker.jobs.nodes``)."""
        registry = StartedJobRegistry(queue=queue)
        registry.cleanup()
        entries = self.redis.zrange(registry.key, 0, -1, withscores=True)
        with self.redis.pipeline(transaction=False) as pipe:
            for entry, _ in entries:
                pipe.hget(f"rq:execution:{entry.decode()}", "worker_name")
            workers = pipe.execute() if entries else []
        with self.redis.pipeline(transaction=False) as pipe:
            for worker in workers:
                pipe.exists(worker_beat_key(worker.decode()) if worker else "")
            beating = pipe.execute() if entries else []
        for (entry, expires), worker, beats in zip(entries, workers, beating):
            job_id = registry.parse_job_id(entry.decode())
            if expires > now and (beats or not worker):
                seen.held.add(run_of(job_id))
            else:
                seen.expired.setdefault(run_of(job_id), []).append((queue.name, entry, job_id))

    def _clear(self, seen: _Seen, job_id: str, entries: list[tuple[str, bytes, str]]) -> None:
        """Take a dead worker's jobs out of where RQ left them: expired registry entries, its failed jobs."""
        for name, entry, expired_job in entries:
            queue = Queue(name, connection=self.redis, serializer=JSONSerializer)
            self.redis.zrem(StartedJobRegistry(queue=queue).key, entry)
            FailedJobRegistry(queue=queue).remove(expired_job)
        for name in seen.queues:
            FailedJobRegistry(queue=Queue(name, connection=self.redis, serializer=JSONSerializer)).remove(job_id)

    def _waiting(self, name: str) -> dict[str, list[str]]:
        """The runs whose jobs wait in queue ``name`` or in its teams' lines, and those jobs."""
        runs: dict[str, list[str]] = {}
        for job_id in self.placement.gate.waiting(name):
            runs.setdefault(run_of(job_id), []).append(job_id)
        key = Queue(name, connection=self.redis, serializer=JSONSerializer).key
        start = 0
        while True:
            page = self.redis.lrange(key, start, start + WAITING_PAGE - 1)
            for job_id in page:
                runs.setdefault(run_of(job_id.decode()), []).append(job_id.decode())
            if len(page) < WAITING_PAGE:
                return runs
            start += WAITING_PAGE

    def _drop(self, name: str, jobs: list[str]) -> None:
        """Take the jobs of a failed run out of a gone node's queue, records and all."""
        queue = Queue(name, connection=self.redis, serializer=JSONSerializer)
        self.placement.gate.drop(name, jobs)
        for job_id in jobs:
            queue.remove(job_id)
            with contextlib.suppress(NoSuchJobError):
                Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer).delete()
