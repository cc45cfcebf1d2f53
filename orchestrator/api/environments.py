"""Skills' dependency environments as the API shows them, and who builds a newly registered library version's.

Environments are per runtime: a registration prepares them for the runtimes the deployment runs skills on
(``SKILLRUN_PREPARE_RUNTIMES``, default ``local``; ``docker`` adds the Docker runtime's environment and the derived
image of a skill's Debian packages). A setting, not the workers that happen to be registered: which workers are up
changes from minute to minute (a Docker worker started after a registration would find nothing prepared, one that
stopped would leave a job no one takes), while the runtimes a deployment serves are the operator's choice. What a
skill's state is (ready, failed, not built...) is read from the environment store; what a preparation under way adds
(the skills still to do and the step each is at) comes from whoever builds:

* ``InlineEnvironments`` — the embedded default: this process runs the runtimes, so it builds, in one background
  task per runtime and library version (cancelled when the app shuts down), through the runtime itself
  (``prepare_environment``), and asks the runtime for states (the Docker one asks its engine);
* ``QueuedEnvironments`` — queue mode: builds are sandboxed and need a worker's root (and, for Docker, its engine),
  so one RQ job per runtime and library version (its id is theirs, so it is never queued twice) goes to that
  runtime's workers (``worker.jobs.prepare_environments`` on ``skillrun:<runtime>:environments``); the job's
  ``meta`` is its progress, and the store the API reads is the workers' (``SKILLRUN_ENVS_DIR``, or the shared work
  root's ``.skillrun/environments``). The API has no engine: the Docker runtime's states are read from what its
  workers record there — the target they last built for (the sandbox image's id and ``python3``) and the derived
  images they built or failed to build; before any Docker worker has built, a skill's Docker state is ``not built``.

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
from orchestrator.config import get_settings
from orchestrator.dispatch import BaseDispatcher, QueueDispatcher
from orchestrator.errors import SkillError
from orchestrator.skills.repository import FsSkillRepository
from worker.config import get_worker_settings
from worker.consumer import environments_queue_name
from worker.contract import RuntimeName, SkillRef
from worker.environments import (
    MANIFEST_FILE,
    EnvironmentBuilder,
    EnvironmentStatus,
    SkillEnvironments,
    Target,
    build_settings,
    local_environments,
    read_manifest,
)
from worker.environments.images import bundle_digest, image_status, image_tag
from worker.errors import DependencyError, WorkerError
from worker.jobs import PREPARE_BEAT_KEY, WAITING, prepare_environments
from worker.root_cache import cached_sha256
from worker.runtimes.host import HostWorkspaceRuntime
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
STEPS_PER_SKILL = 4
"""Build steps of one skill, each within SKILLRUN_ENV_BUILD_TIMEOUT: resolve, make, install (and, on Docker, the
derived image)."""


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

    def __init__(self, runtimes: list[str]) -> None:
        """``runtimes``: those a registration prepares for (``SKILLRUN_PREPARE_RUNTIMES``), in the order reported."""
        self.runtimes = runtimes

    @abstractmethod
    def status(self, runtime: str, root: Path, folder: Path, name: str) -> EnvironmentStatus:
        """Where the skill's environment on ``runtime`` stands (no build)."""

    @abstractmethod
    def progress(self, runtime: str, root: Path) -> Progress:
        """What the preparation of the library version at ``root`` for ``runtime`` says, if there is one."""

    @abstractmethod
    async def begin(self, runtime: str, root: Path, skills: list[LibrarySkill]) -> str | None:
        """Start preparing ``skills`` of the version at ``root`` for ``runtime`` unless that is under way; a
        problem to report when it cannot be started."""

    async def close(self) -> None:
        """Stop what this process runs."""

    def skill_status(self, ref: SkillRef, runtime: str = RuntimeName.LOCAL.value) -> EnvironmentPublic:
        """The environment of the skill ``ref`` on ``runtime`` (no build)."""
        try:
            root, folder = resolve_skill_paths(ref)
        except WorkerError as exc:
            return _public(EnvironmentStatus("failed", message=f"the skill's folder cannot be read: {exc}"), runtime)
        return self._status(runtime, root, folder, ref.name, self.progress(runtime, root))

    def skill_statuses(self, ref: SkillRef) -> list[EnvironmentPublic]:
        """The environment of the skill ``ref`` on each runtime registrations prepare for."""
        return [self.skill_status(ref, runtime) for runtime in self.runtimes]

    def report(self, root: Path) -> EnvironmentsReport:
        """Each skill's environment on each runtime in the library version at ``root``, and what is wrong with its
        manifest."""
        root = root.resolve()
        skills, problems = _library_skills(root)
        entries = []
        for runtime in self.runtimes:
            progress = self.progress(runtime, root)
            entries += [SkillEnvironmentPublic(skill=s.name, **self._status(runtime, root, s.folder, s.name,
                                                                            progress).model_dump())
                        for s in skills]
        return EnvironmentsReport(entries, problems)

    async def prepare(self, root: Path) -> EnvironmentsReport:
        """Start preparing the environments the version at ``root`` lacks (the states ``TO_BUILD``) on each
        runtime; its report."""
        root = root.resolve()
        before = await asyncio.to_thread(self.report, root)
        if not any(s.state in TO_BUILD for s in before.skills):
            return before
        skills, _ = await asyncio.to_thread(_library_skills, root)
        problems = []
        for runtime in self.runtimes:
            names = {s.skill for s in before.skills if s.runtime == runtime and s.state in TO_BUILD}
            if names:
                problems.append(await self.begin(runtime, root, [s for s in skills if s.name in names]))
        report = await asyncio.to_thread(self.report, root)
        report.problems += [problem for problem in problems if problem]
        return report

    def _status(self, runtime: str, root: Path, folder: Path, name: str, progress: Progress) -> EnvironmentPublic:
        # The preparation first, then the store: a build that ends in between is then seen ready, never "not built".
        step, error = progress.pending.get(name), progress.errors.get(name)
        try:
            status = self.status(runtime, root, folder, name)
        except (WorkerError, OSError) as exc:  # no python3 for the target, no engine, an unreadable store
            status = EnvironmentStatus("failed", message=f"the environment cannot be looked at: {exc}")
        if status.state not in SETTLED and step is not None:
            return _public(status, runtime, state="building", message=step)
        if status.state == "not built" and error is not None:
            return _public(status, runtime, state="failed", message=error)
        return _public(status, runtime)


class InlineEnvironments(LibraryEnvironments):
    """The embedded default: this process builds, in a background task per runtime and library version."""

    def __init__(self, runtime: Callable[[str], HostWorkspaceRuntime], runtimes: list[str]) -> None:
        """``runtime``: this process's runtime of a kind (the dispatcher's), asked for on first use."""
        super().__init__(runtimes)
        self._runtime = runtime
        self._progress: dict[tuple[str, Path], Progress] = {}
        self._tasks: dict[tuple[str, Path], asyncio.Task] = {}

    def status(self, runtime: str, root: Path, folder: Path, name: str) -> EnvironmentStatus:
        return self._runtime(runtime).environment_status(folder, root, name)

    def progress(self, runtime: str, root: Path) -> Progress:
        return self._progress.get((runtime, root), Progress())

    async def begin(self, runtime: str, root: Path, skills: list[LibrarySkill]) -> str | None:
        if (runtime, root) in self._tasks:
            return None
        progress = self._progress[(runtime, root)] = Progress(pending={s.name: WAITING for s in skills})
        task = asyncio.create_task(self._prepare(runtime, root, skills, progress), name=f"prepare {root.name}")
        self._tasks[(runtime, root)] = task
        task.add_done_callback(lambda _: self._tasks.pop((runtime, root), None))
        return None

    async def _prepare(self, runtime: str, root: Path, skills: list[LibrarySkill], progress: Progress) -> None:
        for skill in skills:

            def step(message: str, name: str = skill.name) -> None:
                progress.pending[name] = message

            try:
                await self._runtime(runtime).prepare_environment(skill.folder, root, skill.name, step)
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
    """Queue mode: a worker of each runtime builds; one RQ job per runtime and library version."""

    def __init__(self, connection: redis.Redis, runtimes: list[str]) -> None:
        super().__init__(runtimes)
        self.redis = connection
        self.queues = {name: Queue(environments_queue_name(name), connection=connection, serializer=JSONSerializer)
                       for name in (RuntimeName.LOCAL.value, RuntimeName.DOCKER.value)}

    @cached_property
    def local(self) -> SkillEnvironments:
        """The local runtime's environments in the workers' store (this process never builds)."""
        return workers_environments()

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
        tag = image_tag(target.image, declaration.debian, bundle_digest(get_worker_settings().env_ca_bundle))
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

    async def begin(self, runtime: str, root: Path, skills: list[LibrarySkill]) -> str | None:
        try:
            await asyncio.to_thread(self._enqueue, runtime, root, skills)
        except redis.RedisError as exc:
            return (f"the {runtime} runtime's environments could not be queued for a worker ({exc}); register the "
                    "version again to retry")
        return None

    def _enqueue(self, runtime: str, root: Path, skills: list[LibrarySkill]) -> None:
        timeout = len(skills) * STEPS_PER_SKILL * get_worker_settings().env_build_timeout_seconds + 60
        for _ in range(2):  # a finished job of the same version is removed once, then replaced
            try:
                self.queues[runtime].enqueue_call(
                    prepare_environments,
                    args=(str(root), [[s.name, s.path] for s in skills], runtime, cached_sha256(root)),
                    job_id=self.job_id(runtime, root), timeout=int(timeout), result_ttl=JOB_RECORD_SECONDS,
                    failure_ttl=JOB_RECORD_SECONDS, meta={"pending": {s.name: WAITING_FOR_WORKER for s in skills},
                                                          "errors": {}},
                    unique=True,
                )
                return
            except DuplicateJobError:
                job = self._job(runtime, root)
                if job is not None and self._under_way(job):
                    return
                if job is not None:
                    job.delete()

    def _job(self, runtime: str, root: Path) -> Job | None:
        try:
            return Job.fetch(self.job_id(runtime, root), connection=self.redis, serializer=JSONSerializer)
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


def environments_for(dispatcher: BaseDispatcher, runtimes: list[str] | None = None) -> LibraryEnvironments:
    """Who builds for this API, for ``runtimes`` (default ``SKILLRUN_PREPARE_RUNTIMES``): the queue's workers, or
    this process's runtimes."""
    runtimes = runtimes or get_settings().runtimes_to_prepare()
    if isinstance(dispatcher, QueueDispatcher):
        return QueuedEnvironments(dispatcher.redis, runtimes)
    return InlineEnvironments(dispatcher.runtime, runtimes)


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


def _recorded(target: Target | None) -> Target:
    if target is None:
        raise DependencyError("no Docker worker has recorded the sandbox image it builds for yet")
    return target


def _public(status: EnvironmentStatus, runtime: str, **changes: str) -> EnvironmentPublic:
    return EnvironmentPublic(**{**status.as_json(), "runtime": runtime, **changes})


__all__ = ["EnvironmentsReport", "InlineEnvironments", "LibraryEnvironments", "QueuedEnvironments",
           "environments_for", "not_ready"]
