"""``InlineDispatcher``: the embedded default — runs execute in this process, records live in memory, and so does
the registry of kept workspaces, whose idle ones a background task removes in this process. A team's quota holds
here too (``orchestrator.quotas``): past its ``max_running`` its runs wait, queued, for one of its runs to end."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from orchestrator.dispatch.base import BaseDispatcher, Removal, WorkerStatus, artifact_refusals, workspace_refusals
from orchestrator.dispatch.files import DirectFiles
from orchestrator.errors import DispatchError
from orchestrator.quotas import TeamQuota, queued_refusal
from worker import defaults
from worker.contract import RunRequest, RunResult
from worker.errors import WorkspaceError
from worker.jobs import execute_started, prune_artifacts, remove_one_off_workspace
from worker.run_store import (
    Attempt,
    MemoryRunStore,
    RunEvent,
    RunRecord,
    RunStatus,
    RunWaiters,
    WorkspaceEntry,
)
from worker.runtimes import BaseWorkspaceRuntime, resolve_runtime, worker_id
from worker.secrets import SecretStore

logger = logging.getLogger(__name__)


class InlineDispatcher(BaseDispatcher):
    """Executes runs in this process with runtimes built on first use."""

    def __init__(
        self,
        runtimes: dict[str, BaseWorkspaceRuntime] | None = None,
        runtime_options: dict[str, dict[str, Any]] | None = None,
        *,
        result_ttl: int = defaults.RESULT_TTL_SECONDS,
        workspace_limit: int | None = None,
        workspace_idle_seconds: float | None = None,
        secrets: SecretStore | None = None,
    ) -> None:
        """Ended runs' records (results and their output files with them) are kept ``result_ttl`` seconds; an owner
        keeps ``workspace_limit`` workspaces at most, each removed once unused for ``workspace_idle_seconds``. Runs
        that name team secrets get them from ``secrets``."""
        self._runtimes: dict[str, BaseWorkspaceRuntime] = dict(runtimes or {})
        self._options = runtime_options or {}
        self.secrets = secrets
        self.waiters = RunWaiters()
        self.result_ttl = result_ttl
        self.workspace_idle_seconds = workspace_idle_seconds
        self.store = MemoryRunStore(on_change=self.waiters.notify_threadsafe, result_ttl=result_ttl,
                                    workspace_limit=workspace_limit)
        self._tasks: dict[str, asyncio.Task] = {}
        self._turns: dict[str, asyncio.Condition] = {}
        self._running: dict[str, int] = {}
        self._expiring: asyncio.Task | None = None
        self._who = worker_id()

    async def workers(self) -> list[WorkerStatus]:
        """This process: it executes the runs itself."""
        running = sorted(run_id for run_id, task in self._tasks.items() if not task.done())
        return [WorkerStatus(name=f"{self._who} (this API process)", queues=sorted(self._runtimes) or ["local"],
                             state="busy" if running else "idle", last_heartbeat=time.time(), alive=True,
                             current_run=running[0] if running else None)]

    def runtime(self, name: str) -> BaseWorkspaceRuntime:
        if name not in self._runtimes:
            self._runtimes[name] = resolve_runtime(name, **self._options.get(name, {}))
        return self._runtimes[name]

    @contextlib.asynccontextmanager
    async def workspace_files(self, request: RunRequest, owner: str | None = None) -> AsyncIterator[DirectFiles | None]:
        if not self.store.workspaces.join(request, owner):
            yield None
            return
        try:
            async with self.runtime(request.runtime.value).workspace_files(request.workspace_id) as files:
                secrets = self.secrets
                yield None if files is None else DirectFiles(
                    files, None if secrets is None else lambda: secrets.reveal_all(owner))
        finally:
            self.store.workspaces.release(request.workspace_id, request.run_id)

    async def look(self, run_id: str) -> RunRecord | None:
        return self.store.get(run_id)

    async def events(self, run_id: str, after: int = 0) -> list[RunEvent]:
        return self.store.events(run_id, after)

    async def submit(
        self, request: RunRequest, *, trusted: bool = False, priority: bool = False, owner: str | None = None
    ) -> RunRecord:
        runtime = self.runtime(request.runtime.value)
        record, quota = await self._accept(request, owner)
        request = record.request  # as accepted (a run naming a kept workspace joins it)
        task = asyncio.create_task(self._execute(runtime, request, trusted, owner=owner, quota=quota))
        self._tasks[request.run_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request.run_id, None))
        return record

    async def _accept(self, request: RunRequest, owner: str | None) -> tuple[RunRecord, TeamQuota | None]:
        """The new run's record, held to its team's quota: nothing awaited between the count of its queued runs and
        the record, and its room for artifacts held in the store's step that makes the record."""
        quota = await self._checked(request, owner)
        if quota is not None and owner is not None and quota.max_queued and \
                self.store.team_usage(owner)[0] >= quota.max_queued:
            raise queued_refusal(owner, quota.max_queued, request.timeout)
        with workspace_refusals(), artifact_refusals(self.store.artifact_ttl):
            if quota is None:
                return self.store.create(request, owner), quota
            return self.store.create(request, owner, quota.max_workspaces, quota.max_artifact_bytes), quota

    @contextlib.asynccontextmanager
    async def _turn(self, owner: str | None, quota: TeamQuota | None) -> AsyncIterator[None]:
        """Wait until ``owner`` has fewer runs going than its quota's ``max_running`` (in order), and hold one. One
        condition per team with a cap (teams are the operator's: bounded)."""
        cap = quota.max_running if quota is not None and owner is not None else 0
        if not cap:
            yield
            return
        turn = self._turns.setdefault(owner, asyncio.Condition())
        async with turn:
            try:
                await turn.wait_for(lambda: self._running.get(owner, 0) < cap)
            except asyncio.CancelledError:  # cancelled (maybe once handed the turn: Python 3.11 loses that notice)
                turn.notify()  # the next waiting run looks again
                raise
            self._running[owner] = self._running.get(owner, 0) + 1
        try:
            yield
        finally:
            async with turn:
                self._running[owner] -= 1
                if not self._running[owner]:
                    del self._running[owner]
                turn.notify()

    async def _execute(
        self, runtime: BaseWorkspaceRuntime, request: RunRequest, trusted: bool, *, reraise: bool = False,
        owner: str | None = None, quota: TeamQuota | None = None,
    ) -> RunResult | None:
        async with self._turn(owner, quota):
            return await self._execute_now(runtime, request, trusted, reraise=reraise)

    async def _execute_now(
        self, runtime: BaseWorkspaceRuntime, request: RunRequest, trusted: bool, *, reraise: bool = False
    ) -> RunResult | None:
        record = self.store.start(request.run_id, self._who)
        if record is None:
            return None
        held = Attempt.of(record)
        ended = await execute_started(request, record, runtime, self.secrets, self._who, allow_host_paths=trusted)
        if ended.result is None:
            self.store.fail(request.run_id, ended.said, held)
            await _clean_up(runtime, request)
            if reraise and ended.redacted:  # the caller (a model's tool) sees the reason redacted
                raise DispatchError(ended.said) from None
            if reraise:
                raise ended.failure
            return None
        self.store.finish(request.run_id, ended.result, held)
        await _clean_up(runtime, request)
        return ended.result

    async def run(self, request: RunRequest, *, trusted: bool = False, owner: str | None = None) -> RunResult:
        """In process there is nothing to wait for: run at once; bad input raises as it is. A caller cancelled while
        the run goes on cancels it, and waits for it to end (its processes gone, its record cancelled)."""
        runtime = self.runtime(request.runtime.value)
        record, quota = await self._accept(request, owner)
        request = record.request  # as accepted (see submit)
        task = asyncio.create_task(self._execute(runtime, request, trusted, reraise=True, owner=owner, quota=quota))
        self._tasks[request.run_id] = task
        task.add_done_callback(lambda _: self._tasks.pop(request.run_id, None))
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            await asyncio.shield(self._end(task, request.run_id))
            raise
        assert result is not None  # a new record is always queued, so it starts
        return result

    async def _end(self, task: asyncio.Task, run_id: str) -> None:
        await self.cancel(run_id)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await task

    async def cancel(self, run_id: str) -> RunRecord | None:
        record = await super().cancel(run_id)
        if record is not None and record.status == RunStatus.STARTED:
            self.runtime(record.request.runtime.value).cancel(run_id)
        elif record is not None and record.started_at is None and run_id in self._tasks:
            self._tasks[run_id].cancel()  # cancelled while it waited for its team's turn: it waits no more
        return record

    async def _remove_marked(self, entry: WorkspaceEntry) -> Removal:
        try:
            await self.runtime(entry.runtime.value).end_workspace(entry.id)
        except WorkspaceError as exc:  # not on this host (removed from outside): gone already
            logger.info("workspace %s was gone already: %s", entry.id, exc)
        self.store.workspaces.forget(entry.id)
        return "removed"

    def start(self) -> None:
        """Begin looking for idle workspaces now and then (with ``workspace_idle_seconds``)."""
        if self.workspace_idle_seconds is not None and (self._expiring is None or self._expiring.done()):
            self._expiring = asyncio.create_task(self._expire_forever(), name="skillrun-idle-workspaces")

    async def _expire_forever(self) -> None:
        while True:
            await asyncio.sleep(self.idle_look_seconds())
            try:
                await self.expire_idle_workspaces()
            except Exception:  # a runtime that cannot remove now (a Cube service away): tried again next time
                logger.warning("removing idle workspaces failed", exc_info=True)

    async def drain(self) -> None:
        """Wait until every run submitted so far has ended, its one-off workspace removed."""
        await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def close(self) -> None:
        if self._expiring is not None:
            self._expiring.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiring
        for task in list(self._tasks.values()):
            task.cancel()
        for runtime in self._runtimes.values():
            await runtime.close()


async def _clean_up(runtime: BaseWorkspaceRuntime, request: RunRequest) -> None:
    """What an ended run leaves: its workspace if it was the run's own, and artifacts past their TTL (in turns)."""
    await remove_one_off_workspace(runtime, request)
    await asyncio.to_thread(prune_artifacts, runtime)
