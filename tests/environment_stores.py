"""Environment stores for tests: ``SkillEnvironments`` made on one store and closed after the test, and what the
store holds (environments built, build folders left)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from worker.environments import BuildSettings, EnvironmentBuilder, EnvironmentStore, SkillEnvironments, local_target


@contextlib.contextmanager
def environments_maker(store_root: Path, **defaults: object) -> Iterator[Callable[..., SkillEnvironments]]:
    """A maker of local ``SkillEnvironments`` on the store at ``store_root``, built with ``BuildSettings`` of
    ``defaults`` and the maker's own arguments (``systems``: with root filesystems for Debian packages); every one
    made is closed when the block ends."""
    made: list[SkillEnvironments] = []

    def make(*, systems: bool = False, **settings: object) -> SkillEnvironments:
        builder = EnvironmentBuilder(EnvironmentStore(store_root), BuildSettings(**{**defaults, **settings}))
        envs = SkillEnvironments(builder, local_target, systems=systems)
        made.append(envs)
        return envs

    try:
        yield make
    finally:
        for envs in made:
            envs.close()


def built(store_root: Path) -> list[str]:
    """The keys of the environments in the store."""
    envs = store_root / "envs"
    return sorted(p.name for p in envs.iterdir() if p.is_dir()) if envs.is_dir() else []


def left_building(store_root: Path) -> list[str]:
    """The build folders left in the store."""
    folder = store_root / ".building"
    return sorted(os.listdir(folder)) if folder.is_dir() else []
