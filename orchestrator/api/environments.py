"""Skills' dependency environments as the API shows them, and who builds a newly registered library version's.

Environments are the local runtime's (``worker.environments``): what a skill's state is (ready, failed, not built...)
is read from the environment store; what a preparation under way adds (the skills still to do and the step each is
at) comes from whoever builds:

* ``InlineEnvironments`` — the embedded default: this process runs the local runtime, so it builds, in one background
  task per library version (cancelled when the app shuts down), with the runtime's own builder;
* ``QueuedEnvironments`` — queue mode: builds are sandboxed and need a worker's root, so one RQ job per library
  version (its id is the version's, so it is never queued twice) goes to the local runtime's workers
  (``worker.jobs.prepare_environments``); the job's ``meta`` is its progress, and the store the API reads is the
  workers' (``SKILLRUN_ENVS_DIR``, or the shared work root's ``.skillrun/environments``).

Every method that reads files or Redis is blocking: routes call them in a thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import redis
from rq import Queue
from rq.exceptions import DuplicateJobError, NoSuchJobError
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from orchestrator.api.schemas import EnvironmentPublic, SkillEnvironmentPublic
from orchestrator.dispatch import BaseDispatcher, QueueDispatcher
from orchestrator.errors import SkillError
from orchestrator.skills.repository import FsSkillRepository
from worker.config import get_worker_settings
from worker.consumer import environments_queue_name
from worker.contract import RuntimeName, SkillRef
from worker.environments import MANIFEST_FILE, EnvironmentStatus, SkillEnvironments, local_environments, read_manifest
from worker.errors import DependencyError, WorkerError
from worker.jobs import PREPARE_BEAT_KEY, WAITING, prepare_environments
from worker.staging import resolve_skill_paths
from worker.workspace import REGISTRY_DIR, default_work_root

logger = logging.getLogger(__name__)

SETTLED = ("ready", "none", "invalid")
"""States a preparation cannot change: built, nothing to build, or a declaration to fix first."""
TO_BUILD = ("not built", "failed")
"""States a registration prepares (a failed build is tried again)."""
WAITING_FOR_WORKER = "waiting for a worker"
JOB_RECORD_SECONDS = 24 * 3600
"""How long a finished preparation job's progress is kept (what it could not do is reported meanwhile)."""
STEPS_PER_SKILL = 3
"""Build steps of one environment, each within SKILLRUN_ENV_BUILD_TIMEOUT: resolve, make, install."""


@dataclass
class Progress:
    """What a library version's preparation adds to the store's states."""

    pending: dict[str, str] = field(default_factory=dict)
    """Skills not prepared yet, each with its latest step."""
    errors: dict[str, str] = field(default_factory=dict)
    """Skills it could not prepare at all, with why (a failed build is recorded in the store itself)."""


@dataclass(frozen=True)
class LibrarySkill:
    name: str
    path: str
    """The skill's folder relative to the library root."""
    folder: Path


@dataclass
class EnvironmentsReport:
    skills: list[SkillEnvironmentPublic]
    problems: list[str]


class LibraryEnvironments(ABC):
    """States of skills' environments, and the preparation of a library version's (see the module's description)."""

    @property
    @abstractmethod
    def environments(self) -> SkillEnvironments:
        """The local runtime's environments (their store, declarations and target)."""

    @abstractmethod
    def progress(self, root: Path) -> Progress:
        """What the preparation of the library version at ``root`` says, if there is one."""

    @abstractmethod
    async def begin(self, root: Path, skills: list[LibrarySkill]) -> str | None:
        """Start preparing ``skills`` of the version at ``root`` unless that is under way; a problem to report when
        it cannot be started."""

    async def close(self) -> None:
        """Stop what this process runs."""

    def skill_status(self, ref: SkillRef) -> EnvironmentPublic:
        """The environment of the skill ``ref`` (no build)."""
        try:
            root, folder = resolve_skill_paths(ref)
        except WorkerError as exc:
            return _public(EnvironmentStatus("failed", message=f"the skill's folder cannot be read: {exc}"))
        return self._status(root, folder, ref.name, self.progress(root))

    def report(self, root: Path) -> EnvironmentsReport:
        """Each skill's environment in the library version at ``root``, and what is wrong with its manifest."""
        root = root.resolve()
        skills, problems = _library_skills(root)
        progress = self.progress(root)
        return EnvironmentsReport(
            [SkillEnvironmentPublic(skill=s.name, **self._status(root, s.folder, s.name, progress).model_dump())
             for s in skills],
            problems,
        )

    async def prepare(self, root: Path) -> EnvironmentsReport:
        """Start preparing the environments the version at ``root`` lacks (the states ``TO_BUILD``); its report."""
        root = root.resolve()
        before = await asyncio.to_thread(self.report, root)
        names = {s.skill for s in before.skills if s.state in TO_BUILD}
        if not names:
            return before
        skills, _ = await asyncio.to_thread(_library_skills, root)
        problem = await self.begin(root, [s for s in skills if s.name in names])
        report = await asyncio.to_thread(self.report, root)
        report.problems += [problem] if problem else []
        return report

    def _status(self, root: Path, folder: Path, name: str, progress: Progress) -> EnvironmentPublic:
        # The preparation first, then the store: a build that ends in between is then seen ready, never "not built".
        step, error = progress.pending.get(name), progress.errors.get(name)
        try:
            status = self.environments.status(folder, root, name)
        except (DependencyError, OSError) as exc:  # no python3 for the target, an unreadable store
            status = EnvironmentStatus("failed", message=f"the environment cannot be looked at: {exc}")
        if status.state not in SETTLED and step is not None:
            return _public(status, state="building", message=step)
        if status.state == "not built" and error is not None:
            return _public(status, state="failed", message=error)
        return _public(status)


class InlineEnvironments(LibraryEnvironments):
    """The embedded default: this process builds, in a background task per library version."""

    def __init__(self, environments: Callable[[], SkillEnvironments]) -> None:
        """``environments``: the local runtime's, asked for on first use."""
        self._environments = environments
        self._progress: dict[Path, Progress] = {}
        self._tasks: dict[Path, asyncio.Task] = {}

    @cached_property
    def environments(self) -> SkillEnvironments:
        return self._environments()

    def progress(self, root: Path) -> Progress:
        return self._progress.get(root, Progress())

    async def begin(self, root: Path, skills: list[LibrarySkill]) -> str | None:
        if root in self._tasks:
            return None
        progress = self._progress[root] = Progress(pending={s.name: WAITING for s in skills})
        task = asyncio.create_task(self._prepare(root, skills, progress), name=f"prepare {root.name}")
        self._tasks[root] = task
        task.add_done_callback(lambda _: self._tasks.pop(root, None))
        return None

    async def _prepare(self, root: Path, skills: list[LibrarySkill], progress: Progress) -> None:
        for skill in skills:

            def step(message: str, name: str = skill.name) -> None:
                progress.pending[name] = message

            try:
                await self.environments.prepare(skill.folder, root, skill.name, step)
            except Exception as exc:  # the builder could not even start (sandbox, disk): the skill's report says
                # why and the others still get built; a background task has no caller to raise to
                logger.warning("preparing the environment of %s failed", skill.name, exc_info=True)
                progress.errors[skill.name] = f"the environment could not be prepared: {type(exc).__name__}: {exc}"
            finally:
                progress.pending.pop(skill.name, None)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class QueuedEnvironments(LibraryEnvironments):
    """Queue mode: a worker of the local runtime builds; one RQ job per library version."""

    def __init__(self, connection: redis.Redis, environments: Callable[[], SkillEnvironments]) -> None:
        """``environments``: the workers' store as this process sees it (it never builds), asked for on first use."""
        self.redis = connection
        self._environments = environments
        self.queue = Queue(environments_queue_name(RuntimeName.LOCAL.value), connection=connection,
                           serializer=JSONSerializer)

    @cached_property
    def environments(self) -> SkillEnvironments:
        return self._environments()

    @staticmethod
    def job_id(root: Path) -> str:
        return f"prepare-{hashlib.sha256(str(root).encode()).hexdigest()[:32]}"

    def progress(self, root: Path) -> Progress:
        job = self._job(root)
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

    async def begin(self, root: Path, skills: list[LibrarySkill]) -> str | None:
        try:
            await asyncio.to_thread(self._enqueue, root, skills)
        except redis.RedisError as exc:
            return f"the environments could not be queued for a worker ({exc}); register the version again to retry"
        return None

    def _enqueue(self, root: Path, skills: list[LibrarySkill]) -> None:
        timeout = len(skills) * STEPS_PER_SKILL * get_worker_settings().env_build_timeout_seconds + 60
        for _ in range(2):  # a finished job of the same version is removed once, then replaced
            try:
                self.queue.enqueue_call(
                    prepare_environments, args=(str(root), [[s.name, s.path] for s in skills]),
                    job_id=self.job_id(root), timeout=int(timeout), result_ttl=JOB_RECORD_SECONDS,
                    failure_ttl=JOB_RECORD_SECONDS, meta={"pending": {s.name: WAITING_FOR_WORKER for s in skills},
                                                          "errors": {}},
                    unique=True,
                )
                return
            except DuplicateJobError:
                job = self._job(root)
                if job is not None and self._under_way(job):
                    return
                if job is not None:
                    job.delete()

    def _job(self, root: Path) -> Job | None:
        try:
            return Job.fetch(self.job_id(root), connection=self.redis, serializer=JSONSerializer)
        except NoSuchJobError:
            return None

    def _under_way(self, job: Job) -> bool:
        """Queued, or started on a worker that is still beating."""
        status = job.get_status(refresh=False)
        if status in (JobStatus.QUEUED, JobStatus.DEFERRED, JobStatus.SCHEDULED):
            return True
        if status != JobStatus.STARTED:
            return False
        ttl = get_worker_settings().heartbeat_ttl_seconds  # a job beats from its first moment; allow that moment
        just_started = job.started_at is not None and time.time() - job.started_at.timestamp() < ttl
        return just_started or bool(self.redis.exists(PREPARE_BEAT_KEY.format(job.id)))


def environments_for(dispatcher: BaseDispatcher) -> LibraryEnvironments:
    """Who builds for this API: the queue's workers, or this process's local runtime."""
    if isinstance(dispatcher, QueueDispatcher):
        return QueuedEnvironments(dispatcher.redis, workers_environments)
    return InlineEnvironments(lambda: dispatcher.runtime(RuntimeName.LOCAL.value).environments)


def workers_environments() -> SkillEnvironments:
    """The queue workers' environment store, found as their local runtime finds it: ``SKILLRUN_ENVS_DIR``, or the
    work root's ``.skillrun/environments`` (so the API must share that volume and those settings)."""
    settings = get_worker_settings()
    work_root = settings.work_root or default_work_root()
    return local_environments(work_root / REGISTRY_DIR / "environments", sandboxed=False)


def not_ready(name: str, environment: EnvironmentPublic) -> str:
    """Why a run that will not wait for its environment cannot start, and what to do."""
    waiting = "or submit the run with wait_for_environment=true to have it built first"
    message = environment.message.removeprefix(f"skill {name!r}: ")
    if environment.state == "invalid":
        return f"skill {name!r}: its dependency declaration is wrong: {message}; fix it and register the library again"
    if environment.state == "failed":
        return (f"skill {name!r}: building its dependency environment failed: {message}\n"
                f"Fix the requirements and register the library again, {waiting}")
    if environment.state == "building":
        return (f"skill {name!r}: its dependency environment is being built ({environment.message}); submit again "
                f"once GET /v1/skills/{name} says ready, {waiting}")
    return (f"skill {name!r}: its dependency environment ({', '.join(environment.python)}) is not built yet; it is "
            f"built when its library is registered (POST /v1/libraries), {waiting}")


def _library_skills(root: Path) -> tuple[list[LibrarySkill], list[str]]:
    """The skills of the library version at ``root``, and what is wrong with its manifest."""
    try:
        repository = FsSkillRepository(root)
        skills = []
        for summary in repository.summaries():
            path = repository.skill_ref(summary.name).path
            skills.append(LibrarySkill(summary.name, path, root / path))
    except SkillError as exc:
        return [], [f"the library's skills cannot be read: {exc}"]
    try:
        manifest = read_manifest(root)
    except DependencyError as exc:
        return skills, [str(exc)]
    ghosts = manifest.unknown_skills({s.name for s in skills}) if manifest is not None else []
    problems = [f"{MANIFEST_FILE} names skills that do not exist: {', '.join(ghosts)}"] if ghosts else []
    return skills, problems


def _public(status: EnvironmentStatus, **changes: str) -> EnvironmentPublic:
    return EnvironmentPublic(**{**status.as_json(), **changes})


__all__ = ["EnvironmentsReport", "InlineEnvironments", "LibraryEnvironments", "QueuedEnvironments",
           "environments_for", "not_ready"]
