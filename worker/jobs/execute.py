"""The queue's job function: execute one stored run request on this worker.

``execute_run(run_id)`` is what the dispatcher enqueues (RQ, JSON-serialized: the job carries only the run id;
the request lives in the run store). It marks the run started, renews its heartbeat from a thread (which also
notices a cancel request and stops the command), runs it with this process's runtime through the core that the
in-process dispatcher shares (``worker.jobs.core``), and stores the result.
A worker process keeps one event loop and one runtime per kind, so workspaces' spawners and staging caches
survive from job to job.

``prepare_environments(root, skills, runtime)`` is the other job: it builds a library version's dependency
environments for one runtime (``local`` or ``docker``) through that runtime (``prepare_environment``: sandboxed, into
the store runs use; on Docker also the derived images of skills' Debian packages), for the API's library
registration. Workers of that runtime take it from its environments queue (``worker.jobs.consumer``).

``remove_kept_workspace(workspace_id)`` removes a kept workspace the API marked removing (idle, deleted, its session
deleted) on a worker of its runtime — folder, user id, spawner, container, sandbox — and forgets its registry entry
(``worker.run_store.workspaces``); workers take it from their runtime's workspaces queue.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from rq import Queue, get_current_job
from rq.job import Job
from rq.serializers import JSONSerializer

from worker import defaults
from worker.artifacts import create_artifact_store
from worker.config import get_worker_settings
from worker.contract import RunRequest, RuntimeName, SkillRef
from worker.errors import ArtifactError, WorkerError, WorkspaceError
from worker.jobs.core import execute_started
from worker.jobs.fair_queue import TeamGate
from worker.jobs.nodes import node_id, node_queue_name
from worker.run_store import Attempt, BaseRunStore, RedisRunStore, RedisWorkspaces, RunRecord, RunStatus
from worker.runtimes import BaseWorkspaceRuntime, resolve_runtime
from worker.runtimes.base import worker_id
from worker.runtimes.host import HostWorkspaceRuntime
from worker.secrets.store import RedisSecretStore, SecretStore, box_from
from worker.workspaces.staging import resolve_skill_paths
from worker.workspaces.manager import default_work_root

logger = logging.getLogger(__name__)

PREPARE_BEAT_KEY = "skillrun:prepare-beat:{}"
"""Renewed while a preparation job runs (by job id): a started job without it lost its worker."""
WAITING = "waiting its turn"

ARTIFACT_PRUNE_SECONDS = 300.0
STORE_OUTAGE_SECONDS = 600.0
"""How long a worker holds a run's ending (result or failure) while Redis is away, trying again every
``STORE_RETRY_SECONDS``: an outage costs no result and no worker (a late ending is fenced like any other)."""
STORE_RETRY_SECONDS = 1.0
"""How often a worker process removes artifact versions past their retention."""

_loop: asyncio.AbstractEventLoop | None = None
_pruned_at = float("-inf")
_runtimes: dict[str, BaseWorkspaceRuntime] = {}


def _event_loop() -> asyncio.AbstractEventLoop:
    global _loop
    if _loop is None or _loop.is_closed():
        _loop = asyncio.new_event_loop()
    return _loop


def runtime_for(name: str) -> BaseWorkspaceRuntime:
    """This process's runtime of kind ``name``, built from the worker settings on first use."""
    if name not in _runtimes:
        settings = get_worker_settings()
        # the rest (limits, the Docker runtime's OCI runtime and pool) are resolve_runtime's, from the same settings
        _runtimes[name] = resolve_runtime(name, work_root=settings.work_root,
                                          artifact_store=create_artifact_store(settings.blob_url, settings.artifacts_dir))
    return _runtimes[name]


def close_runtimes() -> None:
    """Release what this process's runtimes hold (a Docker runtime's warm pool and containers, spawners) as the
    worker stops; a workspace's next run makes what it needs again."""
    loop = _event_loop()
    while _runtimes:
        _, runtime = _runtimes.popitem()
        try:
            loop.run_until_complete(runtime.close())
        except Exception:  # noqa: BLE001 - one runtime's trouble must not keep the others' things
            logger.exception("closing the %s runtime failed", runtime.name.value)


def execute_run(run_id: str, workspace_id: str | None = None, team: str | None = None) -> dict[str, Any]:
    """Run the stored request ``run_id`` (in the kept workspace ``workspace_id``, if it names one); return a short
    summary (the result itself goes to the run store). A kept workspace not placed yet is placed on this worker's
    node; a run of one placed on another node (two runs of a new workspace taken by two nodes at once) is forwarded
    to that node's queue. Once the run started (or was found cancelled), and again when it ended, its ``team``'s
    next run joins the queue if the team has room there (``worker.jobs.fair_queue``)."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("execute_run runs inside an RQ job; call execute_stored_run directly otherwise")
    settings = get_worker_settings()
    store = RedisRunStore(job.connection, result_ttl=settings.result_ttl_seconds, heartbeat_ttl=settings.heartbeat_ttl_seconds)
    gate = TeamGate(job.connection, store.keys.team_running)
    node = this_node()
    if workspace_id is not None and (placed := store.workspaces.place(workspace_id, node)) not in (None, node):
        runtime = job.origin.split(":")[1]  # skillrun:<runtime>[:node:<node>]
        queue = Queue(node_queue_name(runtime, placed), connection=job.connection, serializer=JSONSerializer)
        queue.enqueue_call(execute_run, args=(run_id, workspace_id, team), job_id=job.id.removesuffix("-f") + "-f",
                           timeout=job.timeout, result_ttl=defaults.JOB_RESULT_TTL_SECONDS,
                           failure_ttl=settings.result_ttl_seconds, at_front=True)
        if team is not None:
            gate.started(job.origin, team, job.id)
        return {"run_id": run_id, "forwarded": f"its workspace lives on node {placed}"}
    if team is None:  # a job queued before teams took turns
        return execute_stored_run(store, run_id, worker_id(), node)
    try:
        return execute_stored_run(store, run_id, worker_id(), node,
                                  on_start=lambda: gate.started(job.origin, team, job.id))
    finally:
        gate.ended(job.origin, team)


@functools.cache
def this_node() -> str:
    """This worker's node: its work root's (``worker.jobs.nodes``)."""
    return node_id(get_worker_settings().work_root or default_work_root())


def execute_stored_run(store: BaseRunStore, run_id: str, who: str, node: str | None = None,
                       on_start: Callable[[], object] | None = None) -> dict[str, Any]:
    """Start the run (``on_start()`` then, whether it started or was no longer queued), execute it, store its end."""
    record = store.start(run_id, who, node)
    if on_start is not None:
        on_start()
    if record is None:
        return {"run_id": run_id, "skipped": "not queued (cancelled or already taken)"}
    runtime = runtime_for(record.request.runtime.value)
    held = Attempt.of(record)
    stop = threading.Event()
    beat = threading.Thread(target=_beat, args=(store, run_id, held, runtime, stop), daemon=True, name=f"heartbeat-{run_id}")
    beat.start()
    try:  # redacting is part of the run: its heartbeat goes on
        ended = _event_loop().run_until_complete(
            execute_started(record.request, record, runtime, _secret_store(store), who))
    finally:
        stop.set()
        beat.join()
    if ended.result is None:
        stored = _through_outage(run_id, lambda: store.fail(run_id, ended.said, held))
        summary: dict[str, Any] = {"run_id": run_id, "failed": ended.reason}
    else:
        stored = _through_outage(run_id, lambda: store.finish(run_id, ended.result, held))
        summary = {"run_id": run_id, "exit_code": ended.result.exit_code}
    if ended_by(stored, held):
        _event_loop().run_until_complete(remove_one_off_workspace(runtime, record.request))
    prune_artifacts(runtime)
    return summary


def _secret_store(store: BaseRunStore) -> SecretStore | None:
    """The team secrets beside the run store (Redis), under this worker's key."""
    connection = getattr(store, "redis", None)
    return None if connection is None else RedisSecretStore(connection, box_from(get_worker_settings().secrets_key))


def _through_outage(run_id: str, end: Callable[[], RunRecord | None]) -> RunRecord | None:
    """``end()`` (storing a run's ending), tried again while Redis is away, for up to ``STORE_OUTAGE_SECONDS``."""
    give_up = time.monotonic() + STORE_OUTAGE_SECONDS
    while True:
        try:
            return end()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if time.monotonic() >= give_up:
                raise
            logger.warning("run %s ended but Redis is away (%s); storing its ending again in %s s", run_id, exc,
                           STORE_RETRY_SECONDS)
            time.sleep(STORE_RETRY_SECONDS)


def prune_artifacts(runtime: BaseWorkspaceRuntime) -> None:
    """Every ``ARTIFACT_PRUNE_SECONDS`` (per process), remove artifact versions older than the artifact TTL (workers
    after their runs; the inline dispatcher after its own)."""
    global _pruned_at
    if not isinstance(runtime, HostWorkspaceRuntime) or time.monotonic() - _pruned_at < ARTIFACT_PRUNE_SECONDS:
        return
    _pruned_at = time.monotonic()
    try:
        runtime.artifact_store.prune(time.time() - get_worker_settings().artifacts_kept_seconds)
    except (OSError, ArtifactError):  # the store (a folder, a bucket) is away: the next prune takes what this left
        logger.warning("pruning artifacts failed; trying again later", exc_info=True)


def ended_by(record: RunRecord | None, held: Attempt) -> bool:
    """Whether the run ended in ``held``'s attempt (not retried meanwhile): its workspace is then no other attempt's."""
    return record is not None and record.status.done and record.attempts == held.number


async def remove_one_off_workspace(runtime: BaseWorkspaceRuntime, request: RunRequest) -> None:
    """Once a run's result is stored, remove its workspace unless the request keeps it (``keep_workspace``: a named
    workspace is kept by default): once no other run is in it, and not if a run that keeps it was
    (``end_one_off_workspace``). Output files travel in the result and artifacts live in the artifact store, so
    neither goes with it."""
    if request.keep_workspace:
        return
    try:
        await runtime.end_one_off_workspace(request.workspace_id)
    except WorkerError as exc:  # never made (the run failed before), or not removable: it is logged, not fatal
        logger.info("workspace %s of run %s was not removed: %s", request.workspace_id, request.run_id, exc)
    except OSError:
        logger.warning("removing workspace %s of run %s failed", request.workspace_id, request.run_id, exc_info=True)


def remove_lost_runs_workspace(run_id: str) -> dict[str, str]:
    """The RQ job removing the one-off workspace of a run the lost-run sweep failed (no attempt ended it on a
    worker), on a worker of its runtime; the record says which workspace, and only a failed one-off run's goes."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("remove_lost_runs_workspace runs inside an RQ job")
    record = RedisRunStore(job.connection).get(run_id)
    if record is None or record.status != RunStatus.FAILED or record.request.keep_workspace:
        return {"run_id": run_id, "skipped": "not a failed run's own workspace"}
    runtime = runtime_for(record.request.runtime.value)
    _event_loop().run_until_complete(remove_one_off_workspace(runtime, record.request))
    return {"run_id": run_id, "removed": record.request.workspace_id}


def remove_kept_workspace(workspace_id: str) -> dict[str, str]:
    """The RQ job removing a kept workspace the API marked removing, on a worker of its runtime; its entry is
    forgotten once it is gone (a workspace not on this worker's disk or service is gone already). A failure leaves
    the entry marked: idle removal asks again later."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("remove_kept_workspace runs inside an RQ job")
    registry = RedisRunStore(job.connection).workspaces
    return _event_loop().run_until_complete(remove_marked_workspace(registry, workspace_id))


async def remove_marked_workspace(registry: RedisWorkspaces, workspace_id: str) -> dict[str, str]:
    entry = await asyncio.to_thread(registry.get, workspace_id)
    if entry is None or entry.state != "removing":
        return {"workspace_id": workspace_id, "skipped": "not marked removing (gone, or in use again)"}
    try:
        await runtime_for(entry.runtime.value).end_workspace(workspace_id)
    except WorkspaceError as exc:
        logger.info("workspace %s was gone already: %s", workspace_id, exc)
    await asyncio.to_thread(registry.forget, workspace_id)
    return {"workspace_id": workspace_id, "removed": entry.runtime.value}


def _beat(store: BaseRunStore, run_id: str, held: Attempt, runtime: BaseWorkspaceRuntime, stop: threading.Event) -> None:
    while not stop.wait(defaults.HEARTBEAT_SECONDS):
        try:
            holds = store.heartbeat(run_id, held)
            record = store.get(run_id)
        except Exception:  # a Redis hiccup must not end the heartbeat: the next beat tries again
            logger.warning("heartbeat of run %s failed; trying again", run_id, exc_info=True)
            continue
        if not holds or (record is not None and record.cancel_requested):  # superseded (fenced out) or cancelled
            runtime.cancel(run_id)


def prepare_environments(
    root: str, skills: list[list[str]], runtime: str = RuntimeName.LOCAL.value, digest: str | None = None,
) -> dict[str, str]:
    """Prepare the environments of the skills ``[name, path]`` of the library version at ``root`` (its archive's
    sha256 ``digest``: fetched from the API where the folder is not on this worker, ``worker.roots.library_fetch``) for
    ``runtime``, one after another, through this worker's runtime of that kind; return each skill's state.

    The job's ``meta`` tells the API how far it got: ``pending`` maps each skill not done yet to its latest step,
    ``errors`` a skill this worker could not prepare at all to why (a build's own failure is in the store). A
    thread renews ``PREPARE_BEAT_KEY`` meanwhile, so a job whose worker died is not taken for one under way."""
    job = get_current_job()
    if job is None:
        raise RuntimeError("prepare_environments runs inside an RQ job")
    beat_key = PREPARE_BEAT_KEY.format(job.id)
    ttl = get_worker_settings().heartbeat_ttl_seconds
    job.connection.set(beat_key, worker_id(), ex=ttl)
    stop = threading.Event()
    beat = threading.Thread(target=_beat_preparation, args=(job.connection, beat_key, ttl, stop), daemon=True,
                            name=f"heartbeat-{job.id}")
    beat.start()
    states: dict[str, str] = {}
    job.meta["pending"] = {name: WAITING for name, _ in skills}
    job.meta.setdefault("errors", {})
    try:
        host = runtime_for(runtime)
        if not isinstance(host, HostWorkspaceRuntime):
            raise WorkerError(f"the {runtime} runtime does not prepare environments ahead of runs")
        for name, path in skills:
            skill = SkillRef(name=name, root=root, path=path, digest=digest)
            states[name] = _event_loop().run_until_complete(_prepare_one(job, host, skill))
            del job.meta["pending"][name]
            job.save_meta()
    finally:
        stop.set()
        beat.join()
        job.connection.delete(beat_key)
    return states


async def _prepare_one(job: Job, runtime: HostWorkspaceRuntime, skill: SkillRef) -> str:
    """One skill's environment, its progress saved in the job's ``meta`` as it goes."""

    def progress(message: str) -> None:
        job.meta["pending"][skill.name] = message
        job.save_meta()

    progress("starting")
    try:
        real_root, skill_dir = await asyncio.to_thread(resolve_skill_paths, skill)
        status = await runtime.prepare_environment(skill_dir, real_root, skill.name, progress)
    except WorkerError as exc:  # the library cannot be had here, or the builder cannot start: say why
        job.meta["errors"][skill.name] = f"the worker could not prepare it: {exc}"
        return "failed"
    job.meta["errors"].pop(skill.name, None)
    return status.state


def _beat_preparation(connection: redis.Redis, key: str, ttl: int, stop: threading.Event) -> None:
    while not stop.wait(defaults.HEARTBEAT_SECONDS):
        try:
            connection.set(key, worker_id(), ex=ttl)
        except redis.RedisError:  # a Redis hiccup must not end the heartbeat: the next beat tries again
            logger.warning("heartbeat of preparation %s failed; trying again", key, exc_info=True)
