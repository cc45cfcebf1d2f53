"""``InlineEnvironments`` — the embedded default: this process runs the runtimes, so it builds, in one background task
per runtime and library version (cancelled when the app shuts down), through the runtime itself
(``prepare_environment``), and asks the runtime for states (the Docker one asks its engine). A team's builds are its
tasks still running: counted and started on the event loop with nothing awaited between.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from orchestrator.builds.base import LibraryEnvironments, LibrarySkill, Plan, Progress, QuotaOf
from orchestrator.quotas import builds_refusal
from worker.environments import EnvironmentStatus
from worker.jobs import WAITING
from worker.runtimes import HostWorkspaceRuntime

logger = logging.getLogger(__name__)


class InlineEnvironments(LibraryEnvironments):
    """The embedded default: this process builds, in a background task per runtime and library version."""

    def __init__(self, runtime: Callable[[str], HostWorkspaceRuntime], runtimes: list[str],
                 quota_of: QuotaOf | None = None) -> None:
        """``runtime``: this process's runtime of a kind (the dispatcher's), asked for on first use."""
        super().__init__(runtimes, quota_of)
        self._runtime = runtime
        self._progress: dict[tuple[str, Path], Progress] = {}
        self._tasks: dict[tuple[str, Path], asyncio.Task] = {}
        self._owners: dict[tuple[str, Path], str] = {}
        """The team each task builds for (as long as it runs)."""

    def status(self, runtime: str, root: Path, folder: Path, name: str) -> EnvironmentStatus:
        return self._runtime(runtime).environment_status(folder, root, name)

    def progress(self, runtime: str, root: Path) -> Progress:
        return self._progress.get((runtime, root), Progress())

    async def begin(self, root: Path, plan: Plan, team: str, limit: int) -> list[str]:
        starting = {runtime: skills for runtime, skills in plan.items() if (runtime, root) not in self._tasks}
        held = self.builds(team)
        if limit and starting and held + len(starting) > limit:  # counted and started with nothing awaited between
            raise builds_refusal(team, limit, held, len(starting))
        for runtime, skills in starting.items():
            key = (runtime, root)
            progress = self._progress[key] = Progress(pending={s.name: WAITING for s in skills})
            task = asyncio.create_task(self._prepare(runtime, root, skills, progress), name=f"prepare {root.name}")
            self._tasks[key], self._owners[key] = task, team
            task.add_done_callback(lambda _, key=key: self._ended(key))  # finished, failed or cancelled
        return []

    def _ended(self, key: tuple[str, Path]) -> None:
        self._tasks.pop(key, None)
        self._owners.pop(key, None)

    def builds(self, team: str) -> int:
        """The team's builds going: a task whose last skill is done holds no place, though its task has still to
        end (its skills already read as built)."""
        return sum(1 for key, owner in self._owners.items() if owner == team and self.progress(*key).pending)

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
