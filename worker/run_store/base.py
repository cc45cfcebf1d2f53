"""The run store's contract and its changes of state, and the in-process store of the embedded default.

A started run carries a heartbeat its worker renews; a run whose heartbeat expired is *lost*: the dispatcher
retries it (event ``retried`` with the reason) until ``max_attempts``, then fails it with the reason. A run is
never left "started" forever. Every change by a worker is fenced by its ``Attempt`` (``worker.run_store.fencing``).

A team's quota of stored artifacts counts what its ended runs' artifacts keep (tallied by the hour each run ended)
and what its runs going hold (``RunRecord.artifact_bytes_reserved``). A run saving artifacts is given its room in
the step that accepts it, against both (``hold_artifact_room``): what it may store is held for it from then, and the
hold ends in the write that ends the run — finished, failed, cancelled queued or started, or failed once lost — which
tallies what it stored instead. So what a team keeps and holds together never passes its quota, however many of its
runs are accepted at once.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from worker.config import get_worker_settings
from worker.contract import RunRequest, RunResult
from worker.errors import WorkerError
from worker.run_store.fencing import Attempt
from worker.run_store.records import Mutation, RunEvent, RunRecord, RunStatus, duration_bucket
from worker.run_store.workspaces import MemoryWorkspaces, joining

if TYPE_CHECKING:
    from worker.run_store.workspaces import RedisWorkspaces

TRIM_BATCH = 100
"""Expired runs one step removes at most: a memory store's call (from its records), a Redis store's run that ends or
one script call of its ``trim_expired`` (from the indexes)."""
TALLY_SECONDS = 3600
"""A team's artifact bytes are tallied by the hour their runs ended (``team_artifact_bytes``)."""


def artifact_bytes(record: RunRecord) -> int:
    """What the artifacts of ``record``'s result hold (what its team's quota of stored artifacts counts)."""
    return sum(artifact.size for artifact in record.result.artifact_files) if record.result is not None else 0


class ArtifactRoomRefusedError(WorkerError):
    """A run saving artifacts finds nothing left of its team's quota of ``limit`` bytes: its ended runs' artifacts
    keep ``kept`` and its runs going hold ``reserved``."""

    def __init__(self, team: str, limit: int, kept: int, reserved: int) -> None:
        super().__init__(f"team {team} keeps {kept} bytes of artifacts and holds {reserved} for its runs going, "
                         f"of its {limit}")
        self.team = team
        self.limit = limit
        self.kept = kept
        self.reserved = reserved


def hold_artifact_room(record: RunRecord, limit: int, asked: int, kept: int, reserved: int) -> None:
    """Give the new run ``record``, asking to store ``asked`` bytes of artifacts, its room under its team's quota of
    ``limit`` bytes, of which ``kept`` are kept and ``reserved`` held: its ``limits.artifact_total_bytes`` and
    ``artifact_bytes_reserved`` become the least of what it asked and what is left; ``ArtifactRoomRefusedError``
    when nothing is left."""
    left = limit - kept - reserved
    if left <= 0:
        raise ArtifactRoomRefusedError(record.owner or "", limit, kept, reserved)
    record.request.limits.artifact_total_bytes = record.artifact_bytes_reserved = min(asked, left)


class BaseRunStore(ABC):
    """Blocking by design (Redis calls); async readers use ``worker.run_store.watch``. A run that keeps its
    workspace claims it in ``workspaces`` when it is created and releases it when it ends
    (``worker.run_store.workspaces``)."""

    workspaces: MemoryWorkspaces | RedisWorkspaces
    """The registry of kept workspaces, next to the records."""

    @abstractmethod
    def create(self, request: RunRequest, owner: str | None = None, workspace_limit: int | None = None,
               artifact_limit: int | None = None) -> RunRecord:
        """A new queued run of ``owner`` (who keeps ``workspace_limit`` workspaces at most, when given). With
        ``artifact_limit`` (its quota of stored artifacts, in bytes), a run of ``owner`` saving artifacts is given
        its room in the same step (``hold_artifact_room``: ``ArtifactRoomRefusedError``, nothing stored)."""

    @abstractmethod
    def get(self, run_id: str) -> RunRecord | None: ...

    @abstractmethod
    def update(self, run_id: str, mutate: Mutation) -> RunRecord | None:
        """Change the stored record atomically: ``mutate`` edits a copy in place and returns the event to record, or
        ``None`` to leave the record as it is. A concurrent change makes the update start again, so no update is
        ever lost. Returns the record as stored afterwards, or ``None`` when there is no such run."""

    @abstractmethod
    def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        """Events after the first ``after`` ones."""

    @abstractmethod
    def list(self, status: RunStatus | None = None, limit: int = 100, owner: str | None = None) -> list[RunRecord]:
        """Newest first; only ``owner``'s runs when given."""

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """Counts of runs by status, and a histogram of finished runs' durations (for ``/metrics``)."""

    @abstractmethod
    def team_usage(self, team: str) -> tuple[int, int]:
        """How many runs of ``team`` are queued and started (what its quotas count)."""

    @abstractmethod
    def team_artifact_bytes(self, team: str) -> int:
        """What the artifacts of ``team``'s runs that ended within the artifacts' retention (``artifact_ttl``)
        hold: tallied by the hour each run ended, so an hour's tally goes when its artifacts go (within the hour)."""

    @abstractmethod
    def team_artifact_reserved(self, team: str) -> int:
        """What ``team``'s runs going (accepted, not ended) hold of its quota of stored artifacts."""

    def heartbeat(self, run_id: str, attempt: Attempt) -> bool:
        """The worker of ``attempt`` is alive; ``False`` (nothing renewed) when it no longer holds the run."""
        record = self.get(run_id)
        return record is not None and attempt.holds(record)

    def alive_id(self, run_id: str) -> bool:
        """Whether the worker of run ``run_id`` is beating."""
        return True

    def start(self, run_id: str, worker_id: str, node: str | None = None) -> RunRecord | None:
        """Mark a queued run started by ``worker_id`` of ``node`` (its attempt: ``Attempt.of(record)``); ``None``
        when it is not queued (cancelled, or taken). A store whose runs can be lost records the first heartbeat
        with the change."""

        def mutate(record: RunRecord) -> RunEvent | None:
            if record.status != RunStatus.QUEUED:
                return None
            record.status = RunStatus.STARTED
            record.worker_id = worker_id
            record.node = node
            record.attempts += 1
            record.started_at = time.time()
            return RunEvent(type="started", data={"worker_id": worker_id, "attempt": record.attempts,
                                                  "queue_ms": round((record.started_at - record.created_at) * 1000, 3)})

        record = self.update(run_id, mutate)
        return record if record is not None and record.status == RunStatus.STARTED and record.worker_id == worker_id else None

    def finish(self, run_id: str, result: RunResult, attempt: Attempt) -> RunRecord | None:
        """Store the result of ``attempt``: ``cancelled`` when a cancel was asked for meanwhile, else ``finished``.
        A superseded attempt (retried, ended) changes nothing."""

        def mutate(record: RunRecord) -> RunEvent | None:
            if not attempt.holds(record):
                return None
            record.result = result
            record.status = RunStatus.CANCELLED if record.cancel_requested else RunStatus.FINISHED
            record.finished_at = time.time()
            return RunEvent(type=record.status.value, data={
                "exit_code": result.exit_code, "timed_out": result.timed_out, "timings": result.timings.model_dump()})

        return self.update(run_id, mutate)

    def fail(self, run_id: str, reason: str, attempt: Attempt) -> RunRecord | None:
        """``attempt`` could not execute the run: it fails with ``reason``. A superseded attempt changes nothing."""

        def mutate(record: RunRecord) -> RunEvent | None:
            if not attempt.holds(record):
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

    def fail_waiting(self, run_id: str, reason: str) -> RunRecord | None:
        """A queued run that can never start (its workspace is lost) fails with ``reason``; ``None`` when it is no
        longer queued."""

        def mutate(record: RunRecord) -> RunEvent | None:
            if record.status != RunStatus.QUEUED:
                return None
            record.status = RunStatus.FAILED
            record.error = reason
            record.finished_at = time.time()
            return RunEvent(type="failed", data={"reason": reason})

        record = self.update(run_id, mutate)
        return record if record is not None and record.status == RunStatus.FAILED and record.error == reason else None

    def requeue_stranded(self, run_id: str, reason: str) -> RunRecord | None:
        """A queued run whose job was lost before any worker started it goes back to the queue (event
        ``requeued`` with ``reason``); ``None`` when it is no longer queued."""

        def mutate(record: RunRecord) -> RunEvent | None:
            return RunEvent(type="requeued", data={"reason": reason}) if record.status == RunStatus.QUEUED else None

        record = self.update(run_id, mutate)
        return record if record is not None and record.status == RunStatus.QUEUED else None

    def close(self) -> None:
        """Release connections."""


class MemoryRunStore(BaseRunStore):
    """Records in this process (the embedded default). ``on_change(run_id)`` is called after every change, from
    whichever thread made it (the dispatcher wakes its waiters with it). An ended run's record and events are kept
    ``result_ttl`` seconds (``None``: as long as the store lives); every call drops up to ``TRIM_BATCH`` expired
    ones, oldest first, before it answers, so an expired run is never served. A team's artifact tally holds the
    hours of the artifacts' retention only; what its runs going hold is summed from their records (an ended run
    holds nothing), under the lock that creates and ends them. ``workspace_limit``: kept workspaces an owner may have
    at once."""

    def __init__(
        self, on_change: Callable[[str], None] | None = None, *, result_ttl: float | None = None,
        clock: Callable[[], float] = time.time, workspace_limit: int | None = None,
        artifact_ttl: float | None = None,
    ) -> None:
        """``artifact_ttl``: how long artifacts are kept (default: the worker's ``artifacts_kept_seconds``)."""
        self._records: dict[str, RunRecord] = {}
        self._artifacts: dict[str, dict[int, int]] = {}
        self.artifact_ttl = get_worker_settings().artifacts_kept_seconds if artifact_ttl is None else artifact_ttl
        self._events: dict[str, list[RunEvent]] = {}
        self._ended: deque[tuple[float, str]] = deque()
        self._lock = threading.Lock()
        self.on_change = on_change
        self.result_ttl = result_ttl
        self.clock = clock
        self.workspaces = MemoryWorkspaces(limit=workspace_limit, clock=clock)

    def _trim(self) -> None:
        """Forget up to ``TRIM_BATCH`` runs that ended more than ``result_ttl`` ago (under the lock)."""
        if self.result_ttl is None:
            return
        cutoff = self.clock() - self.result_ttl
        for _ in range(TRIM_BATCH):
            if not self._ended or self._ended[0][0] > cutoff:
                return
            _, run_id = self._ended.popleft()
            self._records.pop(run_id, None)
            self._events.pop(run_id, None)

    def _changed(self, run_id: str) -> None:
        if self.on_change is not None:
            self.on_change(run_id)

    def create(self, request: RunRequest, owner: str | None = None, workspace_limit: int | None = None,
               artifact_limit: int | None = None) -> RunRecord:
        with self._lock:
            request = joining(self.workspaces, request)
            record = RunRecord(id=request.run_id, request=request, owner=owner)
            self._trim()
            if record.id in self._records:
                raise ValueError(f"run {record.id!r} already exists")
            if artifact_limit and request.save_as_artifacts and owner is not None:
                hold_artifact_room(record, artifact_limit, request.limits.artifact_total_bytes, self._kept(owner),
                                   self._reserved(owner))
            if request.keep_workspace:
                self.workspaces.claim(request, owner, limit=workspace_limit)
            self._records[record.id] = record.model_copy(deep=True)
            self._events[record.id] = [RunEvent(type="queued")]
        self._changed(record.id)
        return record

    def get(self, run_id: str) -> RunRecord | None:
        with self._lock:
            self._trim()
            record = self._records.get(run_id)
            return record.model_copy(deep=True) if record else None

    def update(self, run_id: str, mutate: Mutation) -> RunRecord | None:
        with self._lock:
            self._trim()
            stored = self._records.get(run_id)
            if stored is None:
                return None
            record = stored.model_copy(deep=True)
            event = mutate(record)
            if event is None:
                return stored.model_copy(deep=True)
            self._records[run_id] = record.model_copy(deep=True)
            self._events.setdefault(run_id, []).append(event)
            if record.status.done and not stored.status.done:
                self._ended.append((self.clock(), run_id))
                if record.request.keep_workspace:
                    self.workspaces.release(record.request.workspace_id, run_id)
                if record.owner is not None and (stored_bytes := artifact_bytes(record)):
                    tally = self._artifacts.setdefault(record.owner, {})
                    hour = int(self.clock() // TALLY_SECONDS)
                    tally[hour] = tally.get(hour, 0) + stored_bytes
                    self._prune_tally(record.owner)
        self._changed(run_id)
        return record

    def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        with self._lock:
            self._trim()
            return list(self._events.get(run_id, [])[after:])

    def list(self, status: RunStatus | None = None, limit: int = 100, owner: str | None = None) -> list[RunRecord]:
        with self._lock:
            self._trim()
            records = sorted(self._records.values(), key=lambda r: r.created_at, reverse=True)
            return [r.model_copy(deep=True) for r in records
                    if (status is None or r.status == status) and (owner is None or r.owner == owner)][:limit]

    def team_usage(self, team: str) -> tuple[int, int]:
        with self._lock:
            self._trim()
            mine = [record.status for record in self._records.values() if record.owner == team]
        return mine.count(RunStatus.QUEUED), mine.count(RunStatus.STARTED)

    def _prune_tally(self, team: str) -> None:
        """Drop the hours of ``team``'s artifact tally whose artifacts are gone, the tally with the last (under the
        lock)."""
        first = int((self.clock() - self.artifact_ttl) // TALLY_SECONDS)
        tally = self._artifacts.get(team, {})
        for hour in [hour for hour in tally if hour < first]:
            del tally[hour]
        if not tally:
            self._artifacts.pop(team, None)

    def _kept(self, team: str) -> int:
        """What ``team``'s tally holds within the artifacts' retention (under the lock)."""
        self._prune_tally(team)
        return sum(self._artifacts.get(team, {}).values())

    def _reserved(self, team: str) -> int:
        """What ``team``'s runs going hold of its quota of stored artifacts (under the lock)."""
        return sum(record.artifact_bytes_reserved for record in self._records.values()
                   if record.owner == team and not record.status.done)

    def team_artifact_bytes(self, team: str) -> int:
        with self._lock:
            return self._kept(team)

    def team_artifact_reserved(self, team: str) -> int:
        with self._lock:
            self._trim()
            return self._reserved(team)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._trim()
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
