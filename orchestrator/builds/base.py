"""Skills' dependency environments as the API shows them, and the preparation of a newly registered library
version's: ``LibraryEnvironments``, which ``inline`` and ``queued`` implement by who builds.

Environments are per runtime: a registration prepares them for the runtimes the deployment runs skills on
(``SKILLRUN_PREPARE_RUNTIMES``, default ``local``; ``docker`` adds the Docker runtime's environment and the derived
image of a skill's Debian packages). A setting, not the workers that happen to be registered: which workers are up
changes from minute to minute (a Docker worker started after a registration would find nothing prepared, one that
stopped would leave a job no one takes), while the runtimes a deployment serves are the operator's choice. What a
skill's state is (ready, failed, not built...) is read from the environment store; what a preparation under way adds
(the skills still to do and the step each is at) comes from whoever builds.

Each build (one per runtime and library version) is a team's, the one whose registration started it, and is held
to its quota's ``max_builds`` (``orchestrator.quotas``): the count and the start are one step, so a team at its quota
starts nothing, and a build frees its place when it ends, however it ends.

Every method that reads files or Redis is blocking: routes call them in a thread.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import SkillError
from orchestrator.quotas import TeamQuota
from orchestrator.schemas import EnvironmentPublic, SkillEnvironmentPublic
from orchestrator.skills.repository import FsSkillRepository
from worker.contract import RuntimeName, SkillRef
from worker.environments import MANIFEST_FILE, EnvironmentStatus, read_manifest
from worker.errors import DependencyError, WorkerError
from worker.workspaces import resolve_skill_paths

SETTLED = ("ready", "none", "invalid")
"""States a preparation cannot change: built, nothing to build, or a declaration to fix first."""
TO_BUILD = ("not built", "failed")
"""States a registration prepares (a failed build is tried again)."""

QuotaOf = Callable[[str], Awaitable[TeamQuota | None]]
"""The quota that holds for a team (``None``: no quotas), as ``BaseDispatcher.team_quota`` reads it."""
Plan = dict[str, list["LibrarySkill"]]
"""What a preparation builds: the skills to build on each runtime."""


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

    def __init__(self, runtimes: list[str], quota_of: QuotaOf | None = None) -> None:
        """``runtimes``: those a registration prepares for (``SKILLRUN_PREPARE_RUNTIMES``), in the order reported;
        ``quota_of``: the teams' quotas their builds are held to (``None``: builds are not limited)."""
        self.runtimes = runtimes
        self.quota_of = quota_of

    @abstractmethod
    def status(self, runtime: str, root: Path, folder: Path, name: str) -> EnvironmentStatus:
        """Where the skill's environment on ``runtime`` stands (no build)."""

    @abstractmethod
    def progress(self, runtime: str, root: Path) -> Progress:
        """What the preparation of the library version at ``root`` for ``runtime`` says, if there is one."""

    @abstractmethod
    async def begin(self, root: Path, plan: Plan, team: str, limit: int) -> list[str]:
        """Start preparing the version at ``root`` as ``plan`` says, on each runtime where that is not under way, as
        builds of ``team``: with a ``limit`` (its ``max_builds``), only if all of them fit beside the team's builds
        under way (``QuotaExceededError``, none started). The problems to report (a runtime that could not be
        started)."""

    @abstractmethod
    def builds(self, team: str) -> int:
        """How many builds of ``team`` are queued or under way."""

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

    async def prepare(self, root: Path, team: str) -> EnvironmentsReport:
        """Start preparing the environments the version at ``root`` lacks (the states ``TO_BUILD``) on each
        runtime, as builds of ``team`` held to its quota (``QuotaExceededError``: none started); its report."""
        root = root.resolve()
        before = await asyncio.to_thread(self.report, root)
        if not any(s.state in TO_BUILD for s in before.skills):
            return before
        skills, _ = await asyncio.to_thread(_library_skills, root)
        plan: Plan = {}
        for runtime in self.runtimes:
            names = {s.skill for s in before.skills if s.runtime == runtime and s.state in TO_BUILD}
            if names:
                plan[runtime] = [s for s in skills if s.name in names]
        quota = await self.quota_of(team) if self.quota_of is not None else None
        problems = await self.begin(root, plan, team, (quota.max_builds or 0) if quota is not None else 0)
        report = await asyncio.to_thread(self.report, root)
        report.problems += problems
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


def _public(status: EnvironmentStatus, runtime: str, **changes: str) -> EnvironmentPublic:
    return EnvironmentPublic(**{**status.as_json(), "runtime": runtime, **changes})
