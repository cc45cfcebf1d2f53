"""Dispatchers' common part: submitting, waiting for a run and following its events, without a thread per waiter.

A wait or an event stream registers with the dispatcher's ``RunWaiters`` and sleeps until its run may have changed
(``InlineDispatcher``: the in-process store says so; ``QueueDispatcher``: one pub/sub subscription per process),
then looks. A waiter also looks now and then (``LOOK_SECONDS``, spread out) in case a change was missed. A record
that vanished while it was followed is ``RunLostError`` (lost, not unknown); Redis unreachable is
``UnavailableError`` (with a ``retry_after``), which a wait rides out for ``OUTAGE_GRACE_SECONDS``.

Kept workspaces (the store's registry, ``worker.run_store.workspaces``) are listed and removed here too: a removal
marks the workspace removing (``WorkspaceConflictError`` while a run is in it), then the dispatcher removes it where
it lives (in process, or through a worker of its runtime); idle removal does the same for every workspace unused for
``workspace_idle_seconds``.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Literal, TypeVar

import redis

from orchestrator.dispatch.files import DirectFiles
from orchestrator.errors import DispatchError, OrchestratorError, RunLostError, UnavailableError
from orchestrator.quotas import Quotas, TeamQuota, apply_ceilings, artifacts_refusal
from orchestrator.text import check_text
from worker import defaults
from worker.contract import RunRequest, RunResult
from worker.run_store import (
    ENDING_EVENTS,
    ArtifactRoomRefusedError,
    BaseRunStore,
    RunEvent,
    RunRecord,
    RunStatus,
    RunWaiters,
    WorkspaceEntry,
    WorkspaceRefusedError,
)

LOOK_SECONDS = 30.0
"""Longest a waiter sleeps without looking at its run, whatever it was told (spread between half and all of it, so
that a thousand waits opened at once do not look at once)."""
OUTAGE_GRACE_SECONDS = 10.0
"""How long a wait rides out Redis being away before it answers ``UnavailableError``."""
OUTAGE_RETRY_SECONDS = 1.0
RETRY_AFTER_SECONDS = 5
"""What callers are told to wait before trying again while Redis is away."""

IDLE_BATCH = 100
"""Idle workspaces one look removes at most."""
Removal = Literal["removed", "removing"]
"""What became of a workspace asked to go: removed now, or handed to a worker of its runtime."""
T = TypeVar("T")


@dataclass(frozen=True)
class WorkerStatus:
    """A process that executes runs, as the operator sees it."""

    name: str
    queues: list[str]
    state: str
    """idle, busy, or what the queue says (suspended...)."""
    last_heartbeat: float | None
    alive: bool
    """Beating now (a worker's own beat has not expired)."""
    current_run: str | None = None


class WorkspaceConflictError(OrchestratorError):
    """A kept workspace cannot be used or removed now (runs are in it, its owner's limit, being removed); the
    message says what to do."""


@contextlib.contextmanager
def workspace_refusals() -> Iterator[None]:
    """The store's refusals of a workspace as ``WorkspaceConflictError``."""
    try:
        yield
    except WorkspaceRefusedError as exc:
        raise WorkspaceConflictError(str(exc)) from exc


@contextlib.contextmanager
def artifact_refusals(retention_seconds: float) -> Iterator[None]:
    """The store's refusal of a run's room for artifacts as its team's ``QuotaExceededError`` (429); the team's
    artifacts are kept ``retention_seconds``."""
    try:
        yield
    except ArtifactRoomRefusedError as exc:
        raise artifacts_refusal(exc.team, exc.limit, exc.kept, exc.reserved, retention_seconds) from exc


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
    workspace_idle_seconds: float | None = None
    """Kept workspaces unused this long are removed (``None``: never; a command line's dispatcher)."""
    quotas: Quotas | None = None
    """The teams' quotas (``orchestrator.quotas``), which each submission of a team is held to (``None``: none)."""

    @abstractmethod
    async def submit(
        self, request: RunRequest, *, trusted: bool = False, priority: bool = False, owner: str | None = None
    ) -> RunRecord:
        """Accept ``request`` for execution. ``trusted`` callers (not a model) may use host paths for inputs;
        ``owner`` (a team) is recorded so that only it sees the run, and the submission is held to its quota
        (``QuotaExceededError``)."""

    @contextlib.asynccontextmanager
    async def workspace_files(self, request: RunRequest, owner: str | None = None) -> AsyncIterator[DirectFiles | None]:
        """The files of ``request``'s kept workspace, reached from this process while the block lasts — for the file
        tools, which read and write there without a run — as one of the workspace's uses (it is not removed under
        the block); ``None`` where a run must go (not here, not ``owner``'s, not made yet, being removed)."""
        yield None

    async def team_quota(self, owner: str | None) -> TeamQuota | None:
        """The quota that holds for ``owner`` (``None``: no quotas here, or no team)."""
        if self.quotas is None or owner is None:
            return None
        return self.quotas.cached(owner) or await asyncio.to_thread(self.quotas.of, owner)

    async def _checked(self, request: RunRequest, owner: str | None) -> TeamQuota | None:
        """What every submission passes before anything of it is stored: its text can be stored
        (``UnencodableTextError``), and it is held to the quota of ``owner`` — returned once its ceilings are
        applied (defaults lowered to them, ``QuotaExceededError`` past them); ``None``: no quotas here, or no team.
        What counts what the team has at once (``max_queued``, ``max_artifact_bytes``) is checked in the step that
        stores the run."""
        check_text(request, "run")
        quota = await self.team_quota(owner)
        if quota is not None:
            apply_ceilings(quota, request, owner)
        return quota

    async def usage(self, owner: str) -> tuple[int, int]:
        """How many runs of ``owner`` are queued and started."""
        with redis_errors():
            return await asyncio.to_thread(self.store.team_usage, owner)

    async def artifact_usage(self, owner: str) -> tuple[int, int]:
        """What the artifacts ``owner``'s ended runs keep hold, and what its runs going hold of its quota."""
        with redis_errors():
            kept = await asyncio.to_thread(self.store.team_artifact_bytes, owner)
            return kept, await asyncio.to_thread(self.store.team_artifact_reserved, owner)

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

    async def _registry(self, call: Callable[..., T], *args: object) -> T:
        """A call on the kept workspaces' registry (blocking: Redis), in a thread."""
        with redis_errors(), workspace_refusals():
            return await asyncio.to_thread(call, *args)

    async def list_workspaces(self, owner: str, offset: int = 0, limit: int = 100) -> tuple[list[WorkspaceEntry], int]:
        """``owner``'s kept workspaces, oldest first, from ``offset``; and how many it has."""
        return await self._registry(self.store.workspaces.list, owner, offset, limit)

    async def get_workspace(self, workspace_id: str) -> WorkspaceEntry | None:
        return await self._registry(self.store.workspaces.get, workspace_id)

    async def remove_workspace(self, workspace_id: str, *, idle_before: float | None = None) -> Removal | None:
        """Remove a kept workspace (``None``: there is none, or it was used since ``idle_before``);
        ``WorkspaceConflictError`` while runs are queued or running in it."""
        entry = await self._registry(self.store.workspaces.mark_removing, workspace_id, idle_before)
        return None if entry is None else await self._remove_marked(entry)

    @abstractmethod
    async def _remove_marked(self, entry: WorkspaceEntry) -> Removal:
        """Remove a workspace marked removing, where it lives; its entry is forgotten once it is gone."""

    async def expire_idle_workspaces(self) -> int:
        """Remove up to ``IDLE_BATCH`` kept workspaces unused for ``workspace_idle_seconds``; how many went (or
        were handed to a worker)."""
        if self.workspace_idle_seconds is None:
            return 0
        before = self.store.workspaces.clock() - self.workspace_idle_seconds
        removed = 0
        for workspace_id in await self._registry(self.store.workspaces.idle, before, IDLE_BATCH):
            with contextlib.suppress(WorkspaceConflictError):  # a run is in it: not idle
                removed += await self.remove_workspace(workspace_id, idle_before=before) is not None
        return removed

    def idle_look_seconds(self) -> float:
        """How often idle workspaces are looked for: a tenth of the idle time, at most every minute."""
        return min((self.workspace_idle_seconds or 600.0) / 10, 60.0)

    def start(self) -> None:
        """Begin the background work (a queue dispatcher's change subscription and lost-run sweep), in the running
        loop; the first wait begins it too."""

    def watch(self, run_id: str, ends_only: bool = False) -> contextlib.AbstractContextManager[asyncio.Event]:
        return self.waiters.watch(run_id, ends_only)

    def stop_waiting(self) -> None:
        """The process is going: every wait answers with the record as it stands, every follower ends."""
        self.stopping = True
        self.waiters.notify_all()

    async def wait(self, run_id: str, timeout: float, owner: str | None = None) -> RunRecord | None:
        """The record once done, or as it stands after ``timeout`` seconds; ``None`` for no such run (and, with
        ``owner``, for another owner's run, without waiting). ``RunLostError`` when the record vanishes meanwhile."""
        deadline = time.monotonic() + timeout
        seen = False
        with self.watch(run_id, ends_only=True) as changed:
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

    @abstractmethod
    async def workers(self) -> list[WorkerStatus]:
        """The processes that execute this dispatcher's runs and how they are."""

    async def run(self, request: RunRequest, *, trusted: bool = False, owner: str | None = None) -> RunResult:
        """Submit ``request`` (for ``owner``, see ``submit``) and return its result once done. A caller cancelled
        while it waits (an agent's turn stopped, an MCP client gone) cancels the run."""
        record = await self.submit(request, trusted=trusted, owner=owner)
        try:
            while not record.status.done:
                record = await self.wait(record.id, request.timeout + defaults.JOB_TIMEOUT_MARGIN_SECONDS)
                if record is None:
                    raise DispatchError(f"run {request.run_id} disappeared from the run store")
        except asyncio.CancelledError:
            await asyncio.shield(self.cancel(request.run_id))
            raise
        if record.result is None:
            raise DispatchError(f"run {record.id} {record.status.value}: {record.error or 'no result'}")
        return record.result

    async def close(self) -> None:
        """Release runtimes and connections."""

    async def __aenter__(self) -> "BaseDispatcher":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
