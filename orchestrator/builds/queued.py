"""``QueuedEnvironments`` — queue mode: builds are sandboxed and need a worker's root (and, for Docker, its engine),
so one RQ job per runtime and library version (its id is theirs, so it is never queued twice) goes to that runtime's
workers (``worker.jobs.execute.prepare_environments`` on ``skillrun:<runtime>:environments``); the job's ``meta`` is its
progress, and the store the API reads is the workers' (``SKILLRUN_ENVS_DIR``, or the shared work root's
``.skillrun/environments``). The API has no engine: the Docker runtime's states are read from what its workers
record there — the target they last built for (the sandbox image's id and ``python3``) and the derived images they
built or failed to build; before any Docker worker has built, a skill's Docker state is ``not built``.

A team's builds are a sorted set of their jobs' ids (``skillrun:builds:<team>``), its ended ones forgotten as it is
read; a registration counts them and enqueues its jobs in one Redis transaction, so API processes racing for a
team's last place let exactly one in.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from functools import cached_property
from pathlib import Path

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from orchestrator.builds.base import LibraryEnvironments, LibrarySkill, Plan, Progress, QuotaOf
from orchestrator.quotas import builds_refusal
from worker.config import WorkerSettings
from worker.contract import RuntimeName
from worker.environments import (
    EnvironmentBuilder,
    EnvironmentStatus,
    SkillEnvironments,
    Target,
    build_settings,
    bundle_digest,
    image_status,
    image_tag,
    local_environments,
)
from worker.errors import DependencyError
from worker.jobs import PREPARE_BEAT_KEY, environments_queue_name, prepare_environments
from worker.roots import cached_sha256
from worker.workspaces import REGISTRY_DIR, default_work_root

WAITING_FOR_WORKER = "waiting for a worker"
JOB_RECORD_SECONDS = 24 * 3600
"""How long a finished preparation job's progress is kept (what it could not do is reported meanwhile)."""
STEPS_PER_SKILL = 4
"""Build steps of one skill, each within SKILLRUN_ENV_BUILD_TIMEOUT: resolve, make, install (and, on Docker, the
derived image)."""
BUILDS_KEY = "skillrun:builds:{}"
"""A team's builds on the queue: the ids of their jobs, scored by when each was queued."""


class QueuedEnvironments(LibraryEnvironments):
    """Queue mode: a worker of each runtime builds; one RQ job per runtime and library version. ``workers`` are the
    settings the workers run with (their environment store, build timeout, CA bundle, heartbeat), which this
    process must share."""

    def __init__(self, connection: redis.Redis, runtimes: list[str], quota_of: QuotaOf | None = None, *,
                 workers: WorkerSettings) -> None:
        super().__init__(runtimes, quota_of)
        self.redis = connection
        self.workers = workers
        self.queues = {name: Queue(environments_queue_name(name), connection=connection, serializer=JSONSerializer)
                       for name in (RuntimeName.LOCAL.value, RuntimeName.DOCKER.value)}

    @cached_property
    def local(self) -> SkillEnvironments:
        """The local runtime's environments in the workers' store (this process never builds)."""
        return workers_environments(self.workers)

    @cached_property
    def docker(self) -> SkillEnvironments:
        """The Docker runtime's environments in the same store, for the target its workers recorded."""
        store = self.local.store
        return SkillEnvironments(EnvironmentBuilder(store, build_settings(sandboxed=False)),
                                 lambda: _recorded(store.recorded_target(RuntimeName.DOCKER.value)))

    def status(self, runtime: str, root: Path, folder: Path, name: str) -> EnvironmentStatus:
        if runtime == RuntimeName.LOCAL.value:
            return self.local.status(folder, root, name)
        try:
            declaration = self.docker.declaration(folder, root, name)
        except DependencyError as exc:
            return EnvironmentStatus("invalid", message=str(exc))
        target = self.docker.store.recorded_target(runtime)
        if target is None or declaration.empty:
            return EnvironmentStatus("none" if declaration.empty else "not built", declaration, message="" if (
                declaration.empty) else "no Docker worker has built for its sandbox image yet")
        status = self.docker.status(folder, root, name)
        if status.state == "invalid" or not declaration.debian:
            return status
        tag = image_tag(target.image, declaration.debian, bundle_digest(self.workers.env_ca_bundle))
        return status.with_image(image_status(self.docker.store, tag, declaration.debian))

    @staticmethod
    def job_id(runtime: str, root: Path) -> str:
        return f"prepare-{runtime}-{hashlib.sha256(str(root).encode()).hexdigest()[:32]}"

    def progress(self, runtime: str, root: Path) -> Progress:
        job = self._job(runtime, root)
        if job is None:
            return Progress()
        pending = dict(job.meta.get("pending", {}))
        errors = dict(job.meta.get("errors", {}))
        if self._under_way(job):
            return Progress(pending, errors)
        status = job.get_status(refresh=False)
        why = "its worker stopped" if status == JobStatus.STARTED else f"the job {status.value}"
        for name in pending:  # left over: the job failed, timed out or lost its worker before them
            errors[name] = (f"the preparation on a worker ended before this skill ({why}); register the library "
                            "version again, or run the skill with wait_for_environment=true, to build it")
        return Progress(errors=errors)

    async def begin(self, root: Path, plan: Plan, team: str, limit: int) -> list[str]:
        try:
            await asyncio.to_thread(self._enqueue, root, plan, team, limit)
        except redis.RedisError as exc:
            return [f"the environments for {', '.join(plan)} could not be queued for a worker ({exc}); register the "
                    "version again to retry"]
        return []

    def _enqueue(self, root: Path, plan: Plan, team: str, limit: int) -> None:
        """One job per runtime of ``plan`` whose job is not under way (an ended one is replaced), and the team's
        places for them, in one transaction: watched, it is tried again when another registration changed the
        team's builds or one of the jobs meanwhile."""
        held_key, digest = BUILDS_KEY.format(team), cached_sha256(root)
        self._forget_ended(team)
        with self.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(held_key, *(Job.key_for(self.job_id(runtime, root)) for runtime in plan))
                    jobs = {runtime: self._job(runtime, root) for runtime in plan}
                    starting = [runtime for runtime, job in jobs.items() if job is None or not self._under_way(job)]
                    held = pipe.zcard(held_key)
                    if limit and starting and held + len(starting) > limit:
                        raise builds_refusal(team, limit, held, len(starting))
                    pipe.multi()
                    for runtime in starting:
                        if jobs[runtime] is not None:
                            jobs[runtime].delete(pipeline=pipe)
                        self._queue_job(pipe, runtime, root, plan[runtime], team, digest)
                        pipe.zadd(held_key, {self.job_id(runtime, root): time.time()})
                    pipe.expire(held_key, JOB_RECORD_SECONDS)
                    pipe.execute()
                    return
                except redis.WatchError:
                    continue

    def _queue_job(self, pipe: redis.client.Pipeline, runtime: str, root: Path, skills: list[LibrarySkill],
                   team: str, digest: str) -> None:
        timeout = len(skills) * STEPS_PER_SKILL * self.workers.env_build_timeout_seconds + 60
        self.queues[runtime].enqueue_call(
            prepare_environments, args=(str(root), [[s.name, s.path] for s in skills], runtime, digest),
            job_id=self.job_id(runtime, root), timeout=int(timeout), result_ttl=JOB_RECORD_SECONDS,
            failure_ttl=JOB_RECORD_SECONDS, pipeline=pipe,
            meta={"pending": {s.name: WAITING_FOR_WORKER for s in skills}, "errors": {}, "team": team},
        )

    def builds(self, team: str) -> int:
        self._forget_ended(team)
        return self.redis.zcard(BUILDS_KEY.format(team))

    def _forget_ended(self, team: str) -> None:
        """Take the builds of ``team`` that ended out of its set: finished, failed, cancelled, their worker lost,
        their job gone, or their job since queued again for another team."""
        held_key = BUILDS_KEY.format(team)
        ended = [job_id for job_id in (member.decode() for member in self.redis.zrange(held_key, 0, -1))
                 if not self._under_way_for(job_id, team)]
        if ended:
            self.redis.zrem(held_key, *ended)

    def _under_way_for(self, job_id: str, team: str) -> bool:
        job = self._fetch(job_id)
        return job is not None and job.meta.get("team") == team and self._under_way(job)

    def _job(self, runtime: str, root: Path) -> Job | None:
        return self._fetch(self.job_id(runtime, root))

    def _fetch(self, job_id: str) -> Job | None:
        try:
            return Job.fetch(job_id, connection=self.redis, serializer=JSONSerializer)
        except NoSuchJobError:
            return None

    def _under_way(self, job: Job) -> bool:
        """Queued, or started on a worker that is still beating."""
        status = job.get_status(refresh=False)
        if status in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED):
            return True
        if status != JobStatus.STARTED:
            return False
        ttl = self.workers.heartbeat_ttl_seconds  # a job beats from its first moment; allow that moment
        just_started = job.started_at is not None and time.time() - job.started_at.timestamp() < ttl
        return just_started or bool(self.redis.exists(PREPARE_BEAT_KEY.format(job.id)))


def workers_environments(settings: WorkerSettings) -> SkillEnvironments:
    """The queue workers' environment store, found as their local runtime finds it: ``SKILLRUN_ENVS_DIR``, or the
    work root's ``.skillrun/environments`` (so the API must share that volume and those settings), their Debian
    packages in root filesystems as a queue worker's sandbox has them."""
    work_root = settings.work_root or default_work_root()
    return local_environments(work_root / REGISTRY_DIR / "environments", sandboxed=False, systems=True)


def _recorded(target: Target | None) -> Target:
    if target is None:
        raise DependencyError("no Docker worker has recorded the sandbox image it builds for yet")
    return target
